"""`check` and `verify` run a script where `python SCRIPT` would: in the caller's folder, SCRIPT found there,
the project around it reachable (`../model`, `../dataset`), as the sandbox user, and the user's files unchanged.

The projects are written here, small, in the layouts real training code uses: a nanoGPT-style folder whose
train.py exec()s a configurator that reads a config file and `--key=value` overrides, and a project whose
trainer/ imports its model from the folder above and reads ../dataset."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.eval.sandbox import project_root, sandbox_status

from xlaport.cli import app

MECH = sandbox_status()
needs_user = pytest.mark.skipif(MECH.user is None, reason="not root: no unprivileged user to drop to")

CONFIGURATOR = """\
# Overrides for the calling script's globals: a settings file, or --name=value (exec'd by train.py).
import sys
from ast import literal_eval

for word in sys.argv[1:]:
    if "=" not in word:
        print(f"settings from {word}")
        exec(open(word).read())
    else:
        name, text = word.lstrip("-").split("=", 1)
        try:
            value = literal_eval(text)
        except (SyntaxError, ValueError):
            value = text
        globals()[name] = value
"""

NANO_TRAIN = """\
import os

import torch
import torch_xla
import torch_xla.core.xla_model as xm

max_iters = 50
learning_rate = 0.1
out_dir = "out"
exec(open("configurator.py").read())

device = torch_xla.device()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
with open(os.path.join("data", "numbers.txt")) as handle:
    numbers = [float(word) / 7 for word in handle.read().split()]
inputs = torch.tensor(numbers).reshape(8, 8).to(device)
targets = inputs.sum(dim=1, keepdim=True)
for step in range(max_iters):
    optimizer.zero_grad()
    loss = ((model(inputs) - targets) ** 2).mean()
    loss.backward()
    optimizer.step()
    xm.add_step_closure(lambda value=loss, at=step: print(f"step {at} loss {value.item():.4f}"))
    torch_xla.sync()
os.makedirs(out_dir, exist_ok=True)
torch.save({k: v.cpu() for k, v in model.state_dict().items()}, os.path.join(out_dir, "ckpt.pt"))
print("uid", os.getuid(), "iters", max_iters, "lr", learning_rate)
"""

MODEL = """\
import torch


