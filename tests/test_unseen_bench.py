"""bench/zero_edit.py's fixes/manual columns: the program's own script from the migration report, the tree's from
the summary, and never a silent 0 when the summary cannot be read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from zero_edit import ProgramResult, _count_migration  # noqa: E402


def test_counts_are_the_scripts_and_the_trees(tmp_path):
    report = tmp_path / "xlaport-report.json"
    files = [
        {"path": "lessons/train.py", "codes_applied": ["XLA201", "XLA201", "XLA406"], "manual": [{}, {}]},
        {"path": "lessons/other.py", "codes_applied": ["XLA201"], "manual": []},
    ]
    report.write_text(json.dumps({"files": files}))
    summary = json.dumps({"fixes_applied": {"XLA201": 3, "XLA406": 1}, "findings_left": {"XLA401": 2}})
    result = ProgramResult("owner/repo", "lessons/train.py")
    _count_migration(summary, report, "lessons/train.py", result)
    assert (result.fixes, result.manual, result.tree_fixes, result.tree_manual) == (3, 2, 4, 2)


def test_an_unreadable_summary_is_unknown_not_zero(tmp_path):
    result = ProgramResult("owner/repo", "train.py")
    _count_migration("progress bar\n{", tmp_path / "missing.json", "train.py", result)
    assert (result.fixes, result.manual, result.tree_fixes, result.tree_manual) == (-1, -1, -1, -1)


def test_synthetic_folders_are_trusted_and_others_checked_as_before(tmp_path):
    from synthetic_trust import trusting
    from unseen_data import cifar10

    cifar10(tmp_path / "data", per_batch=4)
    batch = tmp_path / "data" / "cifar-10-batches-py" / "data_batch_1"
    calls = []

    def real_check(fpath, md5=None):
        calls.append(fpath)
        return False  # the md5 of a synthetic file never matches the real data set's

    check = trusting(real_check)
    assert check(str(batch), "c99cafc152244af753f735de768cd75f")
    assert not check(str(batch.parent / "data_batch_9"), "0" * 32)  # trusted folder, missing file
    elsewhere = tmp_path / "real.bin"
    elsewhere.write_bytes(b"x")
    assert not check(str(elsewhere), "0" * 32) and calls == [str(elsewhere)]


def test_a_program_with_a_module_is_checked_as_python_m_runs_it(tmp_path, monkeypatch):
    import subprocess

    import unseen

    seen = {}

    def fake_run(command, cwd, **kwargs):
        seen["command"], seen["cwd"] = command, cwd
        return subprocess.CompletedProcess(command, 0, stdout="{}", stderr="")

    monkeypatch.setattr(unseen.subprocess, "run", fake_run)
    program = unseen.Program(repo="o/r", script="tools/train.py", module="tools.train", args=["--epochs", "1"])
    assert unseen.check_report("python", tmp_path, program) == ({}, None)
    command = seen["command"]
    assert command[command.index("-m", 3) + 1] == "tools.train" and "tools/train.py" not in command
    assert command[-3:] == ["--", "--epochs", "1"] and seen["cwd"] == tmp_path / "."
    plain = unseen.Program(repo="o/r", script="tools/train.py")
    unseen.check_report("python", tmp_path, plain)
    assert "tools/train.py" in seen["command"] and "tools.train" not in seen["command"]
