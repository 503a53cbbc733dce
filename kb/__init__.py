"""The fix knowledge base: one libcst rule per migration fix, the engine that runs them, retrieval.

The names below load on first use (PEP 562), so that importing a light module of the package (`kb/cli.py`,
which every `xlaport` invocation imports) does not load libcst and every rule.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import FixResult, all_rules, fix_source, get_rule, lint_source, select_rules
    from .finding import Finding
    from .parsing import SourceError
    from .rule import CATEGORY_NAMES, Rule

_HOME = {
    "CATEGORY_NAMES": "rule",
    "Finding": "finding",
    "Rule": "rule",
    "FixResult": "engine",
    "SourceError": "parsing",
    "all_rules": "engine",
    "fix_source": "engine",
    "get_rule": "engine",
    "lint_source": "engine",
    "select_rules": "engine",
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
    # the engine lists the rules, those about config files and run scripts too; Finding, Rule and SourceError
    # need neither configs nor the rules (nor libcst's matchers: ~1.5 s of CPU for a starting MCP server)
    if _HOME[name] == "engine":
        import_module(".configs", __name__)
    value = getattr(import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value
