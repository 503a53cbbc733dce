"""A finding as users see it (CLI, JSON, HTTP, MCP) and a file's fix result: plain data, below the analysis and
the rules that make them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Category = Literal["C1", "C2", "C3", "C4", "C5", "C6", "C7"]
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
