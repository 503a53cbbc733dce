"""The optimization stage (serve/optimize.py, `xlaport optimize`): proposals without a command, refusal below
L2, and (slow) real runs of tests/programs/optimize/train.py migrated to XLA, judged by check and verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.serve.optimize import (
    Baseline,
    Candidate,
    Evidence,
    Session,
    StepCost,
    StepTiming,
    compare,
    is_counted,
    optimize,
)
from xlaport.serve.pipeline import Pipeline
from xlaport.serve.results import MigrateOptions

from xlaport.cli import app

PROGRAM = Path(__file__).resolve().parent / "programs" / "optimize"


@pytest.fixture
def migrated(tmp_path) -> tuple[Path, Path]:
    original = tmp_path / "original"
    shutil.copytree(PROGRAM, original)
    Pipeline().migrate(original, tmp_path / "migrated", MigrateOptions(k=0))
    return original, tmp_path / "migrated"


def test_without_a_command_every_candidate_is_proposed_with_its_diff(migrated) -> None:
    original, tree = migrated
    before = (tree / "train.py").read_text()
    report = optimize(tree)
    assert report.status == "proposed" and report.baseline is None
    by_family = {v.candidate["family"]: v for v in report.candidates}
    assert set(by_family) == {"logging_reads", "bf16_no_scaler", "fixed_generation"}
    assert all(v.status == "proposed" for v in by_family.values())
    assert "xm.add_step_closure" in by_family["logging_reads"].candidate["diff"]
    assert "index_copy" in by_family["fixed_generation"].candidate["diff"]
    assert (
        "XLA502" in by_family["bf16_no_scaler"].candidate["finding"]
        or "GradScaler" in by_family["bf16_no_scaler"].candidate["finding"]
    )
    assert (tree / "train.py").read_text() == before  # nothing changes without evidence
    written = json.loads((tree / "xlaport-optimize.json").read_text())
    assert written["status"] == "proposed" and len(written["candidates"]) == 3


def test_the_cli_proposes_and_says_so(migrated) -> None:
    _, tree = migrated
    result = CliRunner().invoke(app, ["optimize", str(tree), "--dry-run", "--family", "logging_reads"])
    assert result.exit_code == 0, result.output
    assert "proposed: logging_reads@train.py" in result.output and "bf16" not in result.output
    assert not (tree / "xlaport-optimize.json").exists()


def cost(**changes) -> StepCost:
    base = dict(level="L2", steps=12, step_ms=10.0, host_reads_per_step=1.0, host_wait_ms_per_step=2.0, compiles=2,
                compiles_after_warmup=0, step_ms_spread=1.0)  # fmt: skip
    return StepCost(**{**base, **changes})


def test_counted_reads_and_compiles_save_by_themselves_and_one_runs_step_time_only_when_clear() -> None:
    better, worse, measured = compare(cost(), cost(host_reads_per_step=0.0))
    assert better == ["host reads per step 1 -> 0"] and not worse
    assert measured == ["step time 10.0 -> 10.0 ms (+0%), within one run's noise"]
    better, worse, measured = compare(cost(), cost(host_reads_per_step=0.0, step_ms=30.0))
    assert worse and "step time" in worse[0] and not is_counted(worse[0]) and is_counted(better[0])
    # a slower step inside the runs' own spread is noise, not a regression
    better, worse, measured = compare(cost(step_ms_spread=15.0), cost(host_reads_per_step=0.0, step_ms=30.0))
    assert not worse
    better, worse, _ = compare(cost(compiles=14, compiles_after_warmup=12), cost(compiles=3, compiles_after_warmup=0))
    assert len(better) == 2
    # more reads are a cost
    _, worse, _ = compare(cost(), cost(host_reads_per_step=2.0))
    assert worse == ["host reads per step 1 -> 2"]


def test_a_step_time_verdict_needs_every_candidate_run_beyond_every_baseline_run() -> None:
    separated = StepTiming(before_ms=[100.0, 104.0, 98.0], after_ms=[90.0, 91.0, 93.0])
    assert separated.faster and not separated.slower and separated.p_value == pytest.approx(0.05)
    assert "p = 0.05" in separated.line()
    # one slow candidate run (the machine got busy) and the claim is withdrawn
    overlapping = StepTiming(before_ms=[100.0, 104.0, 98.0], after_ms=[90.0, 99.0, 93.0])
    assert not overlapping.faster and not overlapping.slower and "overlap" in overlapping.line()
    # separated but by less than MIN_GAIN: not a saving worth a rewrite
    marginal = StepTiming(before_ms=[100.0, 101.0, 102.0], after_ms=[99.0, 99.5, 98.5])
    assert not marginal.faster and "by less than" in marginal.line()
    slower = StepTiming(before_ms=[100.0, 101.0, 102.0], after_ms=[130.0, 125.0, 140.0])
    assert slower.slower and not slower.faster and "every candidate run slower" in slower.line()
    # two runs each can never be enough (p = 1/6)
    assert not StepTiming(before_ms=[100.0, 100.0], after_ms=[50.0, 50.0]).faster
    assert not StepTiming(before_ms=[50.0, 50.0], after_ms=[100.0, 100.0]).slower
    assert "not measured" in StepTiming([], []).line()


class ScriptedSession(Session):
    """A session whose runs return the step costs a test lists, in order (the decision, not the program, is
    under test here; the slow tests below run real programs)."""

    def __init__(self, tree: Path, costs: list[StepCost], verify: dict) -> None:
        super().__init__(tree, "python train.py", "python train.py", tree, scratch=tree / "scratch")
        self.costs, self.verify = list(costs), verify

    def run(self, texts: dict[str, str], with_verify: bool = True) -> Evidence:
        self.runs += 1
        return Evidence(cost=self.costs.pop(0), verify=dict(self.verify) if with_verify else None)


PASS_L3 = {"level": "L3", "status": "pass", "loss": "inside the band"}


@pytest.mark.parametrize(
    ("after", "timing", "status", "words"),
    [
        # fewer reads, one run's step no slower: kept on the count, no timing runs
        (cost(host_reads_per_step=0.0, step_ms=11.0), [], "kept", "counted: host reads per step 1 -> 0; timed: step time"),
        # one run says much slower, the interleaved runs overlap: not a clear slowdown, kept
        (cost(host_reads_per_step=0.0, step_ms=30.0), [9.0, 10.0, 12.0, 11.0], "kept", "overlap"),
        # ... and every candidate run slower: rejected on the timed step
        (cost(host_reads_per_step=0.0, step_ms=30.0), [10.0, 31.0, 10.0, 29.0], "rejected", "clearly slower: timed"),
        # equal counts: the step time decides alone, and must be faster in every run
        (cost(step_ms=5.0), [10.0, 9.0, 11.0, 10.5], "rejected", "did not improve: counted: host reads per step 1 -> 1"),
        (cost(step_ms=5.0), [10.0, 5.0, 11.0, 6.0], "kept", "(equal); timed: step time"),
        # more compiles cost more whatever the step time
        (cost(host_reads_per_step=0.0, compiles=5, step_ms=5.0), [], "rejected", "costs more: counted: compiles 2 -> 5"),
    ],
)  # fmt: skip
def test_the_keep_rule_counts_first_and_times_only_what_the_counts_leave_open(
    tmp_path, after, timing, status, words
) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    costs = [after] + [cost(step_ms=ms) for ms in timing]  # timing runs: baseline, candidate, baseline, candidate
    session = ScriptedSession(tmp_path, costs, PASS_L3)
    candidate = Candidate("logging_reads", "train.py", "-", "print(2)\n", "print(1)\n")
    verdict, kept = session.judge(candidate, Evidence(cost=cost(), verify=PASS_L3))
    assert verdict.status == status and words in verdict.reason, verdict.reason
    assert (kept is not None) == (status == "kept") and session.runs == 1 + len(timing)
    assert ("pass at L3" in verdict.reason) == (status == "kept")


def test_a_candidate_must_hold_verify_at_the_baselines_level(tmp_path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    session = ScriptedSession(tmp_path, [cost(host_reads_per_step=0.0)], {"level": "L2", "status": "pass"})
    candidate = Candidate("logging_reads", "train.py", "-", "print(2)\n", "print(1)\n")
    verdict, kept = session.judge(candidate, Evidence(cost=cost(), verify=PASS_L3))
    assert kept is None and "left the reference's band: verify pass at L2" in verdict.reason


def test_a_baseline_given_by_the_caller_is_not_run_again(migrated) -> None:
    """migrate --optimize hands over its own check: a tree whose check is below L2 is refused without any run."""
    _, tree = migrated
    check = {"level": "L0", "steps": 3, "reasons": ["43 op call(s) fell back to the CPU (aten::x)"], "per_step": []}
    report = optimize(tree, "python train.py", write=False, baseline=Baseline(check=check, source="a test's run"))
    assert report.status == "refused" and "fell back to the CPU" in report.reason
    assert report.runs == 0 and report.baseline["level"] == "L0"
    assert any("a test's run: not run again" in note for note in report.notes)


@pytest.mark.slow
def test_a_program_below_l2_is_refused(tmp_path) -> None:
    (tmp_path / "train.py").write_text("import torch_xla\nraise SystemExit('broken on purpose')\n")
    report = optimize(tmp_path, "python train.py", write=False)
    assert report.status == "refused" and "not L2" in report.reason


@pytest.mark.slow
def test_per_step_logging_is_moved_to_a_closure_and_kept_on_the_count(migrated) -> None:
    original, tree = migrated
    command = "python train.py --steps 12"
    report = optimize(tree, command, command, original, families_wanted=["logging_reads"])
    logging = next(v for v in report.candidates if v.candidate["family"] == "logging_reads")
    assert logging.before["host_reads_per_step"] >= 1 and logging.after["host_reads_per_step"] == 0
    assert logging.verify["status"] == "pass" and logging.verify["reference_cached"]
    # the read removed is counted: kept unless interleaved runs show every candidate run slower
    assert "counted: host reads per step 1 -> 0" in logging.reason and "timed: step time" in logging.reason
    clearly_slower = bool(logging.timing and logging.timing["slower"])
    assert logging.status == ("rejected" if clearly_slower else "kept"), logging.reason
    # baseline and candidate; two more of each only when one run said the step was slower
    assert report.runs == 2 + (4 if logging.timing else 0)
    written = "xm.add_step_closure" in (tree / "train.py").read_text()
    assert written == (logging.status == "kept")


@pytest.mark.slow
def test_a_proposal_from_elsewhere_is_judged_by_the_same_runs(migrated) -> None:
    """The seam a code model's rewrites enter by: each extra candidate is run, compared and kept or rejected."""
    original, tree = migrated
    text = (tree / "train.py").read_text()
    command = "python train.py --steps 6 --generate 8"
    # a rewrite that changes what is learned: the curve leaves the reference's band
    faster_lr = Candidate(
        family="model_rewrite",
        file="train.py",
        finding="a manual finding the rules left",
        new_text=text.replace("lr=2e-2", "lr=5e-1"),
        original_text=text,
        proposer="model:test",
    )
    # a rewrite made for another version of the file: not tried
    stale = Candidate(
        family="model_rewrite",
        file="train.py",
        finding="-",
        new_text=text,
        original_text=text + "\n",
        proposer="model:test",
    )
    # the rules' fixed-size generation buffer, handed in as if a model had written it: one graph instead of one
    # per token, so it is kept
    from xlaport.kb.optimize import families

    rewrite, _ = families.plan("fixed_generation", text, "train.py", [])
    assert rewrite is not None
    buffer = Candidate(
        family="fixed_generation",
        file="train.py",
        finding="a compile per generated token",
        new_text=rewrite.text,
        original_text=text,
        proposer="model:test",
    )
    report = optimize(
        tree, command, command, original, families_wanted=["bf16_no_scaler"], extra_candidates=[faster_lr, stale, buffer],
        write=False,
    )  # fmt: skip
    judged = [v for v in report.candidates if v.candidate["proposer"] == "model:test"]
    assert [v.status for v in judged] == ["rejected", "not tried", "kept"], [v.reason for v in judged]
    assert "curve" in judged[0].reason and judged[0].verify["status"] != "pass"
    assert "changed since" in judged[1].reason
    assert judged[2].after["compiles_after_warmup"] < judged[2].before["compiles_after_warmup"]
    assert judged[2].verify["status"] == "pass"


