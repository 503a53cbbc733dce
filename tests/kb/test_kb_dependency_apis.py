"""A library that still calls torch_xla APIs removed in 2.7 (pytorch-ignite's `xm.xrt_world_size()`): the migrated
program crashed inside the library (issue 24, item 3). XLA117 adds a shim after the import block, once; the shim
maps the removed getters to `torch_xla.runtime`, which returns the same numbers."""

from __future__ import annotations

import ast

import pytest
from xlaport.kb import fix_source, lint_source

PROGRAM = """import torch
from ignite.engine import create_supervised_evaluator
from ignite.metrics import Loss

net = torch.nn.Linear(2, 1)
evaluator = create_supervised_evaluator(net, metrics={"mse": Loss(torch.nn.functional.mse_loss)})
"""


def codes(source: str) -> list[tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(source, "eval.py") if f.code == "XLA117"]


def test_the_shim_goes_after_the_import_block_once():
    assert codes(PROGRAM) == [("XLA117", 2)]  # the first import of the library
    fixed = fix_source(PROGRAM).fixed
    ast.parse(fixed)
    lines = fixed.splitlines()
    shim = next(i for i, line in enumerate(lines) if line.startswith("xm.xrt_world_size, xm.get_ordinal = "))
    assert lines[shim].startswith("xm.xrt_world_size, xm.get_ordinal = xr.world_size, xr.global_ordinal")
    assert shim < next(i for i, line in enumerate(lines) if line.startswith("net = "))
    assert "import torch_xla.core.xla_model as xm" in lines[:shim]
    assert "import torch_xla.runtime as xr" in lines[:shim]
    assert fixed.count("xrt_world_size") == 1
    assert fix_source(fixed).fixed == fixed and codes(fixed) == []  # a second pass adds nothing


def test_no_shim_without_the_library_or_for_an_optional_import():
    assert codes("import torch\nimport os\n") == []
    assert codes("try:\n    import ignite\nexcept ImportError:\n    ignite = None\n") == []


@pytest.mark.slow
def test_the_shim_computes_what_the_removed_getters_did():
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    assert not hasattr(xm, "xrt_world_size") and not hasattr(xm, "get_ordinal")  # removed in this torch_xla
    namespace: dict = {}
    exec(fix_source("import ignite.engine\n").fixed.replace("import ignite.engine\n", ""), namespace)
    try:
        assert xm.xrt_world_size() == xr.world_size() and xm.get_ordinal() == xr.global_ordinal()
    finally:
        del xm.xrt_world_size, xm.get_ordinal
