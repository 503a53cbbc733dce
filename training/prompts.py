"""The fine-tuning prompt: retrieved fixes + import context + the original function → the migrated function.

    <|fixes|># XLA201: title / # before: ... / # after: ...<|context|>import torch
    <|original|>def f(...): ...<|migrated|>[added imports + the migrated function]<|endoftext|>

Training (dataset.py) and serving (model/proposer.py) build prompts here, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable

from .tokenizer import CONTEXT, FIXES, MIGRATED, ORIGINAL

PROMPT_FORMAT = 1  # bump when the layout changes: a model trained on another layout is refused
MAX_FIX_ENTRIES = 2
MAX_SNIPPET_CHARS = 300


def kb_entries(codes: Iterable[str]) -> list[dict]:
    """The kb entries of `codes` (unknown codes are skipped)."""
    from xlaport.kb import get_rule
    from xlaport.kb.docs import entry_dict

    entries = []
    for code in dict.fromkeys(codes):
        try:
            entries.append(entry_dict(get_rule(code)))
        except KeyError:
            continue
    return entries


def fixes_text(entries: Iterable[dict], max_entries: int = MAX_FIX_ENTRIES) -> str:
    """Compact text of kb entries for the prompt: code, title, before → after."""
    parts = []
    for entry in list(entries)[:max_entries]:
        part = f"# {entry.get('code', '')}: {entry.get('title', '')}\n"
        before, after = entry.get("before") or "", entry.get("after") or ""
        if before:
            part += "# before:\n" + before[:MAX_SNIPPET_CHARS].rstrip("\n") + "\n"
        if after:
            part += "# after:\n" + after[:MAX_SNIPPET_CHARS].rstrip("\n") + "\n"
        parts.append(part)
    return "".join(parts)


def format_prompt(original: str, imports: str, fixes: str) -> str:
    return f"{FIXES}{fixes}{CONTEXT}{imports}{ORIGINAL}{original}{MIGRATED}"


def prompt_variants(original: str, imports: str, entries: list[dict]) -> list[str]:
    """Prompts from the fullest to the shortest (fewer fixes, then no import context)."""
    variants = [format_prompt(original, imports, fixes_text(entries[:n])) for n in range(MAX_FIX_ENTRIES, -1, -1)]
    variants.append(format_prompt(original, "", ""))
    return list(dict.fromkeys(variants))
