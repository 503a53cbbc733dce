"""Where a migration's time goes (serve/phases.py) and the progress `migrate` shows on a terminal, and only there."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner
from xlaport.serve.cli import ProgressBar
from xlaport.serve.phases import PhaseTimer

from xlaport.cli import app


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def phase(self, name: str, step: str | None = None) -> None:
        self.events.append((name, step))

    def files(self, done: int, total: int, path: str) -> None:
        self.events.append(("files", done, total))


def test_phases_and_their_steps_are_timed_in_order_and_announced():
    listener = Recorder()
    timer = PhaseTimer(listener)
    timer.start("rewrite")
    timer.files(1, 2, "a.py")
    timer.start("verify")
    timer.step("the migrated run")
    timer.step("the original's run")
    timer.start("reports")
    timer.stop()
    timer.stop()  # nothing running: nothing recorded
    assert [(t.phase, t.name) for t in timer.timings] == [
        (None, "rewrite"),
        (None, "verify"),
        ("verify", "the migrated run"),
        ("verify", "the original's run"),
        (None, "reports"),
    ]
    assert all(t.seconds >= 0 for t in timer.timings)
    assert listener.events == [
        ("rewrite", None),
        ("files", 1, 2),
        ("verify", None),
        ("verify", "the migrated run"),
        ("verify", "the original's run"),
        ("reports", None),
    ]


def test_the_progress_display_leaves_each_finished_phase_on_a_terminal():
    out = io.StringIO()
    with ProgressBar(Console(file=out, force_terminal=True, width=100, color_system=None)) as bar:
        bar.phase("rewrite")
        bar.files(1, 3, "a.py")
        bar.phase("verify", "the migrated run")
        bar.phase("verify", "the original's run")
    shown = out.getvalue()
    assert "✓ rewrite" in shown and "✓ verify" in shown and shown.count("✓ verify") == 1


def test_the_progress_display_is_silent_off_a_terminal():
    out = io.StringIO()
    with ProgressBar(Console(file=out, force_terminal=False)) as bar:
        bar.phase("rewrite")
        bar.files(1, 3, "a.py")
        bar.phase("verify", "the migrated run")
    assert out.getvalue() == ""


def test_migrate_prints_no_progress_into_a_pipe(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("import torch\n\nx = torch.zeros(2).cuda()\n")
    result = CliRunner().invoke(app, ["migrate", str(src), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "✓" not in result.output and "━" not in result.output
