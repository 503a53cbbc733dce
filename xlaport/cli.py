"""The `xlaport` command line: a thin front over the library; each area adds its commands here."""

from __future__ import annotations

import sys
from collections.abc import Callable

import typer

HELP = __doc__


# each area owns its commands; heavy imports stay inside the command functions
def _add_kb(app: typer.Typer) -> None:
    from xlaport.kb.cli import register

    register(app)


def _add_eval(app: typer.Typer) -> None:
    from xlaport.eval.cli import register

    register(app)


def _add_serve(app: typer.Typer) -> None:
    from xlaport.serve.cli import register

    register(app)


def _add_training(app: typer.Typer) -> None:
    from xlaport.training.cli import register

    register(app)


# area -> the top-level commands it adds (tests/test_cli.py checks that they match what each area registers)
AREAS: dict[Callable[[typer.Typer], None], tuple[str, ...]] = {
    _add_kb: ("lint", "fix", "kb"),
    _add_eval: ("check", "testgen", "verify"),
    _add_serve: ("migrate", "suggest", "serve", "mcp"),
    _add_training: ("train",),
}


def build_app(command: str | None = None) -> typer.Typer:
    """The root app: every area's commands, or, when `command` is one an area owns, that area's only.

    Mounting an area imports its command modules: all four cost ~0.1 s of CPU, a third of `xlaport kb
    search`'s start-up and of a stdio MCP server's."""
    app = typer.Typer(no_args_is_help=True, add_completion=False, help=HELP)
    owners = [add for add, names in AREAS.items() if command in names] or list(AREAS)
    for add in owners:
        add(app)
    if len(owners) == 1:
        # keeps the root a group with one area mounted (typer runs a lone command as the root itself)
        app.callback()(lambda: None)
    return app


def __getattr__(name: str) -> typer.Typer:
    """`app`, with every command, built on first use (tests and tools import it; `main` builds its own)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    app = build_app()
    globals()["app"] = app
    return app


def main() -> None:
    arguments = sys.argv[1:]
    build_app(arguments[0] if arguments else None)()
