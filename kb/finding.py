"""A finding as every front shows it, and the applicability of a fix: light (no libcst), so the fronts' result
types load without the rules (a starting MCP server answers sooner)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Applicability = Literal["safe", "unsafe", "manual"]


@dataclass(frozen=True)
class Finding:
    """A detection as users see it (CLI, JSON, HTTP, MCP)."""

    path: str
    line: int
    column: int
    code: str
    category: str
    title: str
    message: str
    fix: Applicability
    fixable: bool = False  # a rewrite exists for this occurrence

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "code": self.code,
            "category": self.category,
            "title": self.title,
            "message": self.message,
            "fix": self.fix,
            "fixable": self.fixable,
        }
