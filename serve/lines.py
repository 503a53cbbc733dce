"""Line numbers in the original file's coordinates: findings left after the fixes are found in the migrated text,
but every item a front returns (applied fixes, items left for a human) must point into the file the user has."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable

from .results import ManualItem


def to_original_lines(original: str, migrated: str) -> Callable[[int], int]:
    """A map from a 1-based line of `migrated` to the line of `original` it came from: the same line where it is
    unchanged, the first line of the block it replaced where it was rewritten, and the line after where it was
    inserted (an added import sits before the original line it precedes)."""
    if original == migrated:
        return lambda line: line
    old, new = original.splitlines(), migrated.splitlines()
    mapping: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        for j in range(b0, b1):
            if tag == "equal":
                mapping[j + 1] = a0 + (j - b0) + 1
            elif tag == "replace":
                mapping[j + 1] = a0 + min(j - b0, a1 - a0 - 1) + 1
            else:  # inserted
                mapping[j + 1] = min(a0 + 1, max(len(old), 1))
    return lambda line: mapping.get(line, min(line, max(len(old), 1)))


def in_original_lines(manual: list[ManualItem], original: str, migrated: str) -> list[ManualItem]:
    """Items found in `migrated` with `finding.line` in `original`'s numbering; `migrated_line` keeps the other."""
    original_line = to_original_lines(original, migrated)
    return [
        item.model_copy(
            update={
                "finding": dataclasses.replace(
                    item.finding,
                    line=original_line(item.finding.line),
                    end_line=original_line(item.finding.end_line) if item.finding.end_line else None,
                ),
                "migrated_line": item.finding.line,
            }
        )
        for item in manual
    ]
