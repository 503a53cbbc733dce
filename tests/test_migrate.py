"""`xlaport migrate`: bulk rewriting through the pipeline, reports, trace, in-place safety, validation."""

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.kb.retrieval import FixIndex, cache_dir
from xlaport.serve.pipeline import MigrateOptions, Pipeline
from xlaport.serve.tree import DestinationNotEmpty, plan_tree

from xlaport.cli import app
from xlaport.files import DirtyTree
from xlaport.trace import TRACE_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "tests" / "fixtures" / "serve_project"
EXAMPLES = ROOT / "examples"
NO_RETRIEVAL = MigrateOptions(k=0)
TRACE_KEYS = {
    "schema",
    "run_id",
    "time",
    "src",
    "path",
    "unit",
    "function",
    "original",
    "migrated",
    "patch",
    "codes_applied",
    "codes_left",
    "proposed_by",
    "validation",
    "error",
}


@pytest.fixture(autouse=True)
def global_trace(tmp_path, monkeypatch):
    path = tmp_path / "global-traces.jsonl"
    monkeypatch.setenv("XLAPORT_TRACES", str(path))
    monkeypatch.setenv("XLAPORT_MODELS_DIR", str(tmp_path / "no-models"))  # the CLI runs rules-only
    return path


@pytest.fixture(scope="module")
def pipeline():
    return Pipeline(index=FixIndex.load_or_build(directory=cache_dir()))


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def copy_project(tmp_path: Path) -> Path:
    src = tmp_path / "project"
    shutil.copytree(PROJECT, src)
    return src


def read_trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_examples_end_to_end_reports_and_trace(tmp_path, pipeline, global_trace):
    src = EXAMPLES if any(EXAMPLES.rglob("*.py")) else PROJECT
    before = tree_digest(src)
    dst = tmp_path / "out"
    result = pipeline.migrate(src, dst, MigrateOptions(keep_trace=True))
    assert tree_digest(src) == before  # the source is only read

    python, other = plan_tree(src)
    assert result.python_files == len(python) and result.other_files_copied == len(other)
    assert result.files_changed >= 1 and not result.errors
    for rel in python + other:
        assert (dst / rel).is_file()
    report = json.loads((dst / "xlaport-report.json").read_text())
    assert report["run_id"] == result.run_id and report["fixes_applied"] == result.fixes_applied
    assert report["validation"]["status"] == "unvalidated"
    markdown = (dst / "xlaport-report.md").read_text()
    page = (dst / "xlaport-report.html").read_text()
    for outcome in result.files:
        if outcome.status == "changed":
            assert f"`{outcome.path}`" in markdown and outcome.path in page
    assert "```diff" in markdown and '<span class="add">' in page
    assert "<style>" in page and "<script" not in page and "http://" not in page and "https://" not in page
    for item in (m for f in result.files for m in f.manual):
        assert item.retrieved and f"related fix {item.retrieved[0].code}" in markdown

    records = read_trace(dst / "xlaport-trace.jsonl")
    assert records == read_trace(global_trace)
    assert all(set(r) == TRACE_KEYS and r["schema"] == TRACE_SCHEMA and r["run_id"] == result.run_id for r in records)
    files = [r for r in records if r["unit"] == "file"]
    assert [r["path"] for r in files] == [str(p) for p in python]
    changed = next(r for r in files if r["codes_applied"])
    assert changed["original"] == (src / changed["path"]).read_text()
    assert changed["migrated"] == (dst / changed["path"]).read_text()
    functions = [r for r in records if r["unit"] == "function" and r["path"] == changed["path"]]
    assert functions and all(r["patch"] or r["codes_left"] or r["codes_applied"] for r in functions)
    assert sorted(c for r in functions for c in r["codes_applied"]) == sorted(changed["codes_applied"])


def test_unreadable_and_unparsable_files_are_counted_and_copied_as_is(tmp_path):
    src = copy_project(tmp_path)
    (src / "broken.py").write_text("def broken(:\n    x.cuda()\n")
    (src / "blob.py").write_bytes(b"\x00\x01binary\xff")
    (src / "weights.bin").write_bytes(b"\x00\x01\x02binary\xff")  # a non-Python file: copied byte for byte
    result = Pipeline().migrate(src, tmp_path / "out", NO_RETRIEVAL)
    assert len(result.errors) == 2
    assert {o.path for o in result.files if o.status == "error"} == {"broken.py", "blob.py"}
    for name in ("broken.py", "blob.py", "weights.bin"):
        assert (tmp_path / "out" / name).read_bytes() == (src / name).read_bytes()
    assert "XLA101" in result.fixes_applied  # the other files were still migrated
    assert "Files not migrated" in (tmp_path / "out" / "xlaport-report.md").read_text()


