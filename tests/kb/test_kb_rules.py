"""Data-driven rule tests: every entry's own examples, its fixture pair, and the negative fixtures."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from xlaport.kb import all_rules, fix_source, lint_source
from xlaport.kb.configs import ConfigRule, config_kind, fix_config, lint_config

FIXTURES = Path(__file__).parent.parent / "fixtures"
RULES = all_rules()
CODES = [r.code for r in RULES]


def codes_in(source: str, rule=None) -> set[str]:
    """Codes found in `source`: Python, or the config file of a config rule's examples."""
    if rule is not None and issubclass(rule, ConfigRule):
        return {f.code for f in lint_config(source, rule.example_path)}
    return {f.code for f in lint_source(source)}


def fixed_text(source: str, rule=None, rules=None) -> str:
    if rule is not None and issubclass(rule, ConfigRule):
        return fix_config(source, rule.example_path).fixed
    return fix_source(source, rules=rules, unsafe=True).fixed


@pytest.mark.parametrize("rule", RULES, ids=CODES)
def test_entry_is_documented(rule):
    assert rule.code.startswith("XLA") and len(rule.code) == 6
    assert rule.category in {"C1", "C2", "C3", "C4", "C5", "C6", "C7"}
    assert rule.fix in {"safe", "unsafe", "manual"}
    for field in ("title", "detects", "why", "before"):
        assert getattr(rule, field).strip(), f"{rule.code} has no {field}"
    if rule.autofix:
        assert rule.fix != "manual" and rule.after.strip(), f"{rule.code} rewrites but shows no `after`"


@pytest.mark.parametrize("rule", RULES, ids=CODES)
def test_before_example_is_detected(rule):
    assert rule.code in codes_in(rule.before, rule)


@pytest.mark.parametrize("rule", [r for r in RULES if r.autofix], ids=[r.code for r in RULES if r.autofix])
def test_before_example_fixes_to_after(rule):
    fixed = fixed_text(rule.before, rule, rules=[rule])
    assert fixed == rule.after
    assert rule.code not in codes_in(fixed, rule)


@pytest.mark.parametrize("rule", [r for r in RULES if r.valid], ids=[r.code for r in RULES if r.valid])
def test_valid_examples_are_not_flagged(rule):
    for snippet in rule.valid:
        assert rule.code not in codes_in(snippet, rule), snippet


def fixture_dirs():
    return sorted(p for p in (FIXTURES / "kb").iterdir() if p.is_dir())


def test_every_entry_has_a_fixture_pair():
    have = {p.name for p in fixture_dirs()}
    assert set(CODES) <= have, f"missing fixtures: {sorted(set(CODES) - have)}"


@pytest.mark.parametrize("case", fixture_dirs(), ids=lambda p: p.name)
def test_fixture(case: Path):
    # input.py, or input.yaml / input.sh / ... for the config-file entries
    input_path = next(case.glob("input.*"))
    is_config = config_kind(input_path) is not None
    source = input_path.read_text()

    def lint(text):
        return lint_config(text, input_path.name) if is_config else lint_source(text)

    def fix(text):
        return fix_config(text, input_path.name).fixed if is_config else fix_source(text, unsafe=True).fixed

    rule_codes = {f.code for f in lint(source)}
    assert case.name in rule_codes, f"{case.name} not detected in its own fixture"
    expected_findings = case / "findings.txt"
    if expected_findings.exists():
        # one "LINE CODE" per line: exactly these findings of the fixture's own code
        want = sorted(tuple(line.split()) for line in expected_findings.read_text().splitlines() if line.strip())
        got = sorted((str(f.line), f.code) for f in lint(source) if f.code == case.name)
        assert got == [(line, code) for line, code in want]
    expected = case / f"expected{input_path.suffix}"
    if expected.exists():
        fixed = fix(source)
        assert fixed == expected.read_text()
        if not is_config:
            ast.parse(fixed)
        assert fix(fixed) == fixed, "fix is not idempotent"


@pytest.mark.parametrize("path", sorted((FIXTURES / "negative").glob("*.py")), ids=lambda p: p.name)
def test_negative_fixture_has_no_findings(path: Path):
    findings = lint_source(path.read_text(), str(path))
    assert findings == [], [f"{f.line}: {f.code} {f.message}" for f in findings]


@pytest.mark.parametrize("rule", RULES, ids=CODES)
def test_fix_is_idempotent_and_parses(rule):
    once = fixed_text(rule.before, rule)
    if not issubclass(rule, ConfigRule):
        ast.parse(once)
    assert fixed_text(once, rule) == once


def test_nvml_readers_of_the_gpu_are_reported_with_the_memory_statistics():
    """`torch.cuda.utilization()` and `memory_usage()` ask NVML (pynvml) about the GPU: on a TPU host they raise
    'pynvml does not seem to be installed'; no entry reported them."""
    source = "import torch\n\nbusy = torch.cuda.utilization()\nreads = torch.cuda.memory_usage(0)\n"
    found = [(f.code, f.line) for f in lint_source(source)]
    assert ("XLA601", 3) in found and ("XLA601", 4) in found, found
    assert "NVML" in next(f.message for f in lint_source(source) if f.code == "XLA601")
