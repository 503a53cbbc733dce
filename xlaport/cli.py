"""The `xlaport` command line: a thin front over the library; each area adds its commands here."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)


def _register_areas() -> None:
    # each area owns its commands; heavy imports stay inside the command functions
    from xlaport.eval.cli import register as register_eval
    from xlaport.kb.cli import register as register_kb
    from xlaport.serve.cli import register as register_serve
    from xlaport.training.cli import register as register_training

    for register in (register_kb, register_eval, register_serve, register_training):
        register(app)


_register_areas()


def main() -> None:
    app()
