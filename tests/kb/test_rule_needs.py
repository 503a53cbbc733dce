"""`Rule.needs`: the engine skips a rule on a source that spells none of its words. Skipping must never lose a
finding: a rule left out of a file would have reported nothing there."""

from __future__ import annotations

import pytest
from test_findings_snapshot import TORCH_VERSION, repo_sample, torch_sample
from xlaport.kb import engine, lint_source
from xlaport.kb.engine import may_report
from xlaport.kb.parsing import SourceError, parse
from xlaport.kb.registry import all_rules, get_rule


def _sample() -> list[tuple[str, str]]:
    """(name, source): every rule's examples, the fixtures and examples, and the torch sample of the snapshot."""
    import torch

    torch_files = torch_sample() if torch.__version__.startswith(TORCH_VERSION) else []
    examples = [(f"{r.code} example", text) for r in all_rules() for text in (r.before, r.after, *r.valid) if text]
    texts = [(name, text) for name, text in examples if _parses(text)]  # some rules' examples are config files
    return texts + [(str(p), p.read_text(encoding="utf-8")) for p in repo_sample() + torch_files]


def _parses(text: str) -> bool:
    try:
        parse(text)
    except SourceError:
        return False
    return True


def test_rules_left_out_by_their_needs_report_nothing_there(monkeypatch):
    rules = all_rules()
    left_out_somewhere = 0
    checks = []
    for path, source in _sample():
        kept = set(may_report(rules, source))
        left_out = [r for r in rules if r not in kept]
        left_out_somewhere += bool(left_out)
        checks.append((path, source, left_out))
    monkeypatch.setattr(engine, "may_report", lambda rules, source: rules)  # run them anyway
    for path, source, left_out in checks:
        found = lint_source(source, path, left_out)
        assert not found, f"{path}: {[(f.code, f.line) for f in found]} were skipped by their `needs`"
    assert left_out_somewhere > len(checks) / 2  # the check had rules to run


def test_every_rule_needs_lower_case_words():
    # lower case, and only characters the engine's look-up of words keeps together (engine.NEEDS_WORD)
    for rule in all_rules():
        assert all(word and word == word.lower() and engine.NEEDS_WORD.fullmatch(word) for word in rule.needs), (
            rule.code
        )


def test_a_needed_word_is_found_inside_a_longer_word_and_across_punctuation():
    rules = [get_rule("XLA204")]  # needs "cuda"
    assert engine.may_report(rules, "x = use_CUDA_now\n") == rules
    assert engine.may_report(rules, "x = 'nvidia-cuda'\n") == rules
    assert engine.may_report(rules, "x = cud + a\n") == []


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("from torch import cuda as c\nc.synchronize()\n", "XLA204"),  # the alias spells "cuda" in its import
        ("import torch\nd = torch.device('\\x63uda')\n", "XLA202"),  # an escape spells "cuda" in the value only
        ("import torch\nd = torch.device('CUDA'.lower())\nx = torch.ones(2, device='cuda')\n", "XLA202"),
    ],
)
def test_a_rule_runs_where_its_words_are_spelled_some_other_way(source: str, code: str):
    assert get_rule(code) in may_report([get_rule(code)], source)
    assert code in {f.code for f in lint_source(source)}


def test_a_source_without_the_words_skips_the_rule():
    source = "import torch\nx = torch.ones(2)\n"
    assert get_rule("XLA204") not in may_report(all_rules(), source)
