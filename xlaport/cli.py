"""The `xlaport` command line: a thin front over the library; each area adds its commands here."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Annotated

import typer

from xlaport.cliutil import EXIT_USAGE
from xlaport.extras import EXTRA_MODULES, extra_of_module, install_hint, missing_extra_message, missing_modules

HELP = __doc__

# what a bug report needs: the versions that decide behaviour, read from metadata (nothing heavy is imported)
ENV_PACKAGES = ("torch", "torch_xla", "torch-tpu", "libcst", "transformers", "accelerate", "peft", "numpy", "mcp")
ENV_VARIABLES = (
    "PJRT_DEVICE",
    "XLA_FLAGS",
    "PT_XLA_DEBUG_LEVEL",
    "XLAPORT_CACHE_DIR",
    "XLAPORT_MODEL",
    "XDG_CACHE_HOME",
)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"xlaport {_version('xlaport') or 'unknown'}")
        raise typer.Exit()


def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Moves CUDA PyTorch code onto TPUs (torch_xla) and proves, with evidence, that behaviour was kept."""


def env() -> None:
    """Print what a bug report needs: versions, platform and the settings that change behaviour."""
    lines = [
        f"xlaport: {_version('xlaport') or 'unknown'}",
        f"python: {platform.python_version()} ({sys.executable})",
        f"platform: {platform.platform()}",
    ]
    lines += [f"{name}: {_version(name) or 'not installed'}" for name in ENV_PACKAGES]
    for extra in EXTRA_MODULES:  # which optional parts work here (xlaport/extras.py)
        missing = missing_modules(extra)
        lines.append(f"extra [{extra}]: {'missing ' + ', '.join(missing) if missing else 'installed'}")
    lines += [f"{name}={os.environ[name]}" for name in ENV_VARIABLES if name in os.environ]
    typer.echo("\n".join(lines))


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
    _add_serve: ("migrate", "optimize", "suggest", "serve", "mcp"),
    _add_training: ("train",),
}


def build_app(command: str | None = None) -> typer.Typer:
    """The root app: every area's commands, or, when `command` is one an area owns, that area's only.

    Mounting an area imports its command modules: all four cost ~0.1 s of CPU, a third of `xlaport kb
    search`'s start-up and of a stdio MCP server's."""
    app = typer.Typer(no_args_is_help=True, add_completion=False, help=HELP)
    app.callback()(root)
    app.command("env")(env)
    owners = [add for add, names in AREAS.items() if command in names] or list(AREAS)
    for add in owners:
        add(app)
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
    missing = missing_extra_message(arguments)
    if missing:
        typer.echo(f"error: {missing}", err=True)
        raise SystemExit(EXIT_USAGE)
    try:
        build_app(arguments[0] if arguments else None)()
    except ModuleNotFoundError as exc:  # a command's optional part, reached in a way extras_for does not foresee
        extras = extra_of_module((exc.name or "").partition(".")[0])
        if not extras:
            raise
        hints = " or ".join(install_hint([extra]) for extra in extras)
        typer.echo(f"error: {exc}: it is an optional part of xlaport ({hints})", err=True)
        raise SystemExit(EXIT_USAGE) from None
