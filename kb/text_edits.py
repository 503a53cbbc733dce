"""A fix as text replacements (lint's JSON and SARIF `fixes`): the smallest spans of the old text that change."""

from __future__ import annotations

import difflib
import os

from .finding import Edit


def text_edits(old: str, new: str) -> tuple[Edit, ...]:
    """The replacements that turn `old` into `new`, in order and not overlapping: the changed lines (difflib),
    each trimmed to the characters that differ, so that a changed argument is one short edit, not a whole line."""
    before, after = old.splitlines(keepends=True), new.splitlines(keepends=True)
    edits = []
    for tag, i1, i2, j1, j2 in _line_opcodes(before, after):
        if tag == "equal":
            continue
        removed, added = "".join(before[i1:i2]), "".join(after[j1:j2])
        head = len(os.path.commonprefix([removed, added]))
        tail = len(os.path.commonprefix([removed[head:][::-1], added[head:][::-1]]))
        start = _position(removed, head, i1 + 1)
        end = _position(removed, len(removed) - tail, i1 + 1)
        edits.append(Edit(*start, *end, added[head : len(added) - tail]))
    return tuple(edits)


def _line_opcodes(before: list[str], after: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib's opcodes of `before` -> `after` (autojunk off), matched only between the lines that differ when
    that gives the same opcodes. A rewrite changes a few lines of a long module, and difflib's first search of
    the whole texts costs (lines x repeats of each line): most of a finding's edits in a module of thousands.

    Same opcodes: with P and S the longest common head and tail and X, Y the middles of `before` and `after`,
    when no line of X or Y is a line of P or S, a matching block is either P's or S's own diagonal (which no
    other block outgrows or, starting first, ties), shorter than them within P or S, or within X and Y. Each
    search of difflib then takes P or S whole, leaving the X, Y part of its range as it was, or the same block of
    X and Y that difflib on X and Y alone takes: the blocks, so the opcodes, are the same."""
    head = 0
    most = min(len(before), len(after))
    while head < most and before[head] == after[head]:
        head += 1
    tail = 0
    while tail < most - head and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    changed = set(before[head : len(before) - tail]) | set(after[head : len(after) - tail])
    kept = before[:head] + before[len(before) - tail :]
    if not changed or not changed.isdisjoint(kept):
        return difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    middle = difflib.SequenceMatcher(
        None, before[head : len(before) - tail], after[head : len(after) - tail], autojunk=False
    ).get_opcodes()
    found = [("equal", 0, head, 0, head)] if head else []
    found += [(tag, i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2 in middle]
    if tail:
        found.append(("equal", len(before) - tail, len(before), len(after) - tail, len(after)))
    return found


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
