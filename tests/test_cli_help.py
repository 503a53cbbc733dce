"""`--help` shows every help text whole: rich markup reads `[default: ...]` as a tag and drops it unless escaped."""

from __future__ import annotations

import re

import click
import pytest
import typer
from typer.testing import CliRunner

from xlaport.cli import app

BRACKETED = re.compile(r"\[[^\]]*\]")
BOX = re.compile(r"[│╭╮╰╯─]")


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    """(the words that name it, the command) for every command under `group`."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def _flat(text: str) -> str:
    return " ".join(BOX.sub(" ", text).split())


def _shown(help_text: str) -> list[str]:
    """The bracketed parts of a help text as a reader must see them (rich's `\\[` escape shows `[`)."""
    return [_flat(part) for part in BRACKETED.findall(help_text.replace("\\[", "["))]


ROOT = typer.main.get_command(app)
WITH_BRACKETS = [
    (words, param.name, part)
    for words, command in _commands(ROOT)
    for param in command.params
    for part in _shown(getattr(param, "help", None) or "")
]


def test_some_help_texts_have_brackets():
    """The test below checks something: -j's default, among others, is written in brackets."""
    assert (("lint",), "jobs", "[default: 0, one per core for 8+ files; 1: none]") in WITH_BRACKETS
    assert len(WITH_BRACKETS) >= 5


@pytest.mark.parametrize(
    ("words", "param", "part"), WITH_BRACKETS, ids=lambda v: "-".join(v) if isinstance(v, tuple) else v
)
def test_help_shows_bracketed_text(words: tuple[str, ...], param: str, part: str):
    result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0, result.output
    assert part in _flat(result.output), f"{' '.join(words)} --help lost {part!r} of --{param}'s help"
