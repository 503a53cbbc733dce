"""A finding as users see it (CLI, JSON, HTTP, MCP) and a file's fix result: plain data, below the analysis and
the rules that make them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Category = Literal["C1", "C2", "C3", "C4", "C5", "C6", "C7"]
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


@dataclass
class FixResult:
    path: str
    source: str
    fixed: str
    applied: list[Finding] = field(default_factory=list)
    remaining: list[Finding] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.fixed != self.source
