"""kb/splice.py: the code of a rewritten module, generated only where the rewrite changed it, is the rewritten
module's whole `code`, character for character: for a rewrite deep in a class, a removed statement, added
imports, a kept statement moved into a new block (another indentation), a module without a final newline; and
for every fixable finding of the kb fixtures and examples."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest
from xlaport.kb import engine, lint_source
from xlaport.kb.cst_walk import module_walk, parent_map, walk
from xlaport.kb.edits import ancestors, removal_marker, replace_nodes
from xlaport.kb.imports import add_imports
from xlaport.kb.splice import OriginalText, code_after, splice

ROOT = Path(__file__).resolve().parents[2]

SOURCE = '''"""A module."""
import os


# a comment above the class
class Trainer:
    """Trains."""

    def __init__(self, device="cuda"):
        self.device = device  # where it runs

    def step(self, batch):
        if batch is None:
            return None
        torch.cuda.synchronize()
        return batch.to("cuda")


def helper(x):
\treturn x + 1
'''


def rewrite(source: str, change) -> tuple[cst.Module, cst.Module]:  # noqa: ANN001  (change: module -> replacements)
    module = cst.parse_module(source)
    replacements = change(module)
    rewritten = replace_nodes(module, replacements, ancestors(replacements, parent_map(module)), drop_markers=True)
    return module, rewritten


def nodes(module: cst.Module, kind: type, test=lambda node: True) -> list:  # noqa: ANN001
    return [n for n in module_walk(module)[0] if type(n) is kind and test(n)]


def a_string(module: cst.Module) -> dict:
    cuda = nodes(module, cst.SimpleString, lambda s: s.value == '"cuda"')[0]
    return {cuda: cuda.with_changes(value='"xla"')}


def a_removal(module: cst.Module) -> dict:
    (sync,) = [s for s in nodes(module, cst.SimpleStatementLine) if "synchronize" in module.code_for_node(s)]
    return {sync: removal_marker(sync)}


def a_moved_statement(module: cst.Module) -> dict:
    """The statements of `step` wrapped in an `if`: kept statements one level deeper."""
    (step,) = nodes(module, cst.FunctionDef, lambda f: f.name.value == "step")
    wrapped = cst.If(test=cst.Name("ok"), body=step.body)
    return {step.body: step.body.with_changes(body=[wrapped])}


@pytest.mark.parametrize("change", [a_string, a_removal, a_moved_statement])
def test_the_spliced_code_is_the_rewritten_modules_code(change):
    module, rewritten = rewrite(SOURCE, change)
    assert rewritten.code != module.code
    assert code_after(OriginalText(module), rewritten) == rewritten.code


def test_added_imports_and_a_module_without_a_final_newline():
    for source in (SOURCE, SOURCE.rstrip("\n")):
        module, rewritten = rewrite(source, a_string)
        rewritten = add_imports(rewritten, [("torch_xla", None, None), ("os", "path", None)])
        assert code_after(OriginalText(module), rewritten) == rewritten.code


def test_the_original_text_is_the_module_code():
    module = cst.parse_module(SOURCE)
    assert OriginalText(module).code == SOURCE


def test_every_fixable_finding_of_the_fixtures(monkeypatch):
    """Each finding's own rewrite (lint --format json), spliced and generated whole: the same text."""
    checked = []

    def both(original: OriginalText, rewritten: cst.Module) -> tuple[str, str]:
        spliced, generated = splice(original, rewritten)
        assert spliced == rewritten.code
        assert _parses(generated) == _parses(spliced)
        checked.append(spliced)
        return spliced, generated

    monkeypatch.setattr(engine, "splice", both)
    paths = sorted((ROOT / "tests" / "fixtures" / "kb").glob("*/input.py")) + sorted(ROOT.glob("examples/**/*.py"))
    for path in paths:
        lint_source(path.read_text(encoding="utf-8"), path.name, edits=True)
    assert len(checked) >= 50


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def _replaced(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    return replace_nodes(module, {old: new}, ancestors({old: new}, parent_map(module)))


def test_the_generated_part_is_short_and_parses_as_the_whole_code_does():
    module = cst.parse_module(SOURCE)
    original = OriginalText(module)
    call = next(n for n in walk(module) if isinstance(n, cst.Call))
    good = _replaced(module, call.func, cst.Name("renamed"))
    code, generated = splice(original, good)
    assert code == good.code and len(generated) < len(code)
    assert _parses(generated) and _parses(code)
    # a rewrite whose own statement is no Python (a keyword as a name): both refuse it
    bad = _replaced(module, call.func, cst.Name("lambda"))
    code, generated = splice(original, bad)
    assert not _parses(code) and not _parses(generated)
