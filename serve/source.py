"""A unified diff of one file's text (patches, reports and trace records)."""

from __future__ import annotations

import difflib


def unified_diff(original: str, migrated: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True), migrated.splitlines(keepends=True), f"a/{path}", f"b/{path}"
        )
    )
