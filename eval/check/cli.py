"""The `xlaport check` command: a thin front over eval/check/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand

from xlaport.cliutil import EXIT_USAGE, OutputFormat


def check(
    script: Annotated[Path, typer.Argument(help="The migrated script to run (it is not modified).")],
    script_args: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the script; put them after `--`.", show_default=False)
    ] = None,
    steps_warmup: Annotated[
        int,
        typer.Option("--steps-warmup", min=0, help="Steps allowed to compile (graph without/with optimizer state)."),
    ] = 2,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds before the run is killed.")] = 600,
    max_steps: Annotated[
        int | None,
        typer.Option(
            "--max-steps",
            min=1,
            help="Stop the script cleanly after this many steps and grade them (for scripts that loop for hours).",
            show_default=False,
        ),
    ] = None,
    memory_mb: Annotated[
        int | None,
        typer.Option(
            "--memory-mb",
            min=64,
            help="Memory limit of the run's whole process tree, at most the host's (default: 8192 or the host's if less).",
            show_default=False,
        ),
    ] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="Report format.")] = OutputFormat.text,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            file_okay=False,
            exists=True,
            help="Run in this folder (where relative data paths resolve; the script may write there) "
            "instead of a fresh temporary one. Run as root, the sandbox user must be able to write it, "
            "else the run keeps your user and is reported as not sandboxed.",
        ),
    ] = None,
) -> None:
    """Run SCRIPT under torch_xla and report fallbacks, recompiles, host syncs, NaN and stale optimizers.

    Example: xlaport check train.py --steps-warmup 2 -- --epochs 1

    Exit 0 when the run reaches L2 (really ran on XLA), 1 otherwise, 2 on usage errors."""
    from ..sandbox import DEFAULT_MEMORY_MB, host_memory_mb
    from . import render_text, run_check

    if not script.is_file():
        typer.echo(f"error: no such script: {script}", err=True)
        raise typer.Exit(EXIT_USAGE)
    if memory_mb is None:
        memory_mb = min(DEFAULT_MEMORY_MB, host_memory_mb())
    elif memory_mb > host_memory_mb():
        typer.echo(f"error: --memory-mb {memory_mb} is more than this machine has ({host_memory_mb()} MB)", err=True)
        raise typer.Exit(EXIT_USAGE)
    report = run_check(
        script,
        script_args or (),
        steps_warmup=steps_warmup,
        timeout_s=timeout,
        memory_mb=memory_mb,
        workdir=workdir,
        max_steps=max_steps,
    )
    if format is OutputFormat.json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        typer.echo(render_text(report))
    raise typer.Exit(0 if report.ok else 1)


class _CheckCommand(TyperCommand):
    """Appends what the sandbox guarantees on this machine, probed when the help is shown."""

    def format_help(self, ctx, formatter) -> None:
        from ..sandbox import sandbox_status

        super().format_help(ctx, formatter)
        status = sandbox_status()
        title = "Sandbox (all mechanisms hold)" if status.sandboxed else "NOT sandboxed (mechanisms refused here)"
        lines = [f"- {line}" for line in status.guarantees()] + [f"- refused: {line}" for line in status.refused]
        with formatter.section(title):
            for line in lines:
                formatter.write_text(line)


def register(app: typer.Typer) -> None:
    """Adds the command to the root app."""
    app.command("check", cls=_CheckCommand)(check)
