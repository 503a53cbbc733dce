"""Positions computed a statement at a time are libcst's PositionProvider positions, node for node."""

import random
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider
from xlaport.kb.analysis.module import ModuleAnalysis
from xlaport.kb.cst_walk import module_walk
from xlaport.kb.parsing import parse_both

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = sorted((ROOT / "tests" / "fixtures" / "kb").glob("*/input.py"))[::7] + sorted(ROOT.glob("examples/*/*.py"))

AWKWARD = {
    "decorated": "import torch\n\n\n@torch.no_grad()\n# between\n@staticmethod\ndef f(x):\n    return x.cuda()\n",
    "semicolons": "import torch; x = torch.ones(2); y = x.cuda()\nz = (1,\n     2); w = y.cuda()\n",
    "class_and_nested": (
        "class A:\n    '''doc'''\n\n    def f(self):\n        # a comment\n        def g():\n"
        "            return 1\n        return g()\n\n    x = [i for i in\n         range(3)]\n"
    ),
    "crlf": "import torch\r\nclass A:\r\n    def f(self):\r\n        return torch.ones(1).cuda()\r\n",
    "form_feed": "import torch\n\x0c\ndef f():\n    return torch.ones(1)\n\x0c\nx = f()\n",
    "no_final_newline": "import torch\ndef f():\n    return torch.ones(1).cuda()",
    "one_line_suite": "class A: x = 1\nif True: y = 2\nelse:\n    y = 3\n",
    "continuation": "x = 1 + \\\n    2\ndef f():\n    return x\n",
    "tabs": "if True:\n\tdef f():\n\t\treturn 1\n",
    "header_comment": "#!/usr/bin/env python\n# a header\n\nimport os\n",
}


