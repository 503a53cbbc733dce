"""One file's text: whether it parses (without crashing the process) and its diff."""

from __future__ import annotations

import difflib

from xlaport.kb import SourceError


def compile_or_raise(source: str, name: str) -> None:
    """Raises SourceError when `source` is not valid Python.

    CPython's own compiler goes first: it refuses pathological nesting (a few thousand brackets or
    operators) with an error, where libcst's native parser crashes the whole process.
    """
    try:
        compile(source, name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise SourceError(f"cannot parse: {exc.msg} (line {exc.lineno})") from None
    except (RecursionError, MemoryError):
        raise SourceError("cannot parse: the source is nested too deeply") from None
    except ValueError as exc:  # e.g. NUL bytes
        raise SourceError(f"cannot parse: {exc}") from None


def unified_diff(original: str, migrated: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True), migrated.splitlines(keepends=True), f"a/{path}", f"b/{path}"
        )
    )
