"""kb/text_edits.py: difflib matched only between the lines that differ, where that is the same, gives exactly
difflib's opcodes on the whole texts: checked on many random pairs of texts made of few distinct lines (repeats
everywhere: where a shortcut would go wrong) and on small rewrites of a long text."""

from __future__ import annotations

import difflib
import random

from xlaport.kb import text_edits as text_edits_module
from xlaport.kb.text_edits import _line_opcodes, apply_edits, text_edits


def whole(before: list[str], after: list[str]) -> list[tuple]:
    return difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()


def test_the_same_opcodes_as_difflib_on_random_texts():
    chance = random.Random(27)
    for _ in range(3000):
        lines = [f"line {chance.randrange(4)}\n" for _ in range(chance.randrange(12))]
        edited = list(lines)
        for _ in range(chance.randrange(1, 3)):
            at = chance.randrange(len(edited) + 1)
            cut = chance.randrange(3)
            edited[at : at + cut] = [f"{chance.choice(['line', 'new'])} {chance.randrange(5)}\n"] * chance.randrange(3)
        assert _line_opcodes(lines, edited) == whole(lines, edited), (lines, edited)


def test_one_line_changed_in_a_long_text():
    lines = [f"    x{i} = f(x{i - 1})\n" if i % 5 else "\n" for i in range(3000)]
    edited = lines[:1201] + ['    device = "xla"\n'] + lines[1202:]
    assert (
        _line_opcodes(lines, edited)
        == whole(lines, edited)
        == [
            ("equal", 0, 1201, 0, 1201),
            ("replace", 1201, 1202, 1201, 1202),
            ("equal", 1202, 3000, 1202, 3000),
        ]
    )
    old, new = "".join(lines), "".join(edited)
    assert apply_edits(old, text_edits(old, new)) == new


def test_the_sampled_search_gives_difflibs_matches(monkeypatch):
    """The search by sampling (kb/text_edits.py _Matcher) on texts of few distinct lines with long common runs
    (rewrites that add lines far apart, repeats everywhere), its threshold lowered so that it runs on small ranges
    too: difflib's matching blocks, exactly."""
    monkeypatch.setattr(text_edits_module, "MIN_SAMPLED_RUN", 2)
    chance = random.Random(2027)
    for _ in range(2000):
        lines = [f"line {chance.randrange(3)}\n" for _ in range(chance.randrange(4, 60))]
        edited = list(lines)
        for _ in range(chance.randrange(1, 4)):
            at = chance.randrange(len(edited) + 1)
            cut = chance.randrange(3)
            edited[at : at + cut] = [f"{chance.choice(['line', 'new'])} {chance.randrange(4)}\n"] * chance.randrange(3)
        expected = difflib.SequenceMatcher(None, lines, edited, autojunk=False)
        found = text_edits_module._Matcher(lines, edited)
        assert found.get_matching_blocks() == expected.get_matching_blocks(), (lines, edited)
        assert found.get_opcodes() == expected.get_opcodes()


def test_an_import_added_far_from_the_change():
    """The common case the sampled search is for: one line added at the top, one changed far below."""
    lines = [f"    x{i} = f(x{i - 1})\n" if i % 5 else "\n" for i in range(3000)]
    edited = lines[:3] + ["import torch_xla\n"] + lines[3:2500] + ['    device = "xla"\n'] + lines[2501:]
    assert _line_opcodes(lines, edited) == whole(lines, edited)
    old, new = "".join(lines), "".join(edited)
    assert apply_edits(old, text_edits(old, new)) == new