def _check_all_nodes(source: str) -> int:
    module, tree = parse_both(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    analysis = ModuleAnalysis.of(module, MetadataWrapper(module, unsafe_skip_copy=True), tree, source)
    positions = analysis.positions()
    nodes = list(analysis.parents)
    for node in reversed(nodes):  # innermost first: each statement is generated before its container asks
        assert positions[node] == expected[node], (type(node).__name__, cst.Module([]).code_for_node(node)[:60])
    return len(nodes)


@pytest.mark.parametrize("name", sorted(AWKWARD))
def test_same_positions_as_libcst_on_awkward_text(name: str):
    assert _check_all_nodes(AWKWARD[name]) > 2  # layout nodes (whitespace, commas, ...) are not walked


@pytest.mark.parametrize("path", SAMPLE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_same_positions_as_libcst_on_fixtures(path: Path):
    assert _check_all_nodes(path.read_text()) > 20


def test_a_statement_is_generated_not_the_module():
    source = "import torch\n\n" + "".join(f"def f{i}():\n    return torch.ones({i})\n\n" for i in range(50))
    module, tree = parse_both(source)
    analysis = ModuleAnalysis.of(module, MetadataWrapper(module, unsafe_skip_copy=True), tree, source)
    last_call = [n for n in module_walk(module)[0] if isinstance(n, cst.Call)][-1]
    assert analysis.position(last_call).start.line > 140
    positions = analysis.positions()
    assert positions.whole is None and len(positions.known._computed) < 30


def test_a_node_in_a_loop_generates_its_line_not_the_loop():
    body = "".join(f"            y{i} = torch.ones({i})\n" for i in range(40))
    source = f"import torch\n\n\ndef f(xs):\n    for x in xs:\n        if x:\n{body}            z = x.cuda()\n"
    module, tree = parse_both(source)
    analysis = ModuleAnalysis.of(module, MetadataWrapper(module, unsafe_skip_copy=True), tree, source)
    call = [n for n in module_walk(module)[0] if isinstance(n, cst.Call)][-1]
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)[call]
    assert analysis.position(call) == expected
    assert analysis.positions().whole is None and len(analysis.positions().known._computed) < 20


BLOCKS = {
    "loops": (
        "import torch\n\n\ndef train(loader):\n    for step, x in enumerate(loader):\n        y = x.cuda()\n"
        "        with torch.no_grad():\n            z = y * 2  # a comment\n\n        # between\n"
        "        if step:\n            while z.sum() > 0:\n                z = z - 1\n    return z\n"
    ),
    "async_and_else": (
        "async def f(xs):\n    async for x in xs:\n        pass\n    async with x:\n        pass\n"
        "    for x in xs:\n        pass\n    else:\n        pass\n    if x:\n        pass\n    elif xs:\n        pass\n"
    ),
    "one_line_suites_and_tabs": "for x in y: pass\nif x:\n\twith y: z = 1\n\twhile x:\n\t\tx -= 1\n",
    "last_statement_nested": "for a in b:\n    for c in d:\n        if c:\n            e = 1\n\n# after\nf = 2\n",
    "no_final_newline": "while True:\n    break",
}


def _check_outermost_first(source: str, shuffled: bool = False) -> None:
    module, tree = parse_both(source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    analysis = ModuleAnalysis.of(module, MetadataWrapper(module, unsafe_skip_copy=True), tree, source)
    positions = analysis.positions()
    nodes = list(analysis.parents)  # outermost first: a loop is asked for before anything in it
    if shuffled:  # a loop's target or a function's parameters asked before the rest of it, and so on
        random.Random(len(source)).shuffle(nodes)
    for node in nodes:
        assert positions[node] == expected[node], (type(node).__name__, cst.Module([]).code_for_node(node)[:60])


@pytest.mark.parametrize("name", sorted(BLOCKS) + sorted(AWKWARD))
def test_blocks_asked_first_get_libcsts_positions(name: str):
    _check_outermost_first({**BLOCKS, **AWKWARD}[name])


@pytest.mark.parametrize("name", sorted(BLOCKS) + sorted(AWKWARD))
def test_nodes_asked_in_any_order_get_libcsts_positions(name: str):
    _check_outermost_first({**BLOCKS, **AWKWARD}[name], shuffled=True)


@pytest.mark.parametrize("path", SAMPLE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_blocks_asked_first_get_libcsts_positions_on_fixtures(path: Path):
    _check_outermost_first(path.read_text())
    _check_outermost_first(path.read_text(), shuffled=True)


def test_a_name_in_a_loops_header_is_placed_without_generating_its_body():
    body = "".join(f"        y{i} = torch.ones({i})\n" for i in range(40))
    source = f"import torch\n\n\n@torch.no_grad()\ndef f(xs):  # a comment\n    for x in xs:\n{body}        z = x.cuda()\n    return z\n"
    module, tree = parse_both(source)
    analysis = ModuleAnalysis.of(module, MetadataWrapper(module, unsafe_skip_copy=True), tree, source)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    loop = next(n for n in module_walk(module)[0] if isinstance(n, cst.For))
    function = next(n for n in module_walk(module)[0] if isinstance(n, cst.FunctionDef))
    for header_node in (loop.iter, loop.target, function.params.params[0], function.decorators[0].decorator):
        assert analysis.position(header_node) == expected[header_node]
    # the two headers' nodes (whitespace included); the loop's body alone has over 400
    assert analysis.positions().whole is None and len(analysis.positions().known._computed) < 100


def test_a_loop_asked_for_itself_is_placed_without_generating_its_body():
    body = "".join(f"        y{i} = torch.ones({i})\n" for i in range(40))
    source = f"import torch\n\n\ndef f(xs):\n    for x in xs:\n{body}        z = x.cuda()\n    return z\n"
    module, tree = parse_both(source)
    analysis = ModuleAnalysis.of(module, MetadataWrapper(module, unsafe_skip_copy=True), tree, source)
    loop = next(n for n in module_walk(module)[0] if isinstance(n, cst.For))
    assert analysis.position(loop) == MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)[loop]
    assert analysis.positions().whole is None and len(analysis.positions().known._computed) < 20
