"""`xlaport migrate` reads `[tool.xlaport]` as `lint` and `fix` do: select/ignore, exclude, per-file-ignores and
unsafe-fixes, with the command line as a layer on top (kb/lint_config.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xlaport.cli import app

TRAIN = """import torch

model = torch.nn.Linear(2, 2).cuda()
x = torch.zeros(2).cuda()
torch.cuda.synchronize()
scaler = torch.cuda.amp.GradScaler()
with torch.cuda.amp.autocast():
    y = model(x)
"""
CONFIG = """[project]
name = "demo"

[tool.xlaport]
ignore = ["XLA204"]
exclude = ["legacy"]
per-file-ignores = {"tests/*" = ["XLA201"]}
unsafe-fixes = true
"""
FILES = ("train.py", "legacy/old_train.py", "tests/test_train.py")


def run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    src = tmp_path / "project"
    for name in FILES:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(TRAIN)
    (src / "pyproject.toml").write_text(CONFIG)
    return src


def migrate(src: Path, out: Path, *args: str) -> dict:
    result = run("migrate", str(src), "--out", str(out), "--format", "json", "-j", "1", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_migrate_follows_the_configuration(project: Path, tmp_path: Path):
    out = tmp_path / "out"
    migrate(project, out)
    train = (out / "train.py").read_text()
    assert "torch_xla.device()" in train  # selected
    assert "torch.cuda.synchronize()" in train  # ignore = XLA204
    assert 'torch.autocast("xla"' in train and "GradScaler" not in train  # unsafe-fixes = true
    assert (out / "legacy" / "old_train.py").read_text() == TRAIN  # exclude: copied as it is
    tests = (out / "tests" / "test_train.py").read_text()
    assert ".cuda()" in tests and 'torch.autocast("xla"' in tests  # per-file-ignores: XLA201 only


def test_migrate_gives_what_fix_gives_with_the_same_configuration(project: Path, tmp_path: Path):
    """The same tree and configuration: `fix` in place and `migrate` into a copy leave the same Python files."""
    out = tmp_path / "out"
    migrate(project, out)
    fixed = tmp_path / "fixed"
    shutil.copytree(project, fixed)
    result = run("fix", str(fixed), "-j", "1")
    assert result.exit_code == 0, result.output
    for name in FILES:
        assert (out / name).read_text() == (fixed / name).read_text(), name


def test_the_command_line_is_a_layer_on_top(project: Path, tmp_path: Path):
    migrate(project, tmp_path / "isolated", "--isolated")
    assert "torch.cuda.synchronize()" not in (tmp_path / "isolated" / "train.py").read_text()
    assert "GradScaler" in (tmp_path / "isolated" / "train.py").read_text()  # safe fixes only without the config
    assert (tmp_path / "isolated" / "legacy" / "old_train.py").read_text() != TRAIN

    migrate(project, tmp_path / "safe", "--no-unsafe-fixes", "--select", "XLA2")
    safe = (tmp_path / "safe" / "train.py").read_text()
    assert "GradScaler" in safe and "torch.cuda.amp.autocast" in safe  # --no-unsafe-fixes, XLA5 not selected
    assert "xm.wait_device_ops()" in safe  # --select replaces the configured selection, its ignore included


def test_a_bad_configuration_stops_migrate_before_any_work(project: Path, tmp_path: Path):
    (project / "pyproject.toml").write_text(CONFIG.replace('ignore = ["XLA204"]', 'ignore = ["XLA2O4"]'))
    result = run("migrate", str(project), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "pyproject.toml" in result.output and "XLA2O4" in result.output
    assert not (tmp_path / "out").exists()
