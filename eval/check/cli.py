"""The `xlaport check` command: a thin front over eval/check/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand

from xlaport.cliutil import EXIT_USAGE, OutputFormat, TargetOption, no_evidence_here
from xlaport.files import module_file

from .crash import Explain

# what names the kb entry behind a crash; the root app passes the kb's (eval never imports kb)
_explain: Explain | None = None


def check(
    script: Annotated[
        Path | None,
        typer.Argument(
            help="The migrated script to run, found as `python SCRIPT` finds it (it is not modified).",
            show_default=False,
        ),
    ] = None,
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
            help="Run in this folder instead of the current one, as `cd DIR && python SCRIPT` would. The run sees "
            "its project (the enclosing git work tree or project folder) through a private view: it may write "
            "there, your files are never changed.",
            show_default=False,
        ),
    ] = None,
    project: Annotated[
        Path | None,
        typer.Option(
            "--project",
            file_okay=False,
            exists=True,
            help="The folder the run may reach with ../ (data, sibling packages) \\[default: the enclosing git work "
            "tree, migrated tree or project folder of the working folder].",
            show_default=False,
        ),
    ] = None,
    keep_outputs: Annotated[
        Path | None,
        typer.Option(
            "--keep-outputs",
            file_okay=False,
            help="Copy the files the run wrote (checkpoints, logs) into this folder; by default they are discarded.",
            show_default=False,
        ),
    ] = None,
    allow_unsandboxed: Annotated[
        bool,
        typer.Option(
            "--allow-unsandboxed",
            help="Where the sandbox cannot run the script as nobody, run it as root instead of refusing "
            "(said in the report's first line).",
        ),
    ] = False,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            help="NAME=VALUE set in the run's environment (repeatable). The run gets only an allowlist of yours "
            "(PATH, LANG, PJRT_*, XLA_*, PYTHON*, ...): what else your program reads (WANDB_MODE=disabled, a "
            "data path) goes here.",
            show_default=False,
        ),
    ] = None,
    module: Annotated[
        str | None,
        typer.Option(
            "-m",
            "--module",
            help="Run a module as `python -m MODULE` does, from the working folder (its sibling packages import); "
            "every argument after it is the module's.",
            show_default=False,
        ),
    ] = None,
    target: TargetOption = "torch_xla",
) -> None:
    """Run SCRIPT under torch_xla and report fallbacks, recompiles, host syncs, NaN and stale optimizers.

    Example: xlaport check train.py --steps-warmup 2 -- --epochs 1; xlaport check -m tools.train -- --epochs 1

    Exit 0 when the run reaches L2 (really ran on XLA), 1 otherwise, 2 on usage errors and refused runs."""
    from ..sandbox import DEFAULT_MEMORY_MB, SandboxRefused, host_memory_mb
    from . import render_text, run_check

    workdir = (workdir or Path.cwd()).resolve()
    if module is not None:  # `xlaport check -m pkg.train a b`: SCRIPT is the module's first argument
        script_args = [*([str(script)] if script is not None else []), *(script_args or [])]
        try:
            script = module_file(workdir, module)
        except (ValueError, FileNotFoundError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
    elif script is None:
        typer.echo(
            "error: name the script to run (xlaport check train.py), or a module (xlaport check -m pkg.train)", err=True
        )
        raise typer.Exit(EXIT_USAGE)
    if not (workdir / script).is_file():  # an absolute SCRIPT stays itself
        typer.echo(f"error: no such script: {script} (in {workdir})", err=True)
        raise typer.Exit(EXIT_USAGE)
    no_evidence_here(target)
    variables = dict(item.partition("=")[::2] for item in env or ())
    if any("=" not in item or not item.partition("=")[0] for item in env or ()):
        typer.echo(f"error: --env takes NAME=VALUE, got {env}", err=True)
        raise typer.Exit(EXIT_USAGE)
    if memory_mb is None:
        memory_mb = min(DEFAULT_MEMORY_MB, host_memory_mb())
    elif memory_mb > host_memory_mb():
        typer.echo(f"error: --memory-mb {memory_mb} is more than this machine has ({host_memory_mb()} MB)", err=True)
        raise typer.Exit(EXIT_USAGE)
    try:
        report = run_check(
            script,
            script_args or (),
            steps_warmup=steps_warmup,
            timeout_s=timeout,
            memory_mb=memory_mb,
            env=variables,
            workdir=workdir,
            project=project,
            reveal=True,  # the user who runs xlaport shows the sandboxed run what this user may read
            allow_unsandboxed=allow_unsandboxed,
            keep_outputs=keep_outputs.resolve() if keep_outputs else None,
            max_steps=max_steps,
            explain=_explain,
            module=module,
        )
    except SandboxRefused as refused:
        typer.echo(f"error: refused: {refused}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    if format is OutputFormat.json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        unsandboxed = [note for note in report.notes if note.startswith("not sandboxed")]
        typer.echo(
            "\n".join(
                [*(f"NOT SANDBOXED: {n.removeprefix('not sandboxed: ')}" for n in unsandboxed), render_text(report)]
            )
        )
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


def register(app: typer.Typer, explain: Explain | None = None) -> None:
    """Adds the command to the root app. `explain`: names the kb entries an error the run died of matches."""
    global _explain
    _explain = explain
    app.command("check", cls=_CheckCommand)(check)