class TinyRegressor(torch.nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(width, 1)

    def forward(self, x):
        return self.layer(x)
"""

TRAINER = """\
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the project root, as its README says to run it

import torch
from model import TinyRegressor

{device_lines}
numbers = []
for path in sorted(glob.glob(os.path.join(HERE, "..", "dataset", "*.txt"))):
    numbers += [float(word) / 7 for word in open(path).read().split()]
torch.manual_seed(0)
model = TinyRegressor().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
inputs = torch.tensor(numbers[:64]).reshape(8, 8).to(device)
targets = inputs.sum(dim=1, keepdim=True)
for step in range(8):
    optimizer.zero_grad()
    loss = ((model(inputs) - targets) ** 2).mean()
    loss.backward()
    optimizer.step()
    {log_line}
with open("last_run.txt", "w") as handle:  # in the working folder, wherever that is
    handle.write("done")
"""
ORIGINAL_DEVICE = 'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")'
MIGRATED_DEVICE = "import torch_xla\nimport torch_xla.core.xla_model as xm\n\ndevice = torch_xla.device()"
ORIGINAL_LOG = 'print(f"step {step} loss {loss.item():.4f}")'
MIGRATED_LOG = (
    'xm.add_step_closure(lambda value=loss, at=step: print(f"step {at} loss {value.item():.4f}"))\n    torch_xla.sync()'
)


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def tree_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def nano_project(folder: Path) -> Path:
    return write(
        folder,
        {
            "train.py": NANO_TRAIN,
            "configurator.py": CONFIGURATOR,
            "config/x.py": 'learning_rate = 0.05\nout_dir = "out-small"\n',
            "data/numbers.txt": " ".join(str(i % 7) for i in range(64)) + "\n",
        },
    )


def trainer_project(folder: Path, migrated: bool) -> Path:
    trainer = TRAINER.format(
        device_lines=MIGRATED_DEVICE if migrated else ORIGINAL_DEVICE,
        log_line=MIGRATED_LOG if migrated else ORIGINAL_LOG,
    )
    return write(
        folder,
        {
            "requirements.txt": "torch\n",  # what marks the project's root
            "model/__init__.py": MODEL,
            "trainer/train.py": trainer,
            "dataset/part1.txt": " ".join(str(i % 7) for i in range(40)) + "\n",
            "dataset/part2.txt": " ".join(str(i % 5) for i in range(40)) + "\n",
        },
    )


def check_json(monkeypatch, where: Path, *words: str) -> tuple[int, dict]:
    monkeypatch.chdir(where)
    result = CliRunner().invoke(app, ["check", *words[:1], "--format", "json", "--timeout", "300", *words[1:]])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.output)


def test_project_root_is_the_git_work_tree_or_the_project_folder(tmp_path):
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "b").mkdir(parents=True)
    assert project_root(tmp_path / "repo" / "a" / "b") == tmp_path / "repo"
    (tmp_path / "proj" / "trainer").mkdir(parents=True)
    (tmp_path / "proj" / "requirements.txt").write_text("torch\n")
    assert project_root(tmp_path / "proj" / "trainer") == tmp_path / "proj"
    (tmp_path / "loose").mkdir()
    assert project_root(tmp_path / "loose") == tmp_path / "loose"
    # a migrated copy of a tree without git: its root (where migrate wrote its report) is the project, even
    # when a sub-folder has a requirements file of its own
    (tmp_path / "migrated" / "tutorials" / "basics").mkdir(parents=True)
    (tmp_path / "migrated" / "tutorials" / "requirements.txt").write_text("torch\n")
    (tmp_path / "migrated" / "xlaport-report.json").write_text("{}\n")
    assert project_root(tmp_path / "migrated" / "tutorials" / "basics") == tmp_path / "migrated"


def test_script_is_found_in_the_working_folder_as_python_finds_it(tmp_path, monkeypatch):
    folder = write(tmp_path / "work", {"show.py": "import os, sys\nprint(os.getcwd(), sys.path[0])\n"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for where, words in ((folder, ["show.py"]), (elsewhere, ["show.py", "--workdir", str(folder)])):
        exit_code, data = check_json(monkeypatch, where, *words)
        assert data["exit_code"] == 0, data["error"]
        assert data["stdout_tail"] == f"{folder} {folder}"  # cwd and sys.path[0], as `cd work && python show.py`
        assert data["script"] == str(folder / "show.py")
    monkeypatch.chdir(elsewhere)
    missing = CliRunner().invoke(app, ["check", "show.py"])
    assert missing.exit_code == 2 and f"no such script: show.py (in {elsewhere})" in missing.output


@needs_user
def test_a_root_only_project_runs_as_nobody_through_a_view_or_is_refused(tmp_path, monkeypatch):
    project = write(tmp_path / "private", {"train.py": "import os\nprint(os.getuid(), open('notes.txt').read())\n"})
    (project / "notes.txt").write_text("seen")
    for path, mode in ((project / "train.py", 0o600), (project / "notes.txt", 0o600), (project, 0o700)):
        os.chmod(path, mode)
    before = tree_hashes(project)
    exit_code, data = check_json(monkeypatch, project, "train.py")  # the CLI's user may read it all: a view shows it
    assert data["exit_code"] == 0, data["error"]
    assert data["stdout_tail"] == f"{MECH.user[0]} seen"
    assert not any(note.startswith("not sandboxed") for note in data["notes"])
    assert tree_hashes(project) == before
    result = CliRunner().invoke(app, ["check", "train.py", "--allow-unsandboxed"])
    if MECH.sandboxed:  # nothing to allow: it still runs as nobody
        assert result.output.startswith("xlaport check ")


@pytest.mark.slow
@needs_user
def test_nanogpt_layout_checked_from_its_folder(tmp_path, monkeypatch):
    project = nano_project(tmp_path / "nano")
    os.chmod(project, 0o700)  # nobody could not even enter it
    before = tree_hashes(project)
    exit_code, data = check_json(monkeypatch, project, "train.py", "--", "config/x.py", "--max_iters=5")
    assert data["level"] == "L2" and exit_code == 0, (data["reasons"], data["error"])
    assert data["stdout_tail"].splitlines()[-1] == f"uid {MECH.user[0]} iters 5 lr 0.05"
    assert data["steps"] == 5
    assert tree_hashes(project) == before  # the checkpoint went to the run's view, not the folder
    (outputs,) = [note for note in data["notes"] if note.startswith("outputs:")]
    assert f"{project}/out-small/ckpt.pt" in outputs and "discarded" in outputs
    assert not (project / "out-small").exists()


@pytest.mark.slow
@needs_user
def test_trainer_subfolder_checked_from_the_project_and_from_trainer(tmp_path, monkeypatch):
    project = trainer_project(tmp_path / "proj", migrated=True)
    os.chmod(project, 0o700)
    before = tree_hashes(project)
    kept = tmp_path / "kept"
    for where, script in ((project, "trainer/train.py"), (project / "trainer", "train.py")):
        exit_code, data = check_json(monkeypatch, where, script, "--keep-outputs", str(kept))
        assert data["level"] == "L2" and exit_code == 0, (where, data["reasons"], data["error"])
        assert data["steps"] == 8
        assert tree_hashes(project) == before
        (outputs,) = [note for note in data["notes"] if note.startswith("outputs:")]
        assert f"{where}/last_run.txt" in outputs and f"kept in {kept}" in outputs
    assert (kept / "last_run.txt").read_text() == "done" and (kept / "trainer" / "last_run.txt").read_text() == "done"


@pytest.mark.slow
def test_trainer_subfolder_verified_from_outside_and_from_trainer(tmp_path, monkeypatch):
    original = trainer_project(tmp_path / "orig", migrated=False)
    migrated = trainer_project(tmp_path / "mig", migrated=True)
    before = tree_hashes(original), tree_hashes(migrated)
    for where, script in ((tmp_path, "trainer/train.py"), (migrated / "trainer", "train.py")):
        monkeypatch.chdir(where)
        words = ["verify", str(original), str(migrated), "--min-steps", "2", "--format", "json", "--timeout", "300"]
        result = CliRunner().invoke(app, [*words, "--", "python", script])
        data = json.loads(result.output)
        for run in (data["migrated_run"], data["reference_run"]):
            assert run["returncode"] == 0 and run["error"] is None, (where, run)
            assert len(run["curves"]["loss"]["values"]) == 8
        assert data["check"]["level"] == "L2", data["check"]["reasons"]
    assert (tree_hashes(original), tree_hashes(migrated)) == before
