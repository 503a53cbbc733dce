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
        return _Matcher(before, after).get_opcodes()
    middle = _Matcher(before[head : len(before) - tail], after[head : len(after) - tail]).get_opcodes()
    found = [("equal", 0, head, 0, head)] if head else []
    found += [(tag, i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2 in middle]
    if tail:
        found.append(("equal", len(before) - tail, len(before), len(after) - tail, len(after)))
    return found


MIN_SAMPLED_RUN = 16  # a common run shorter than this: difflib's own search (cheap on so few lines)


class _Matcher(difflib.SequenceMatcher):
    """difflib's SequenceMatcher of two line lists (no junk, autojunk off), with its longest-match search done by
    sampling where a long common run is known: the same matches, the same opcodes. difflib's search visits every
    pair of equal lines in the range (blank lines, `)`: thousands of pairs in a long module, for each finding's
    edits); a rewrite leaves long runs on one diagonal between the lines it changed (an added import shifts the
    rest by one).

    The search: `lower`, the longest run of equal lines on the two diagonals through the range's corners, is a
    lower bound of the longest match. Every match at least that long contains one of the lines of `a` at every
    `lower`-th place of the range, so extending each pair (sampled line of `a`, equal line of `b`) to its whole
    match finds all of them; difflib's answer is the longest, the first in `a`, then in `b` (its documented
    choice; with no junk its search returns exactly that)."""

    def __init__(self, a: list[str], b: list[str]) -> None:
        super().__init__(None, a, b, autojunk=False)

    def find_longest_match(self, alo: int = 0, ahi: int | None = None, blo: int = 0, bhi: int | None = None):  # noqa: ANN201  (difflib.Match)
        a, b = self.a, self.b
        ahi = len(a) if ahi is None else ahi
        bhi = len(b) if bhi is None else bhi
        if min(ahi - alo, bhi - blo) < 2 * MIN_SAMPLED_RUN:
            return super().find_longest_match(alo, ahi, blo, bhi)
        lower = max(
            _diagonal_run(a, b, alo, ahi, blo, bhi, blo - alo), _diagonal_run(a, b, alo, ahi, blo, bhi, bhi - ahi)
        )
        if lower < MIN_SAMPLED_RUN:
            return super().find_longest_match(alo, ahi, blo, bhi)
        best_i, best_j, best_k = alo, blo, 0
        ends: dict[int, int] = {}  # diagonal (j - i) -> where in `a` the last match found on it ends
        for p in range(alo + lower - 1, ahi, lower):
            for j in self.b2j.get(a[p], ()):
                if j < blo:
                    continue
                if j >= bhi:
                    break
                if ends.get(j - p, -1) > p:
                    continue  # within a match found from an earlier sampled line
                i0, j0 = p, j
                while i0 > alo and j0 > blo and a[i0 - 1] == b[j0 - 1]:
                    i0, j0 = i0 - 1, j0 - 1
                i1, j1 = p + 1, j + 1
                while i1 < ahi and j1 < bhi and a[i1] == b[j1]:
                    i1, j1 = i1 + 1, j1 + 1
                ends[j - p] = i1
                if i1 - i0 > best_k or i1 - i0 == best_k and (i0, j0) < (best_i, best_j):
                    best_i, best_j, best_k = i0, j0, i1 - i0
        return difflib.Match(best_i, best_j, best_k)


def _diagonal_run(a: list[str], b: list[str], alo: int, ahi: int, blo: int, bhi: int, offset: int) -> int:
    """The longest run of a[i] == b[i + offset] within the range."""
    longest = run = 0
    for i in range(max(alo, blo - offset), min(ahi, bhi - offset)):
        if a[i] == b[i + offset]:
            run += 1
            longest = max(longest, run)
        else:
            run = 0
    return longest


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
