"""What the lint speed-ups of issue #27 rely on: a type lookup that answers as isinstance does, and a module's walk
reused by its second pass after a tree's other modules pushed it out of the walk cache."""

import ast
from pathlib import Path

import libcst as cst
from xlaport.kb.analysis.bindings import _children, module_bindings, own_bindings, top_level_bindings
from xlaport.kb.analysis.module import ModuleAnalysis
from xlaport.kb.cst_helpers import find_nodes, node_kinds
from xlaport.kb.cst_walk import module_walk, walk

SOURCE = """import torch


class Head(torch.nn.Module):
    scale: float = 2.0

    def forward(self, x, *rest, mask=None):
        del rest
        total = 0
        total += 1
        if mask is not None:
            x = x * mask
        return [y for y in x] if self.training else (lambda z: z)(x)


for step, batch in enumerate([1, 2]):
    global_step: int
    try:
        import os
    except ImportError as exc:
        raise SystemExit(exc)
"""


def test_node_kinds_answer_as_isinstance_does():
    module = cst.parse_module(SOURCE)
    every = list(walk(module))
    for kinds in [
        (cst.Call,),
        (cst.Name, cst.Attribute),
        (cst.BaseSmallStatement,),  # abstract: its subclasses count
        (cst.BaseCompoundStatement, cst.BaseExpression),
        (cst.CSTNode,),
    ]:
        exact = node_kinds(kinds)
        assert [n for n in every if type(n) in exact] == [n for n in every if isinstance(n, kinds)], kinds
        found = find_nodes(module, *kinds)
        assert found and all(isinstance(n, kinds) for n in found)


def test_second_pass_reuses_the_walk_after_other_modules_pushed_it_out():
    module = cst.parse_module(SOURCE)
    analysis = ModuleAnalysis.of(module)
    for i in range(6):  # a tree's other modules, walked for its summary after this one
        module_walk(cst.parse_module(f"x{i} = {i}\n"))
    analysis.next_pass()  # the lint of the module, after the summary
    nodes, parents = module_walk(module)  # what the device analysis and the parent map ask for
    assert nodes is analysis.walked[0]  # the analysis' own walk, not a second one
    assert parents is analysis.parents


def test_children_without_context_markers_bind_the_same():
    # every node of the kb fixtures and examples too: `_children` reads only the fields whose ASDL type can hold
    # a node, so a field left out by mistake would show here
    root = Path(__file__).resolve().parents[2]
    sources = [SOURCE] + [p.read_text(encoding="utf-8") for p in sorted(root.glob("tests/fixtures/kb/*/input.py"))]
    sources += [p.read_text(encoding="utf-8") for p in sorted(root.glob("examples/**/*.py"))]
    kinds = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            kept = [c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.Load, ast.Store, ast.Del))]
            assert _children(node) == kept, ast.dump(node)[:200]
            kinds.add(type(node))
    assert len(kinds) > 60
    tree = ast.parse(SOURCE)
    found = top_level_bindings(tree, module_bindings(tree))
    assert {"Head", "step", "batch", "exc", "global_step"} <= found.outside_functions  # bound other than by imports
    assert not {"torch", "os"} & found.outside_functions
    forward = own_bindings(next(f for f in found.functions if f.name == "forward"))
    assert {"self", "x", "rest", "mask", "total"} <= forward[0]
    assert {"rest", "total"} <= forward[1]  # deleted, augmented: libcst may see them otherwise


def test_visitor_names_are_those_dir_finds():
    from xlaport.kb import all_rules
    from xlaport.kb.rule import _visitor_names

    for rule in all_rules():
        by_dir = [
            name
            for name in dir(rule)
            if name.startswith(("visit_", "leave_"))
            and callable(getattr(rule, name))
            and not getattr(getattr(rule, name), "_is_no_op", False)
        ]
        assert _visitor_names(rule) == by_dir, rule.code
