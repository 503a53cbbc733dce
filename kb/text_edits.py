"""A fix as text replacements (lint's JSON and SARIF `fixes`): the smallest spans of the old text that change."""

from __future__ import annotations

import difflib
import os

from .finding import Edit


def text_edits(old: str, new: str) -> tuple[Edit, ...]:
    """The replacements that turn `old` into `new`, in order and not overlapping: the changed lines (difflib),
    each trimmed to the characters that differ, so that a changed argument is one short edit, not a whole line."""
    before, after = old.splitlines(keepends=True), new.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    edits = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        removed, added = "".join(before[i1:i2]), "".join(after[j1:j2])
        head = len(os.path.commonprefix([removed, added]))
        tail = len(os.path.commonprefix([removed[head:][::-1], added[head:][::-1]]))
        start = _position(removed, head, i1 + 1)
        end = _position(removed, len(removed) - tail, i1 + 1)
        edits.append(Edit(*start, *end, added[head : len(added) - tail]))
    return tuple(edits)


def _position(chunk: str, offset: int, first_line: int) -> tuple[int, int]:
    """(line, column), both from 1, of character `offset` of `chunk`, a text that starts at column 1 of `first_line`."""
    lines = chunk[:offset].split("\n")
    return first_line + len(lines) - 1, len(lines[-1]) + 1


def apply_edits(text: str, edits: tuple[Edit, ...] | list[Edit]) -> str:
    """`text` with `edits` (non-overlapping) applied: what a SARIF consumer or an editor does with them."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(line: int, column: int) -> int:
        return starts[min(line - 1, len(starts) - 1)] + column - 1

    for edit in sorted(edits, key=lambda e: (e.line, e.column), reverse=True):
        text = text[: offset(edit.line, edit.column)] + edit.content + text[offset(edit.end_line, edit.end_column) :]
    return text
