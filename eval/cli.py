"""`xlaport` commands of the validation area; `register` adds them to the root app."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from .check.crash import Explain


def register(app: typer.Typer, explain: Explain | None = None) -> None:
    """Adds `check`, `testgen` and `verify` (each owned by its own module) to the root app. `explain`: names the kb
    entries behind a crash in `check`'s reasons (eval never imports the kb; the root app passes it)."""
    from .check.cli import register as register_check
    from .testgen.cli import register as register_testgen
    from .verify.cli import register as register_verify

    register_check(app, explain)
    for add in (register_testgen, register_verify):
        add(app)
