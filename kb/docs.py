"""Entry documentation: dict form (JSON, retrieval) and a Ruff-style page."""

from __future__ import annotations

import inspect
from pathlib import Path

from .rule import CATEGORY_NAMES, Rule

KB_FOLDER = Path(__file__).resolve().parent

FIX_SAFETY = {
    "safe": "Safe: keeps the program's meaning; applied by `xlaport fix` by default.",
    "unsafe": "Unsafe: may change behaviour; applied only with `--unsafe-fixes`. Review the diff.",
    "manual": "Manual: no automatic fix; the message says what to do.",
}


def entry_dict(rule: type[Rule]) -> dict:
    return {
        "code": rule.code,
        "title": rule.title,
        "category": rule.category,
        "category_name": CATEGORY_NAMES[rule.category],
        "fix": rule.fix,
        "autofix": rule.autofix,
        "detects": rule.detects,
        "why": rule.why,
        "before": rule.before,
        "after": rule.after,
        "symptoms": list(rule.symptoms),
        "references": list(rule.references),
    }


def source_of(rule: type[Rule]) -> str:
    """Where the rule is defined, as its repository path and line: `kb/rules/c4_barriers.py:40 (MissingStepBarrier)`.
    Its docstring there says what the short `detects` leaves out."""
    path = Path(inspect.getsourcefile(rule) or "").resolve()
    shown = f"kb/{path.relative_to(KB_FOLDER).as_posix()}" if path.is_relative_to(KB_FOLDER) else str(path)
    return f"{shown}:{inspect.getsourcelines(rule)[1]} ({rule.__name__})"


def render_markdown(rule: type[Rule]) -> str:
    parts = [
        f"# {rule.code}: {rule.title}",
        f"Category: {rule.category} ({CATEGORY_NAMES[rule.category]})",
        f"Source: {source_of(rule)}",
        "## What it detects",
        rule.detects,
        "## Why it matters on TPU",
        rule.why,
    ]
    if rule.symptoms:
        parts += ["## Symptoms", "\n".join(f"- `{s}`" for s in rule.symptoms)]
    parts += ["## Example", "```python", rule.before.rstrip(), "```"]
    if rule.after:
        parts += ["Use instead:", "```python", rule.after.rstrip(), "```"]
    parts += ["## Fix safety", FIX_SAFETY[rule.fix]]
    if rule.references:
        parts += ["## References", "\n".join(f"- {r}" for r in rule.references)]
    return "\n\n".join(parts)
