"""The post-pass that removes imports a rewrite left unused (issue 9, item 6)."""

from __future__ import annotations

import ast

import libcst as cst
import pytest
from xlaport.kb.imports import import_references, remove_imports_made_unused


def remove(original: str, fixed: str | cst.Module) -> cst.Module:
    module = cst.parse_module(fixed) if isinstance(fixed, str) else fixed
    return remove_imports_made_unused(ast.parse(original), module, ast.parse(module.code))


ORIGINAL = """\
import os
import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch_xla.core.xla_model as xm
from torch.cuda.amp import GradScaler, autocast
try:
    import apex
except ImportError:
    apex = None

def train(model, x):
    from torch.cuda import amp
    with amp.autocast():
        return model(x) + apex.bias + xm.xla_device()

cudnn.benchmark = True
scaler = GradScaler()
with autocast():
    y = torch.ones(1)
"""

# What the rules would leave: every CUDA use rewritten, the imports still there.
REWRITTEN = """\
import os
import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch_xla.core.xla_model as xm
from torch.cuda.amp import GradScaler, autocast
try:
    import apex
except ImportError:
    apex = None

def train(model, x):
    from torch.cuda import amp
    with torch.autocast("xla"):
        return model(x)

with torch.autocast("xla"):
    y = torch.ones(1)
"""

CLEANED = """\
import os
import numpy as np
import torch
import torch_xla.core.xla_model as xm
try:
    import apex
except ImportError:
    apex = None

def train(model, x):
    with torch.autocast("xla"):
        return model(x)

with torch.autocast("xla"):
    y = torch.ones(1)
"""


def test_removes_only_imports_the_rewrite_made_unused():
    cleaned = remove(ORIGINAL, REWRITTEN)
    # os and numpy were unused before: they stay; torch_xla and the try-probe stay too
    assert cleaned.code == CLEANED


def test_nothing_newly_unused_returns_the_same_module():
    module = cst.parse_module(REWRITTEN)
    assert remove(REWRITTEN, module) is module


def test_references_are_counted_across_scopes():
    counts = import_references(ast.parse(ORIGINAL))
    assert counts[("torch.cuda.amp", "GradScaler", None)] == 1
    assert counts[("torch.cuda", "amp", None)] == 1
    assert counts[("torch.backends.cudnn", None, "cudnn")] == 1
    assert counts[("os", None, None)] == 0
    assert ("apex", None, None) not in counts  # inside try: never removed
    assert not any(key[0].startswith("torch_xla") for key in counts)


def test_partly_used_from_import_keeps_the_used_name():
    original = "from torch.cuda.amp import GradScaler, autocast\ns = GradScaler()\nautocast()\n"
    fixed = "from torch.cuda.amp import GradScaler, autocast\nautocast()\n"
    assert remove(original, fixed).code == "from torch.cuda.amp import autocast\nautocast()\n"


def test_an_import_is_added_to_a_module_of_thousands_of_statements_after_a_docstring():
    # libcst's own placement matched the whole body with a pattern that recursed once per statement:
    # RecursionError past ~1,000 top-level statements, so such a file got no fix at all
    from xlaport.kb import fix_source

    body = "\n".join(f"v{i} = {i}" for i in range(3000))
    fixed = fix_source(f'"""Generated constants."""\nimport torch\nx = torch.zeros(3).cuda()\n{body}\n').fixed
    assert fixed.startswith(
        '"""Generated constants."""\nimport torch\nimport torch_xla\n\nx = torch.zeros(3).to(torch_xla.device())\n'
    )
    assert fixed.endswith("v2999 = 2999\n") and fixed.count("\n") == 3005


