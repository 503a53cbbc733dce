"""The kb entries an error message is a symptom of, by plain text: each entry lists the messages its problem
produces (`Rule.symptoms`); an error whose text contains one of them (numbers aside: "a Tensor with 4 elements"
is "a Tensor with 12 elements") is explained by that entry. A symptom several entries share ("Found no NVIDIA
driver") tells none of them apart and is not used. `kb search` ranks by meaning; this is the exact match `check`
uses to name the entry behind a crash (eval/check/crash.py)."""

from __future__ import annotations

import re
from functools import cache

from .registry import all_rules

MIN_SYMPTOM_CHARS = 16  # shorter symptoms ("aten::median") are counter names, not error messages
MAX_ENTRIES_A_SYMPTOM = 2  # a symptom more entries share explains none of them
NUMBER = re.compile(r"\d+")


def _normalise(text: str) -> str:
    return " ".join(NUMBER.sub("N", text).lower().split())


@cache
def _symptoms() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(normalised symptom, the codes that list it), for the symptoms that tell entries apart: an entry whose symptom
    contains another's, or is contained in it ("Found no NVIDIA driver" in "RuntimeError: Found no ..."), shares it."""
    listed = [
        (_normalise(symptom), rule.code)
        for rule in all_rules()
        for symptom in rule.symptoms
        if len(_normalise(symptom)) >= MIN_SYMPTOM_CHARS
    ]
    kept = []
    for text in dict.fromkeys(t for t, _ in listed):
        codes = tuple(dict.fromkeys(code for other, code in listed if text in other or other in text))
        if len(codes) <= MAX_ENTRIES_A_SYMPTOM:
            kept.append((text, codes))
    return tuple(kept)


def entries_for_error(text: str) -> list[str]:
    """The codes of the entries whose symptom `text` (an error line or a traceback) contains, in code order."""
    found = _normalise(text)
    return sorted({code for symptom, codes in _symptoms() if symptom in found for code in codes})


def explain_error(text: str) -> list[str]:
    """One sentence per entry that explains the error: `XLA522 (title): what to do`."""
    by_code = {rule.code: rule for rule in all_rules()}
    return [
        f"kb {code} ({by_code[code].title}): {by_code[code].message or by_code[code].title}"
        for code in entries_for_error(text)
    ]
