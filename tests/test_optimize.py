"""The optimization stage (serve/optimize.py, `xlaport optimize`): proposals without a command, refusal below
L2, and (slow) real runs of tests/programs/optimize/train.py migrated to XLA, judged by check and verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.serve.optimize import StepCost, compare, optimize
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


def test_step_cost_comparison_counts_first_and_time_beyond_its_noise() -> None:
    better, worse = compare(cost(), cost(host_reads_per_step=0.0))
    assert better == ["host reads per step 1 -> 0"] and not worse
    better, worse = compare(cost(), cost(host_reads_per_step=0.0, step_ms=30.0))
    assert worse and "step time" in worse[0]
    # a slower step inside the runs' own spread is noise, not a regression
    better, worse = compare(cost(step_ms_spread=15.0), cost(host_reads_per_step=0.0, step_ms=30.0))
    assert not worse
    better, worse = compare(cost(compiles=14, compiles_after_warmup=12), cost(compiles=3, compiles_after_warmup=0))
    assert len(better) == 2


@pytest.mark.slow
def test_a_program_below_l2_is_refused(tmp_path) -> None:
    (tmp_path / "train.py").write_text("import torch_xla\nraise SystemExit('broken on purpose')\n")
    report = optimize(tmp_path, "python train.py", write=False)
    assert report.status == "refused" and "not L2" in report.reason


@pytest.mark.slow
def test_per_step_logging_is_moved_to_a_closure_and_kept_with_verify(migrated) -> None:
    original, tree = migrated
    command = "python train.py --steps 12"
    report = optimize(tree, command, command, original)
    logging = next(v for v in report.candidates if v.candidate["family"] == "logging_reads")
    assert logging.status == "kept", logging.reason
    assert logging.before["host_reads_per_step"] >= 1 and logging.after["host_reads_per_step"] == 0
    assert logging.verify["status"] == "pass" and logging.verify["reference_cached"]
    assert "xm.add_step_closure" in (tree / "train.py").read_text()
    assert report.status == "optimized" and report.written == ["train.py"]


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
