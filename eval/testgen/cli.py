"""The `xlaport testgen` command: a thin front over eval/testgen/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from xlaport.cliutil import EXIT_FAILED, EXIT_USAGE
from xlaport.cliutil import OutputFormat as Format


def render_result(result) -> str:
    """The generation summary a person reads: tests written, targets not driven and why."""
    lines = [f"wrote {len(result.tests)} differential test(s) to {result.out}"]
    for test in result.tests:
        lines.append(f"  {test.test_file}::{test.test_name}  {test.target} ({test.kind}, {test.inputs_from} inputs)")
    if result.undrivable:
        lines.append(f"not driven ({len(result.undrivable)}):")
        lines += [f"  {u.source}: {u.target}: {u.reason}" for u in result.undrivable]
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)


def render_run(run) -> str:
    lines = [
        f"{run.passed} passed, {run.failed} failed"
        + (f", {run.errors} error(s)" if run.errors else "")
        + f" in {run.wall_s:.1f} s"
    ]
    if run.timed_out:
        lines.append("the test run timed out")
    for failure in run.failures:
        lines.append(f"FAILED {failure.test}\n  " + failure.message.replace("\n", "\n  "))
    if not run.ok and not run.failures:
        lines.append(run.output_tail)
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Adds the command to the root app."""

    @app.command()
    def testgen(
        original: Annotated[Path, typer.Argument(help="The original (CUDA) file or project; only read.")],
        migrated: Annotated[Path, typer.Argument(help="Its migration: a file, or a tree mirroring the original.")],
        out: Annotated[Path, typer.Option("--out", help="Folder for the generated tests.")] = Path("xlaport_tests"),
        record: Annotated[
            str | None,
            typer.Option(
                "--record",
                help='A driver command whose first calls become the inputs, e.g. "python train.py --steps 3" (run on a copy of ORIGINAL under the CUDA→CPU shim).',
            ),
        ] = None,
        all_public: Annotated[
            bool, typer.Option("--all", help="Test every public function and module, not only the changed ones.")
        ] = False,
        changed_files: Annotated[
            bool,
            typer.Option(
                "--changed-files", help="Test every public function and module of each file the migration changed."
            ),
        ] = False,
        run: Annotated[
            bool, typer.Option("--run", help="Run the generated tests afterwards; exit 1 if any fails.")
        ] = False,
        format: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.text,
    ) -> None:
        """Generate differential unit tests: ORIGINAL on the CPU (CUDA mapped to CPU) vs MIGRATED on XLA."""
        from . import TestgenError, generate_tests, run_generated_tests

        try:
            result = generate_tests(
                original, migrated, out, record=record, all_public=all_public, changed_files=changed_files
            )
        except TestgenError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        test_run = run_generated_tests(out, trees=[original, migrated]) if run and result.tests else None
        if format is Format.json:
            data = {"generation": result.to_dict(), "run": test_run.to_dict() if test_run else None}
            typer.echo(json.dumps(data, indent=2))
        else:
            typer.echo(render_result(result))
            if test_run is not None:
                typer.echo(render_run(test_run))
        raise typer.Exit(EXIT_FAILED if test_run is not None and not test_run.ok else 0)
