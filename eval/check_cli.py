"""The `xlaport check` command: a thin front over eval/check.py."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Adds the command to the root app."""
