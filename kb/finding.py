"""A finding as every front shows it, and the applicability of a fix: light (no libcst), so the fronts' result
types load without the rules (a starting MCP server answers sooner)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Applicability = Literal["safe", "unsafe", "manual"]


@dataclass(frozen=True)
class Edit:
    """One text replacement of a fix: the characters from (line, column) up to, not including, (end_line,
    end_column) become `content`. Lines and columns count from 1, columns in characters (code points)."""

    line: int
    column: int
    end_line: int
    end_column: int
    content: str

    def to_dict(self) -> dict:
        return {
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "content": self.content,
        }


@dataclass(frozen=True)
class Finding:
    """A detection as users see it (CLI, JSON, HTTP, MCP). `end_line`/`end_column`: where the reported code ends
    (exclusive, columns from 1; None when unknown); `edits`: this finding's own fix as text replacements, filled in
    only when asked (`lint_source(..., edits=True)`: lint's JSON and SARIF)."""

    path: str
    line: int
    column: int
    code: str
    category: str
    title: str
    message: str
    fix: Applicability
    fixable: bool = False  # a rewrite exists for this occurrence
    end_line: int | None = None
    end_column: int | None = None
    edits: tuple[Edit, ...] = ()

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
            "end_line": self.end_line,
            "end_column": self.end_column,
        }
