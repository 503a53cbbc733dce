"""What a program run may be given, checked before anything starts: light, so every front can import it."""

from __future__ import annotations

import shlex
from pathlib import Path

MAX_ARGUMENT_BYTES = 131_071  # Linux's MAX_ARG_STRLEN (128 KiB) less the terminating NUL: execve refuses more
MAX_NAME_BYTES = 255  # one file name (a path component) on every Linux file system


def check_arguments(args: list[str]) -> None:
    """ValueError, with the reason, for an argument the program could never be started with."""
    for index, arg in enumerate(args):
        if "\0" in arg:
            raise ValueError(f"argument {index + 1} contains a NUL character, which no program argument can hold")
        size = len(arg.encode("utf-8", "surrogatepass"))
        if size > MAX_ARGUMENT_BYTES:
            raise ValueError(
                f"argument {index + 1} is {size:,} bytes; one argument may have at most {MAX_ARGUMENT_BYTES:,}"
            )


def check_file_name(path: str) -> None:
    """ValueError for a path that no file could have: a NUL, or a name (a component) over 255 bytes."""
    if "\0" in path:
        raise ValueError("the file name contains a NUL character")
    for part in Path(path).parts:
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > MAX_NAME_BYTES:
            raise ValueError(f"a file name is {size:,} bytes; at most {MAX_NAME_BYTES} are allowed: {part[:40]!r}...")


def module_command(command: str) -> tuple[str, list[str]] | None:
    """`python -m tools.train --steps 20` -> ("tools.train", ["--steps", "20"]); None for any other command."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"cannot parse the command {command!r}: {exc}") from None
    if words and Path(words[0]).name.startswith("python") and not words[0].endswith(".py"):
        words = words[1:]
    if len(words) < 2 or words[0] != "-m":
        return None
    check_arguments(words[2:])
    return words[1], words[2:]


def parse_command(command: str) -> tuple[str, list[str]]:
    """`python train.py --steps 20` -> ("train.py", ["--steps", "20"]); the interpreter word is optional."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"cannot parse the command {command!r}: {exc}") from None
    if words and Path(words[0]).name.startswith("python") and not words[0].endswith(".py"):
        words = words[1:]
    if not words or words[0].startswith("-"):
        raise ValueError(f"the command must name a Python script, e.g. 'python train.py --steps 20': {command!r}")
    check_file_name(words[0])
    check_arguments(words[1:])
    return words[0], words[1:]
