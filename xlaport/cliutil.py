"""What every `xlaport` command shares: exit codes, output formats, usage errors, code lists."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from xlaport.targets import check_target, evidence_note

EXIT_OK = 0
EXIT_FAILED = 1  # findings, a rejected migration, a failed check
EXIT_USAGE = 2  # bad arguments or input; nothing was done


# the options the commands that fix code share (lint, fix, migrate, suggest): one spelling, one help text
UnsafeFixesOption = Annotated[bool, typer.Option("--unsafe-fixes", help="Also apply fixes that may change behaviour.")]
SelectOption = Annotated[list[str] | None, typer.Option(help="Codes, code prefixes or categories (C1..C7).")]
IgnoreOption = Annotated[list[str] | None, typer.Option(help="Codes, prefixes or categories to skip.")]
TargetOption = Annotated[
    str, typer.Option("--target", help="The backend to migrate to: torch_xla or torch_tpu (docs/torchtpu.md).")
]
# the lint configuration ([tool.xlaport], kb/lint_config.py) that lint, fix and migrate read
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="The configuration file (pyproject.toml with a tool.xlaport table, or xlaport.toml); default: the nearest above the paths.",
    ),
]
IsolatedOption = Annotated[bool, typer.Option("--isolated", help="Read no configuration file.")]
# tri-state: None leaves the choice to the configuration's `unsafe-fixes`
ConfiguredUnsafeOption = Annotated[
    bool | None,
    typer.Option(
        "--unsafe-fixes/--no-unsafe-fixes",
        help="Also apply fixes that may change behaviour (default: the configuration's unsafe-fixes, else no).",
    ),
]


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


class LintFormat(StrEnum):
    text = "text"
    json = "json"
    sarif = "sarif"


def fail_usage(message: str) -> NoReturn:
    """Prints `error: message` on stderr and exits with EXIT_USAGE."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


def split_codes(values: list[str] | None) -> list[str] | None:
    """`["XLA2,C4", "XLA101"]` -> `["XLA2", "C4", "XLA101"]`; None when nothing was given."""
    if not values:
        return None
    return [c.strip() for v in values for c in v.split(",") if c.strip()]


def no_evidence_here(target: str, exit_code: int = 1) -> None:
    """Stops `check`/`verify` with the reason when `target` cannot run on this machine (xlaport/targets.py): such a
    migration stays unvalidated, never passed. Returns when the target runs here."""
    try:
        note = evidence_note(check_target(target))
    except KeyError as exc:
        fail_usage(str(exc.args[0]))
    if note is not None:
        typer.echo(f"{note}: nothing was run; the migration is unvalidated", err=True)
        raise typer.Exit(exit_code)
