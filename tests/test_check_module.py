"""`xlaport check -m pkg.module` runs a module as `python -m` does (issue 24, item 2): from the working folder, with
that folder first on sys.path (a sibling package imports), `__name__ == "__main__"` and the module's file as
sys.argv[0]. The same file run by its path cannot import its siblings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xlaport.cli import app
from xlaport.files import module_file

XLAPORT = Path(sys.executable).parent / "xlaport"

TRAIN = """\
import sys

import torch
import torch_xla

from nets.small import make_net

assert __name__ == "__main__", __name__
assert sys.argv[0].endswith("train.py") and sys.argv[1:] == ["--steps", "3"], sys.argv
steps = int(sys.argv[2])
device = torch_xla.device()
net = make_net().to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(steps):
    loss = net(torch.ones(2, 3, device=device)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
"""


def make_project(root: Path) -> Path:
    (root / "scripts").mkdir()
    (root / "nets").mkdir()
    (root / "scripts" / "__init__.py").write_text("")
    (root / "nets" / "__init__.py").write_text("")
    (root / "nets" / "small.py").write_text("import torch\n\n\ndef make_net():\n    return torch.nn.Linear(3, 1)\n")
    (root / "scripts" / "train.py").write_text(TRAIN)
    return root


def test_module_file_is_found_as_python_m_finds_it(tmp_path):
    root = make_project(tmp_path)
    assert module_file(root, "scripts.train") == (root / "scripts" / "train.py").resolve()
    (root / "tool").mkdir()
    (root / "tool" / "__main__.py").write_text("")
    assert module_file(root, "tool") == (root / "tool" / "__main__.py").resolve()
    with pytest.raises(FileNotFoundError, match="no module scripts.missing"):
        module_file(root, "scripts.missing")
    with pytest.raises(ValueError, match="not a module name"):
        module_file(root, "scripts/train.py")


def test_cli_usage_errors_for_modules(tmp_path):
    root = make_project(tmp_path)
    runner = CliRunner()
    missing = runner.invoke(app, ["check", "-m", "scripts.nope", "--workdir", str(root)])
    assert missing.exit_code == 2 and "no module scripts.nope" in missing.output
    nothing = runner.invoke(app, ["check", "--workdir", str(root)])
    assert nothing.exit_code == 2 and "xlaport check -m" in nothing.output


def check(root: Path, *args: str) -> dict:
    proc = subprocess.run(
        [str(XLAPORT), "check", "--format", "json", "--timeout", "300", *args],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PJRT_DEVICE": "CPU"},
        timeout=400,
    )
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_a_module_that_imports_its_sibling_package_is_checked(tmp_path):
    root = make_project(tmp_path)
    report = check(root, "-m", "scripts.train", "--", "--steps", "3")
    assert report["level"] == "L2", (report["reasons"], report["error"])
    assert report["steps"] == 3 and report["script"] == str((root / "scripts" / "train.py").resolve())
    assert any("python -m scripts.train" in note for note in report["notes"])
    # by its path, sys.path[0] is scripts/: the sibling package is not found (what -m is for)
    by_path = check(root, "scripts/train.py", "--", "--steps", "3")
    assert by_path["level"] == "none" and "No module named 'nets'" in by_path["error"]


def test_a_python_m_command_is_told_apart_from_a_script_command():
    from xlaport.serve.inputs import module_command, parse_command

    assert module_command("python -m scripts.train --steps 3") == ("scripts.train", ["--steps", "3"])
    assert module_command("python3 -m scripts.train") == ("scripts.train", [])
    assert module_command("python train.py -m x") is None
    with pytest.raises(ValueError, match="must name a Python script"):
        parse_command("python -m scripts.train")  # the commands that need a script file still say so


@pytest.mark.slow
def test_the_service_checks_a_python_m_command_in_its_project(tmp_path):
    from xlaport.serve.pipeline import Pipeline
    from xlaport.serve.project import local_project

    root = make_project(tmp_path)
    outcome = Pipeline().check(
        project=local_project(root), rel_path="scripts/train.py", command="python -m scripts.train --steps 3"
    )
    assert outcome.check.level == "L2", outcome.check.reasons
