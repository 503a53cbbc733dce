"""The CLI contract: exit codes, JSON/SARIF shape, fix --diff, migrate, unreadable files, git safety."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xlaport.cli import app

CUDA_SOURCE = "import torch\n\nx = torch.zeros(2).cuda()\ntorch.cuda.synchronize()\n"
CLEAN_SOURCE = "import torch\n\nx = torch.zeros(2)\n"


def run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text(CUDA_SOURCE)
    (src / "pkg" / "clean.py").write_text(CLEAN_SOURCE)
    (src / "pkg" / "broken.py").write_text("def f(:\n")
    (src / "pkg" / "latin1.py").write_bytes("# caf\xe9\nx = 1\n".encode("latin-1"))
    (src / "pkg" / "blob.py").write_bytes(b"\x00\x01\x02binary")
    (src / "data.csv").write_text("a,b\n1,2\n")
    return src


def test_lint_exit_codes(tmp_path: Path):
    dirty = tmp_path / "a.py"
    dirty.write_text(CUDA_SOURCE)
    clean = tmp_path / "b.py"
    clean.write_text(CLEAN_SOURCE)
    assert run("lint", str(dirty)).exit_code == 1
    assert run("lint", str(clean)).exit_code == 0
    assert run("lint", str(tmp_path / "missing.py")).exit_code == 2
    assert run("lint", "--select", "NOPE9", str(clean)).exit_code == 2
    assert run("lint", "--format", "yaml", str(clean)).exit_code == 2


def test_lint_json_shape(tmp_path: Path):
    path = tmp_path / "a.py"
    path.write_text(CUDA_SOURCE)
    result = run("lint", "--format", "json", str(path))
    log = json.loads(result.stdout)
    assert log["schema_version"] == 2 and log["errors"] == []
    findings = log["findings"]
    assert {f["code"] for f in findings} >= {"XLA201", "XLA204"}
    for f in findings:
        keys = {"path", "line", "column", "end_line", "end_column", "code", "category", "message", "fix", "edits"}
        assert keys <= f.keys()
        assert f["category"] in {f"C{i}" for i in range(1, 8)}
        assert f["fix"] in {"safe", "unsafe", "manual"}
    first = next(f for f in findings if f["code"] == "XLA201")
    assert (first["line"], first["column"]) == (3, 5)


def test_lint_select_and_sarif(tmp_path: Path):
    path = tmp_path / "a.py"
    path.write_text(CUDA_SOURCE)
    findings = json.loads(run("lint", "--format", "json", "--select", "XLA204", str(path)).stdout)["findings"]
    assert [f["code"] for f in findings] == ["XLA204"]
    sarif = json.loads(run("lint", "--format", "sarif", str(path)).stdout)
    assert sarif["version"] == "2.1.0"
    assert {r["ruleId"] for r in sarif["runs"][0]["results"]} >= {"XLA201", "XLA204"}


def test_fix_diff_writes_nothing(tmp_path: Path):
    path = tmp_path / "a.py"
    path.write_text(CUDA_SOURCE)
    result = run("fix", "--diff", str(path))
    assert result.exit_code == 0
    assert "+x = torch.zeros(2).to(torch_xla.device())" in result.stdout
    assert path.read_text() == CUDA_SOURCE


def test_fix_outside_git_keeps_a_backup(tmp_path: Path):
    path = tmp_path / "a.py"
    path.write_text(CUDA_SOURCE)
    assert run("fix", str(path)).exit_code == 0
    assert "torch_xla.device()" in path.read_text()
    assert (tmp_path / "a.py.xlaport.bak").read_text() == CUDA_SOURCE


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_fix_refuses_uncommitted_changes_unless_forced(tmp_path: Path):
    _git(tmp_path, "init", "-q")
    path = tmp_path / "a.py"
    path.write_text(CLEAN_SOURCE)
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    path.write_text(CUDA_SOURCE)  # uncommitted edit
    result = run("fix", str(path))
    assert result.exit_code == 2 and "uncommitted" in result.output
    assert path.read_text() == CUDA_SOURCE
    assert run("fix", "--force", str(path)).exit_code == 0
    assert "torch_xla" in path.read_text()
    assert (tmp_path / "a.py.xlaport.bak").read_text() == CUDA_SOURCE


def test_migrate_tree(tree: Path, tmp_path: Path):
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    out = tmp_path / "out"
    result = run("migrate", str(tree), "--out", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == before, "source was modified"
    assert "torch_xla.device()" in (out / "train.py").read_text()
    assert (out / "data.csv").read_text() == "a,b\n1,2\n"
    assert summary["files_changed"] == 1
    assert summary["fixes_applied"]["XLA201"] == 1
    assert len(summary["errors"]) == 3  # unparsable, non-UTF-8, binary: reported and counted
    assert (out / "pkg" / "broken.py").read_text() == "def f(:\n"  # copied as is, never rewritten


def test_migrate_refuses_a_non_empty_destination(tree: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run("migrate", str(tree), "--out", str(out))
    assert result.exit_code == 2
    assert (out / "keep.txt").read_text() == "mine"


def test_unreadable_files_are_reported_not_skipped(tree: Path):
    result = run("lint", str(tree / "pkg"))
    assert result.exit_code == 1
    for name in ("broken.py", "latin1.py", "blob.py"):
        assert name in result.output


def test_kb_list_and_show():
    entries = json.loads(run("kb", "list", "--format", "json").stdout)
    assert len(entries) == len({e["code"] for e in entries})
    shown = run("kb", "show", "XLA201")
    assert shown.exit_code == 0 and "Fix safety" in shown.stdout
    assert run("kb", "show", "XLA999").exit_code == 2


def test_console_script_runs():
    exe = Path(sys.executable).with_name("xlaport")
    result = subprocess.run([str(exe), "kb", "show", "XLA204"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "wait_device_ops" in result.stdout


def test_the_command_line_loads_no_heavy_module_before_a_command_runs():
    """`xlaport --help` stays fast: mounting every area's commands imports no libcst, torch, numpy or pydantic."""
    code = "import sys, xlaport.cli; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = json.loads(subprocess.check_output([sys.executable, "-c", code], text=True).replace("'", '"'))
    assert not {"libcst", "torch", "torch_xla", "numpy", "pydantic", "matplotlib"} & set(loaded)
    assert "kb" in [group.name for group in app.registered_groups]  # kb/cli.py mounted its group