HEADS = [
    "",
    "x = 1\n",
    '"""Doc."""\nimport torch\n\nx = 1\n',
    '"""Doc."""\n# a comment\nx = 1\n',
    "__strict__ = True\nimport os\n",
    "from __future__ import annotations\nimport torch\nfrom torch_xla import runtime\n# c\ndef f():\n    pass\n",
    "import torch_xla\nimport torch_xla.core.xla_model as xm\nx = 1\n",
    "import torch_xla.core.xla_model as other\nx = 1\n",
    "from torch_xla.amp import autocast\nx = 1\n",
    "from torch_xla.amp import *\nfrom torch_xla.amp import autocast\nx = 1\n",
    "from torch_xla.amp import syncfree as s, autocast\nfrom torch_xla.amp import GradScaler\nx = 1\n",
    "import os; import sys\nx = 1\n",
    "from . import local\nimport os\nx = 1\n",
    "if True:\n    import torch_xla\nx = 1\n",
    "import a as x\nimport a as y\nz = 1\n",
    '"doc"\n\n\n# comment\n\nimport os\n# comment 2\nclass A:\n    pass\n',
    'f"not a docstring"\nimport os\n',
    "import torch\nimport torch_xla  # registers the device\n",
]
IMPORT_LISTS = [
    [("torch_xla", None, None)],
    [("torch_xla.core.xla_model", None, "xm")],
    [("torch_xla.amp", "autocast", None), ("torch_xla.amp", "syncfree", None)],
    [("torch_xla.amp", "syncfree", "s")],
    [("a", None, "x"), ("a", None, "y")],
    [("__future__", "annotations", None), ("os", None, None)],
    [
        ("torch_xla", None, None),
        ("torch_xla.core.xla_model", None, "xm"),
        ("torch_xla.amp", "autocast", None),
        ("torch_xla.amp", "syncfree", "s"),
        ("torch_xla.runtime", "world_size", None),
        ("torch_xla", None, None),
    ],
]


@pytest.mark.parametrize("head", HEADS)
def test_imports_are_added_exactly_where_libcst_adds_them(head):
    """add_imports decides from the module's top lines what libcst's AddImportsVisitor decides from a walk."""
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor
    from xlaport.kb.imports import add_imports

    module = cst.parse_module(head)
    for imports in IMPORT_LISTS:
        context = CodemodContext()
        for name, obj, alias in dict.fromkeys(imports):
            AddImportsVisitor.add_needed_import(context, name, obj, alias)
        expected = module.visit(AddImportsVisitor(context)).code
        assert add_imports(module, imports).code == expected, (head, imports)


IMPORT_LINES = [
    "import os\n",
    "import os, sys\n",
    "import os as o, sys\n",
    "import sys, os as o\n",
    "import a.b as ab, c\n",
    "from m import x\n",
    "from m import x, y\n",
    "from m import y, x\n",
    "from m import (x, y)\n",
    "from m import (\n    x,  # about x\n    y,  # about y\n)\n",
    "from m import (\n    x,  # about x\n    y\n)\n",
    "from m import (  # head\n    x,  # about x\n    y,\n    w,\n)\n",
    "from m import (\n    x,\n    # about y\n    y,\n    w,\n)\n",  # a removed name's comment lines move up
    "from m import (\n    v,\n    x,\n    # about y\n    y,\n)\n",
    "from m import (v, x,\n    # after x\n    y)\n",
    "from m import x as z, y\n",
    "from m import *\n",
    "from . import x\n",
    "from __future__ import annotations\n",
    "import os; x = 1\n",
    "x = 1; import os\n",
    "import os; import sys\n",
    "x = 1\nimport os  # trailing\n",
    "from torch.cuda.amp import GradScaler, autocast\n",
]
REMOVALS = [
    [("os", None, None)],
    [("os", None, "o")],
    [("sys", None, None), ("os", None, "o")],
    [("os", None, None), ("os", None, "o")],  # one alias per module: the last one
    [("a.b", None, "ab")],
    [("m", "x", None)],
    [("m", "y", None)],
    [("m", "x", None), ("m", "y", None)],
    [("m", "x", None), ("m", "w", None)],
    [("m", "x", "z")],
    [("__future__", "annotations", None)],
    [("torch.cuda.amp", "GradScaler", None)],
    [("torch.cuda.amp", "GradScaler", None), ("torch.cuda.amp", "autocast", None)],
]


@pytest.mark.parametrize("text", IMPORT_LINES)
def test_imports_are_removed_from_a_line_exactly_as_libcst_removes_them(text):
    """without_imports makes of one line what libcst's RemoveImportsVisitor makes of it alone."""
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import RemoveImportsVisitor
    from xlaport.kb.imports import without_imports

    line = cst.parse_module(text).body[-1]
    for keys in REMOVALS:
        context = CodemodContext()
        for module, name, alias in keys:
            RemoveImportsVisitor.remove_unused_import(context, module, name, alias)
        alone = RemoveImportsVisitor(context).transform_module(cst.Module(body=[line]))
        ours = without_imports(line, keys)
        if not alone.body:
            assert isinstance(ours, cst.RemovalSentinel), (text, keys)
        else:
            assert cst.Module(body=[ours]).code == alone.code, (text, keys)
