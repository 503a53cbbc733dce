"""The `xlaport` command line: a thin front over the library; each area adds its commands here."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)

# what a bug report needs: the versions that decide behaviour, read from metadata (nothing heavy is imported)
ENV_PACKAGES = ("torch", "torch_xla", "torch-tpu", "libcst", "transformers", "accelerate", "peft", "faiss-cpu", "mcp")
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


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Moves CUDA PyTorch code onto TPUs (torch_xla) and proves, with evidence, that behaviour was kept."""


@app.command("env")
def env() -> None:
    """Print what a bug report needs: versions, platform and the settings that change behaviour."""
    lines = [
        f"xlaport: {_version('xlaport') or 'unknown'}",
        f"python: {platform.python_version()} ({sys.executable})",
        f"platform: {platform.platform()}",
    ]
    lines += [f"{name}: {_version(name) or 'not installed'}" for name in ENV_PACKAGES]
    lines += [f"{name}={os.environ[name]}" for name in ENV_VARIABLES if name in os.environ]
    typer.echo("\n".join(lines))


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
