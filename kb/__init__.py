"""The fix knowledge base: one libcst rule per migration fix, the engine that runs them, retrieval.

The names below load on first use (PEP 562), so that importing a light module of the package (`kb/cli.py`,
which every `xlaport` invocation imports) does not load libcst and every rule.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import fix_source, lint_source
    from .finding import Finding, FixResult
    from .parsing import SourceError
    from .registry import all_rules, get_rule, select_rules
    from .rule import CATEGORY_NAMES, Rule

_HOME = {
    "CATEGORY_NAMES": "rule",
    "Finding": "finding",
    "Rule": "rule",
    "FixResult": "finding",
    "SourceError": "parsing",
    "all_rules": "registry",
    "fix_source": "engine",
    "get_rule": "registry",
    "lint_source": "engine",
    "select_rules": "registry",
}
__all__ = [
    "CATEGORY_NAMES",
    "Finding",
    "FixResult",
    "Rule",
    "SourceError",
    "all_rules",
    "fix_source",
    "get_rule",
    "lint_source",
    "select_rules",
]


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Finding, Rule and SourceError load neither the registry's rules nor libcst's matchers (~1.5 s of CPU for a
    # starting MCP server); the engine and the registry load every rule, kb/registry.py lists them
    value = getattr(import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value
