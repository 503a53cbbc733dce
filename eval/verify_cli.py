"""The `xlaport verify` command: a thin front over eval/verify.py."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Adds the command to the root app."""
