"""`add_kwarg` keeps the layout of the call it extends (issue 9 item 6: a misindented `drop_last=True)` was seen)."""

from __future__ import annotations

import libcst as cst
import pytest
from xlaport.kb.cst_helpers import add_kwarg

CASES = [
    ("f(a, b)", "f(a, b, drop_last=True)"),
    ("f(\n    a,\n    b,\n)", "f(\n    a,\n    b,\n    drop_last=True,\n)"),
    ("f(\n    a,\n    b\n)", "f(\n    a,\n    b,\n    drop_last=True\n)"),
    ("f(a, b,\n  c)", "f(a, b,\n  c, drop_last=True)"),
    ("f(a\n)", "f(a, drop_last=True\n)"),
    ("f()", "f(drop_last=True)"),
]


@pytest.mark.parametrize(("before", "after"), CASES)
def test_layout_is_kept(before, after):
    call = cst.parse_expression(before)
    assert cst.Module([]).code_for_node(add_kwarg(call, "drop_last", cst.Name("True"))) == after
