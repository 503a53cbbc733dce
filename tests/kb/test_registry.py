"""One explicit registry (kb/registry.py): every rule module is listed there, nothing registers itself by being
imported, and `kb show` says where a rule is defined (issue 29, item 3)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest
import xlaport.kb
from typer.testing import CliRunner
from xlaport.kb import registry
from xlaport.kb.rule import Rule

from xlaport.cli import app

KB = Path(xlaport.kb.__file__).parent
DETECTS_MAX = 500  # characters of the user-facing "what it detects"; the rest goes in the rule's docstring


def _kb_modules() -> list[ModuleType]:
    names = [m.name for m in pkgutil.walk_packages([str(KB)], "xlaport.kb.")]
    return [importlib.import_module(name) for name in names if not name.endswith(".__main__")]


def test_every_rule_module_on_disk_is_listed():
    on_disk = {f"xlaport.kb.rules.{path.stem}" for path in (KB / "rules").glob("*.py") if path.stem != "__init__"}
    listed = {module.__name__ for module in registry.RULE_MODULES}
    assert on_disk - listed == set()


def test_every_rule_defined_anywhere_in_kb_is_in_the_registry():
    """A rule in a module the registry does not list would be silently left out of every run."""
    defined = {rule.code for module in _kb_modules() for rule in registry.rules_in(module)}
    assert defined - {"summary"} == set(registry.RULES)  # kb/batch.py's step summary: a visitor, not an entry
    assert len(registry.RULES) > 100


def test_the_rules_are_collected_not_registered():
    """No `register` decorator is left to call: importing a module adds nothing anywhere."""
    assert not hasattr(importlib.import_module("xlaport.kb.rule"), "register")
    bases = {"Rule", "ScopedRule", "StepContextRule", "EnvWriteRule", "ConfigRule"}
    assert not {rule.__name__ for rule in registry.RULES.values()} & bases


def test_two_rules_with_one_code_are_refused():
    module = ModuleType("fake_rules")
    for name in ("First", "Second"):
        rule = type(name, (Rule,), {"code": "XLA999", "__module__": "fake_rules"})
        setattr(module, name, rule)
    with pytest.raises(ValueError, match="duplicate rule code XLA999"):
        registry._by_code((module,))


def test_kb_show_names_the_source_file_and_keeps_detects_short():
    shown = CliRunner().invoke(app, ["kb", "show", "XLA406"])
    assert shown.exit_code == 0, shown.output
    assert "Source: kb/rules/c4_barriers.py:" in shown.output and "(MissingStepBarrier)" in shown.output
    long = {code: len(rule.detects) for code, rule in registry.RULES.items() if len(rule.detects) > DETECTS_MAX}
    assert long == {}
