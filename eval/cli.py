"""`xlaport` commands of the validation area; `register` adds them to the root app."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Adds `check`, `testgen` and `verify` (each owned by its own module) to the root app."""
    from .check.cli import register as register_check
    from .testgen.cli import register as register_testgen
    from .verify.cli import register as register_verify

    for add in (register_check, register_testgen, register_verify):
        add(app)