def test_empty_folders_of_the_original_are_in_the_copy(tmp_path):
    """A training script that opens `logs/run.csv` runs from a clone where the user made `logs/`: the migrated copy
    must have it too (an unseen trainer died of FileNotFoundError in the copy, not in the original)."""
    src = copy_project(tmp_path)
    (src / "logs").mkdir()
    (src / "runs" / "ckpt").mkdir(parents=True)
    (src / ".git").mkdir(exist_ok=True)
    Pipeline().migrate(src, tmp_path / "out", NO_RETRIEVAL)
    assert (tmp_path / "out" / "logs").is_dir() and (tmp_path / "out" / "runs" / "ckpt").is_dir()
    assert not (tmp_path / "out" / ".git").exists()


def test_destination_rules(tmp_path):
    src = copy_project(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(DestinationNotEmpty):
        Pipeline().migrate(src, tmp_path / "full", NO_RETRIEVAL)
    with pytest.raises(ValueError, match="outside the source"):
        Pipeline().migrate(src, src / "sub", NO_RETRIEVAL)
    with pytest.raises(ValueError, match="--out"):
        Pipeline().migrate(src, None, NO_RETRIEVAL)
    with pytest.raises(ValueError, match="not in the source tree"):
        Pipeline().migrate(src, tmp_path / "o2", MigrateOptions(k=0, validate_cmd="python missing.py"))
    forced = Pipeline().migrate(src, tmp_path / "full", MigrateOptions(k=0, force=True))
    assert forced.files_changed == 2 and (tmp_path / "full" / "keep.txt").read_text() == "mine"


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


def test_in_place_refuses_a_dirty_git_tree_and_writes_a_clean_one(tmp_path):
    src = copy_project(tmp_path)
    git(src, "init", "-q")
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "start")
    original = (src / "model.py").read_text()
    (src / "model.py").write_text(original + "\n# local edit\n")
    with pytest.raises(DirtyTree):
        Pipeline().migrate(src, None, MigrateOptions(k=0, in_place=True))
    assert (src / "model.py").read_text() == original + "\n# local edit\n"
    git(src, "checkout", "-q", "model.py")

    result = Pipeline().migrate(src, None, MigrateOptions(k=0, in_place=True))
    assert result.written and result.in_place and result.dst is None
    assert "torch_xla.device()" in (src / "model.py").read_text()
    assert not list(src.glob("*.xlaport.bak"))  # git holds the way back
    assert (src / ".xlaport" / "xlaport-report.html").is_file()
    assert ".xlaport/xlaport-report.json" not in [str(p) for p in plan_tree(src)[1]]


def test_in_place_outside_git_keeps_backups(tmp_path):
    src = copy_project(tmp_path)
    original = (src / "train.py").read_text()
    result = Pipeline().migrate(src, tmp_path / "reports", MigrateOptions(k=0, in_place=True))
    assert (src / "train.py.xlaport.bak").read_text() == original
    assert (src / "train.py").read_text() != original
    assert result.reports["html"] == str(tmp_path / "reports" / "xlaport-report.html")


