"""The shared libcst helpers (kb/cst_helpers.py)."""

import libcst as cst
from xlaport.kb.cst_helpers import code_of
from xlaport.kb.cst_walk import module_walk


def test_code_of_names_and_attributes_is_their_generated_code():
    """code_of skips code generation for plain `a.b.c`: the text must be what generation gives, in every spelling."""
    source = "a.b.c\n(a).b\na . b\n(a.b).c\na.\\\n  b\nx[0].y\nf().g\n((a))\nself.scaler.step\n"
    nodes = [n for n in module_walk(cst.parse_module(source))[0] if type(n) in (cst.Name, cst.Attribute)]
    assert len(nodes) > 20
    for node in nodes:
        assert code_of(node) == cst.Module([]).code_for_node(node)
    assert [code_of(n) for n in nodes[:3]] == ["a.b.c", "a.b", "a"]