@pytest.mark.slow
def test_growing_generation_compiles_a_bounded_number_of_graphs_with_the_same_tokens(migrated) -> None:
    original, tree = migrated
    command = "python train.py --steps 4 --generate 10"
    report = optimize(tree, command, command, original, families_wanted=["fixed_generation"], write=False)
    generation = next(v for v in report.candidates if v.candidate["family"] == "fixed_generation")
    assert generation.status == "kept", generation.reason
    assert report.baseline["compiles_after_warmup"] >= 8 and generation.after["compiles_after_warmup"] <= 2
    printed = [line for line in report.baseline["output_tail"].splitlines() if line.startswith("generated:")]
    assert printed and printed[-1] in generation.output_tail


def test_migrate_optimize_without_a_command_says_it_did_not_run(tmp_path) -> None:
    original = tmp_path / "original"
    shutil.copytree(PROGRAM, original)
    result = Pipeline().migrate(original, tmp_path / "migrated", MigrateOptions(k=0, optimize=True))
    assert result.optimization is None
    assert any(n.startswith("optimize not run") for n in result.notes)


@pytest.mark.slow
def test_migrate_optimize_reuses_the_migrate_steps_run_and_reference(tmp_path) -> None:
    original = tmp_path / "original"
    shutil.copytree(PROGRAM, original)
    command = "python train.py --steps 6 --generate 8"
    options = MigrateOptions(k=0, optimize=True, validate_cmd=command, verify_cmd=command)
    result = Pipeline().migrate(original, tmp_path / "migrated", options, may_execute=True)
    report = result.optimization
    assert report is not None and report["status"] == "optimized", report and report["reason"]
    assert any("the migrate step's run: not run again" in note for note in report["notes"])
    judged = [v for v in report["candidates"] if v["before"] is not None]
    # one run per candidate judged (plus timing runs), none for the baseline; the original ran in migrate only
    extra_timing_runs = sum(2 * (len(v["timing"]["before_ms"]) - 1) for v in judged if v["timing"])
    assert report["runs"] == len(judged) + extra_timing_runs
    assert all(v["verify"]["reference_cached"] for v in judged)
    assert report["baseline"]["compiles_after_warmup"] == result.validation.checks[0].report["compiles_after_warmup"]