def test_no_trace_is_kept_unless_asked(tmp_path, global_trace, monkeypatch):
    """Traces quote the user's source: a plain migrate writes none, in the tree or in the cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("XLAPORT_CACHE_DIR", raising=False)
    src = copy_project(tmp_path)
    result = Pipeline().migrate(src, tmp_path / "out", MigrateOptions(k=0))
    assert result.files_changed >= 1
    assert not (tmp_path / "out" / "xlaport-trace.jsonl").exists() and not global_trace.exists()
    assert "trace" not in result.reports
    asked = Pipeline().migrate(src, tmp_path / "asked", MigrateOptions(k=0, keep_trace=True))
    assert (tmp_path / "asked" / "xlaport-trace.jsonl").is_file() and global_trace.is_file()
    assert asked.reports["trace"] == str(tmp_path / "asked" / "xlaport-trace.jsonl")


def test_cache_root_honours_xdg_cache_home(tmp_path, monkeypatch):
    from xlaport.paths import cache_root

    monkeypatch.delenv("XLAPORT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "xlaport"
    monkeypatch.setenv("XLAPORT_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


@pytest.mark.slow
def test_parallel_jobs_give_the_same_tree_in_the_same_order(tmp_path):
    src = copy_project(tmp_path)
    for i in range(4):
        shutil.copy(src / "model.py", src / f"model_{i}.py")
    one = Pipeline().migrate(src, tmp_path / "one", MigrateOptions(k=0, jobs=1))
    two = Pipeline().migrate(src, tmp_path / "two", MigrateOptions(k=0, jobs=2))
    assert [f.path for f in one.files] == [f.path for f in two.files]
    assert [f.diff for f in one.files] == [f.diff for f in two.files]
    digest_one, digest_two = tree_digest(tmp_path / "one"), tree_digest(tmp_path / "two")
    for name in ("xlaport-report.json", "xlaport-report.md", "xlaport-report.html"):
        digest_one.pop(name), digest_two.pop(name)
    assert digest_one == digest_two


@pytest.mark.slow
def test_cli_keeps_its_flags_and_summary(tmp_path):
    src = copy_project(tmp_path)
    runner = CliRunner()
    missing = runner.invoke(app, ["migrate", str(src)])
    assert missing.exit_code == 2 and "--out" in missing.output
    result = runner.invoke(
        app, ["migrate", str(src), "--out", str(tmp_path / "out"), "--format", "json", "--select", "C1,C2"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["files_changed"] == 2 and summary["validation"]["status"] == "unvalidated"
    assert all(code.startswith(("XLA1", "XLA2")) for code in summary["fixes_applied"])
    again = runner.invoke(app, ["migrate", str(src), "--out", str(tmp_path / "out")])
    assert again.exit_code == 2 and "not empty" in again.output
    text = runner.invoke(app, ["migrate", str(src), "--out", str(tmp_path / "out"), "--force", "--select", "C1,C2"])
    assert text.exit_code == 0 and "fixes applied: XLA101×1" in text.stdout and "report:" in text.stdout


@pytest.mark.slow
def test_validated_and_verified_migration_reaches_l2_with_one_execution_check(tmp_path, pipeline, monkeypatch):
    """The migrated entry script passes the execution check and the generated tests pass; validate and verify
    share that one check (the real executions of the migrated program are counted)."""
    import xlaport.eval.check.run as check_module

    executed = []
    real = check_module.run_sandboxed

    def counted(argv, **kwargs):
        executed.append(argv)
        return real(argv, **kwargs)

    monkeypatch.setattr(check_module, "run_sandboxed", counted)
    command = "python train.py --steps 4"
    options = MigrateOptions(k=0, validate_cmd=command, verify_cmd=command, keep_trace=True)
    result = pipeline.migrate(PROJECT, tmp_path / "out", options)
    assert len(executed) == 1, executed
    checks = {c.name: c for c in result.validation.checks}
    xla_check = result.validation.checks[0]
    assert xla_check.name == "xla_check" and xla_check.level == "L2" and xla_check.passed, xla_check.reasons
    assert checks["generated_tests"].passed, checks["generated_tests"].reasons
    assert result.validation.status == "validated" and result.validation.level == "L2"
    assert xla_check.report == result.verification.report["check"]
    assert result.verification.report["migrated_run"]["returncode"] == 0
    steps = [t.name for t in result.phases if t.phase == "verify"]
    assert steps[:2] == ["the migrated run", "the original's run"] and steps[-1] == "grading", steps
    records = read_trace(tmp_path / "out" / "xlaport-trace.jsonl")
    assert {r["validation"]["status"] for r in records} == {"validated"}
    report = (tmp_path / "out" / "xlaport-report.md").read_text()
    assert "Validation evidence" in report
    kept = tmp_path / "out" / "tests_xla"  # the generated tests stay with the migration, linked from the report
    assert sorted(p.name for p in kept.glob("test_xlaport_*.py")) and (kept / "README.md").is_file()
    assert str(kept) in report


@pytest.mark.slow
def test_migrated_example_entry_script_passes_the_execution_check(tmp_path, pipeline):
    script = EXAMPLES / "tiny_lm" / "train.py"
    if not script.is_file():
        pytest.skip("examples/tiny_lm is not bundled")
    pipeline.migrate(EXAMPLES, tmp_path / "out", MigrateOptions(k=0, unsafe_fixes=True))
    outcome = pipeline.check(path=tmp_path / "out" / "tiny_lm" / "train.py", args=["--steps", "3", "--eval-every", "3"])
    assert outcome.check.passed and outcome.check.level == "L2", outcome.check.reasons


def _verify_report(command: list[str]):
    from xlaport.eval.verify.report import VerifyReport

    check = {"level": "L2", "reasons": [], "steps": 4}
    return VerifyReport(
        original="o",
        migrated="m",
        command=command,
        level="L2",
        required="L3",
        status="inconclusive",
        reasons=["L1: too few steps"],
        check=check,
    )


@pytest.mark.parametrize(
    ("validate", "verify", "executions"),
    [
        ("python train.py --steps 4", "python train.py --steps 4", 1),
        ("train.py --steps 4", "python  train.py  --steps 4", 1),  # the same command, spelled otherwise
        ("python train.py --steps 4", "python train.py --steps 8", 2),
    ],
)
def test_validate_and_verify_share_one_execution_when_their_command_is_the_same(
    tmp_path, pipeline, monkeypatch, validate, verify, executions
):
    """Which runs the pipeline asks for (the runs themselves: the slow test below)."""
    import xlaport.serve.checks as checks_module  # the pipeline imports its checks when evidence is asked for
    from xlaport.serve.results import CheckRun

    runs = []

    def run_verify(original, migrated, command, step=None, reference_cache=None):
        step("the migrated run")
        runs.append(("verify", command))
        return _verify_report(command.split())

    def run_xla_check(script, args, timeout_s, memory_mb, workdir=None):
        runs.append(("check", args))
        return CheckRun(name="xla_check", passed=True, level="L2")

    def run_generated_tests(original, migrated, out, record=None, timeout_s=600.0, step=None):
        step("the generated tests")
        runs.append(("tests", record))
        return CheckRun(name="generated_tests", passed=True)

    for name, fake in [
        ("run_verify", run_verify),
        ("run_xla_check", run_xla_check),
        ("run_generated_tests", run_generated_tests),
    ]:
        monkeypatch.setattr(checks_module, name, fake)
    result = pipeline.migrate(PROJECT, tmp_path / "out", MigrateOptions(k=0, validate_cmd=validate, verify_cmd=verify))
    assert sum(kind in ("verify", "check") for kind, _ in runs) == executions  # verify runs the program once itself
    assert [kind for kind, _ in runs].count("tests") == 1
    assert result.validation.status == "validated" and result.verification.status == "inconclusive"
    if executions == 1:
        assert result.validation.checks[0].report == result.verification.report["check"]
    assert (tmp_path / "out" / "xlaport-verify.html").is_file() and (tmp_path / "out" / "xlaport-verify.json").is_file()
    assert "Verify" in (tmp_path / "out" / "xlaport-report.md").read_text()
    # where the time went: each phase in order, the steps of verify and validation inside them
    timings = [(t.phase, t.name) for t in result.phases]
    assert [name for phase, name in timings if phase is None] == [
        "rewrite", "findings left", "write", "verify", "validate", "reports"
    ]  # fmt: skip
    steps = [(phase, name) for phase, name in timings if phase is not None]
    assert steps[0] == ("verify", "the migrated run") and steps[-1] == ("validate", "the generated tests")
    assert (("validate", "the migrated run (execution check)") in steps) == (executions == 2)
    assert sum(t.seconds for t in result.phases if t.phase is None and t.name != "reports") <= result.wall_s


def test_in_place_migration_that_verify_fails_is_not_written(tmp_path, pipeline, monkeypatch):
    import xlaport.serve.checks as checks_module

    def failing_verify(original, migrated, command, step=None, reference_cache=None):
        assert (migrated / "train.py").read_text() != (original / "train.py").read_text()  # the staged migration
        report = _verify_report(command.split())
        report.status, report.reasons = "fail", ["L1: the loss diverged"]
        return report

    monkeypatch.setattr(checks_module, "run_verify", failing_verify)
    src = copy_project(tmp_path)
    before = tree_digest(src)
    options = MigrateOptions(k=0, in_place=True, verify_cmd="python train.py --steps 4")
    result = pipeline.migrate(src, None, options)
    assert result.written is False and result.verification.status == "fail"
    assert "verify rejected the migration" in " ".join(result.notes)
    assert {k: v for k, v in tree_digest(src).items() if not k.startswith(".xlaport/")} == before
    assert (src / ".xlaport" / "xlaport-verify.html").is_file()


def test_own_reports_are_neither_linted_nor_copied_again(tmp_path):
    """A migrated tree holds xlaport's reports: `lint DST` counts the code's findings only, and migrating DST again
    plans its code, not the previous run's report and trace."""
    from xlaport.files import iter_python_files

    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "train.py").write_text("import torch\nx = torch.zeros(2).cuda()\n")
    (dst / "ds_config.json").write_text('{"fp16": {"enabled": true}}\n')
    for name in ("xlaport-report.json", "xlaport-report.md", "xlaport-report.html", "xlaport-trace.jsonl"):
        (dst / name).write_text('{"message": "fp16 cuda nccl"}\n')
    python, other = plan_tree(dst)
    assert python == [Path("train.py")] and other == [Path("ds_config.json")]
    linted = {p.name for p in iter_python_files([dst], (".py", ".json", ".jsonl", ".md", ".html"))}
    assert linted == {"train.py", "ds_config.json"}