def test_lint_and_fix_of_a_folder_see_steps_in_other_modules(tmp_path: Path):
    # the folder is analysed as one tree, as `migrate` does: the batch loop whose step runs in another module's
    # object gets its barrier; the same file linted alone gets a manual finding instead
    import shutil

    src = tmp_path / "proj"
    shutil.copytree(Path(__file__).parent / "fixtures" / "project" / "trainer_member" / "input", src)
    loop = src / "diffusion" / "train_loop.py"
    folder = run("lint", str(src), "--select", "XLA406", "--format", "json")
    assert [(f["line"], f["fix"]) for f in json.loads(folder.stdout)["findings"]] == [(20, "safe")]
    alone = run("lint", str(loop), "--select", "XLA406", "--format", "json")
    assert [(f["line"], f["fix"]) for f in json.loads(alone.stdout)["findings"]] == [(27, "manual")]
    diff = run("fix", "--diff", str(src), "--select", "XLA406")
    assert diff.stdout.count("+            torch_xla.sync()") == 1


def test_each_area_adds_the_commands_the_root_lists_for_it():
    """`main` mounts only the area owning the command it runs: xlaport.cli.AREAS must say what each one adds."""
    import typer

    from xlaport.cli import AREAS, build_app

    for add, names in AREAS.items():
        alone = typer.Typer()
        add(alone)
        mounted = [c.name or c.callback.__name__ for c in alone.registered_commands]
        mounted += [g.name for g in alone.registered_groups]
        assert sorted(mounted) == sorted(names), add.__name__
    everything = build_app()
    root_commands = 1  # `env`
    assert (
        len(everything.registered_commands) + len(everything.registered_groups)
        == sum(map(len, AREAS.values())) + root_commands
    )
    assert [g.name for g in build_app("train").registered_groups] == ["train"]


def test_a_command_runs_with_only_its_area_mounted():
    exe = Path(sys.executable).with_name("xlaport")
    for args, expected in (
        (["train", "--help"], "lora"),
        (["kb", "show", "XLA201"], "XLA201"),
        (["--help"], "verify"),
        (["--version"], "xlaport"),
    ):
        result = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and expected in result.stdout, (args, result.stderr)


def test_version_and_env_answer_without_a_command():
    from importlib import metadata

    runner = CliRunner()
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.strip() == f"xlaport {metadata.version('xlaport')}"
    env = runner.invoke(app, ["env"], env={"PJRT_DEVICE": "CPU"})
    assert env.exit_code == 0
    assert f"torch_xla: {metadata.version('torch_xla')}" in env.stdout and "PJRT_DEVICE=CPU" in env.stdout
