"""The fix knowledge base: one libcst rule per migration fix, the engine that runs them, retrieval."""

from . import configs  # noqa: F401  (registers the entries about config files and run scripts)
from .engine import FixResult, SourceError, all_rules, fix_source, get_rule, lint_source, select_rules
from .rule import CATEGORY_NAMES, Finding, Rule

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
