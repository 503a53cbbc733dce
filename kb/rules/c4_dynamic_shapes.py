"""C4 — data-dependent shapes: boolean masks and ops whose output size depends on values compile a graph per shape."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import identifier, method_name
from ..step_rule import ORDER_OPS, StepContextRule


class _MaskRule(StepContextRule):
    def is_mask(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """A boolean mask index: `x > 0`, `mask`, `~mask`, `a & b`, `m.bool()`, `torch.isnan(x)`,
        or a name assigned from one (`keep = labels != -100`)."""
        if depth > 4:
            return False
        if isinstance(node, cst.Comparison):
            return all(isinstance(c.operator, ORDER_OPS) for c in node.comparisons)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            return self.is_mask(node.expression, depth + 1)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
            return self.is_mask(node.left, depth + 1) or self.is_mask(node.right, depth + 1)
        if isinstance(node, (cst.Name, cst.Attribute)) and (identifier(node) or "").lower().endswith("mask"):
            return True
        if isinstance(node, cst.Name):
            return any(self.is_mask(v, depth + 1) for v in self.assigned_values(node))
        if isinstance(node, cst.Call):
            if method_name(node) == "bool":
                return True
            return self.is_call_to(
                node,
                "torch.isnan",
                "torch.isinf",
                "torch.isfinite",
                "torch.logical_and",
                "torch.logical_or",
                "torch.logical_not",
            )
        return False

    def mask_index(self, node: cst.Subscript) -> cst.BaseExpression | None:
        # the index first: most subscripts have no mask, and it is the cheapest question
        indexes = [e.slice.value for e in node.slice if isinstance(e.slice, cst.Index)]
        mask = next((index for index in indexes if self.is_mask(index)), None)
        if mask is None or not self.facts().uses("torch"):
            return None
        if self.is_host_value(node.value) or not self.in_device_context(node):
            return None
        return mask

    def is_store(self, node: cst.Subscript) -> bool:
        parent = self.parent(node)
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or isinstance(parent, cst.Del)


MASK_ALTERNATIVES = (
    "keep shapes static: `torch.where(mask, x, 0)`, `x * mask`, `x.masked_fill(~mask, v)`, "
    "masked sums `(x * mask).sum() / mask.sum()`"
)


class BooleanMaskIndexing(_MaskRule):
    code = "XLA409"
    title = "Boolean-mask indexing `x[mask]` has a data-dependent shape"
    category = "C4"
    fix = "manual"
    detects = (
        "Reads like `x[mask]`, `x[x > 0]`, `logits[labels != -100]`, `x[:, ~pad_mask]` in the training loop or "
        "model code (not in Dataset / collate code, which runs on the CPU)."
    )
    why = (
        "The result's size depends on the mask's values. XLA needs static shapes: it computes the mask on the "
        "host (`aten::nonzero` CPU fallback, a device-to-host sync) and compiles a new graph for every distinct "
        "count of True values."
    )
    before = (
        "import torch\n\n"
        "class Head(torch.nn.Module):\n"
        "    def forward(self, logits, labels):\n"
        "        return logits[labels != -100].mean()\n"
    )
    message = f"`x[mask]` has a data-dependent shape (`aten::nonzero` fallback + recompiles); {MASK_ALTERNATIVES}"
    symptoms = (
        "aten::nonzero",
        "pt-xla-profiler: Op(s) not lowered: aten::nonzero",
        "pt-xla-profiler: CompileTime too frequent",
    )
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats 1", "pytorch/xla#4248")
    valid = (
        "import numpy as np\narr = np.arange(5)\npos = arr[arr > 2]\n",
        "import torch\nclass DS(torch.utils.data.Dataset):\n    def __getitem__(self, i):\n"
        "        t = self.items[i]\n        return t[t > 0]\n",
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x, idx):\n        return x[idx]\n",
    )

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if not self.is_store(node) and self.mask_index(node) is not None:
            self.report(node)


class BooleanMaskAssignment(_MaskRule):
    code = "XLA410"
    title = "Boolean-mask assignment `x[mask] = v` runs a dynamic `index_put`"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "Assignments through a boolean mask (`x[mask] = v`, `x[x < 0] = 0`, `labels[pad_mask] = -100`) in device "
        "code. `x[x <cmp> ...] = <number>` is rewritten to `x.masked_fill_(x <cmp> ..., <number>)`; other masks or "
        "values are reported for a manual rewrite."
    )
    why = (
        "Masked assignment lowers to `index_put` with the mask's nonzero indices: XLA evaluates the mask early "
        "(`aten::nonzero`, a host sync) and the graph depends on how many elements are True, so it recompiles. "
        "`masked_fill_` / `torch.where(mask, v, x)` keep the shape static."
    )
    before = (
        "import torch\n\n"
        "class Relu(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        x = x.clone()\n"
        "        x[x < 0] = 0.0\n"
        "        return x\n"
    )
    after = (
        "import torch\n\n"
        "class Relu(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        x = x.clone()\n"
        "        x.masked_fill_(x < 0, 0.0)\n"
        "        return x\n"
    )
    message = (
        "`x[mask] = v` is a dynamic index_put (`aten::nonzero`); use `x.masked_fill_(mask, v)` when mask has x's "
        "shape, or `x = torch.where(mask, v, x)`"
    )
    symptoms = ("aten::nonzero", "pt-xla-profiler: Op(s) not lowered: aten::nonzero")
    references = ("pytorch/xla#4248",)
    valid = (
        "import torch\ndef f(x):\n    x.masked_fill_(x < 0, 0.0)\n    return x\n",
        "import torch\ndef f(x, i):\n    x[i] = 0\n    return x\n",
    )

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Subscript):
            return
        target = node.targets[0].target
        mask = self.mask_index(target)
        if mask is None:
            return
        stmt = self.parent(node)
        if self._same_shape_mask(target, mask) and _is_number(node.value) and isinstance(stmt, cst.SimpleStatementLine):
            call = cst.Call(
                func=cst.Attribute(value=target.value, attr=cst.Name("masked_fill_")),
                args=[
                    cst.Arg(mask, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(node.value),
                ],
            )
            self.report(node, replacement=cst.Expr(call))
        else:
            self.report(node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Subscript) and self.mask_index(node.target) is not None:
            self.report(node)

    def _same_shape_mask(self, target: cst.Subscript, mask: cst.BaseExpression) -> bool:
        """`x[x < 0]`: a comparison on the indexed tensor itself has exactly its shape."""
        return (
            len(target.slice) == 1
            and isinstance(mask, cst.Comparison)
            and target.value.deep_equals(mask.left)
            and isinstance(target.value, (cst.Name, cst.Attribute))
        )


def _is_number(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float))


DYNAMIC_SHAPE_FUNCTIONS = {
    "torch.nonzero": "aten::nonzero",
    "torch.argwhere": "aten::nonzero",
    "torch.masked_select": "aten::masked_select",
    "torch.unique": "aten::_unique2",
    "torch.unique_consecutive": "aten::unique_consecutive",
}


DYNAMIC_SHAPE_METHODS = {
    "nonzero": "aten::nonzero",
    "argwhere": "aten::nonzero",
    "masked_select": "aten::masked_select",
    "unique": "aten::_unique2",
    "unique_consecutive": "aten::unique_consecutive",
}


class DataDependentShapeOp(StepContextRule):
    code = "XLA411"
    needs = ("nonzero", "argwhere", "masked_select", "unique", "where")
    title = "`nonzero` / `masked_select` / `unique` / one-argument `torch.where` have data-dependent shapes"
    category = "C4"
    fix = "manual"
    detects = (
        "`torch.nonzero`, `torch.argwhere`, `torch.where(cond)` with one argument, `torch.masked_select`, "
        "`torch.unique`, `torch.unique_consecutive` and their method forms, in device code."
    )
    why = (
        "Their output size depends on the data. In torch_xla 2.9 they run on the CPU (`aten::nonzero`, "
        "`aten::masked_select`, `aten::_unique2`, `aten::unique_consecutive` counters), which syncs the device, "
        "and each new result size compiles a new graph."
    )
    before = (
        "import torch\n\n"
        "class Pool(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        idx = torch.nonzero(x > 0)\n"
        "        return x[idx[:, 0]]\n"
    )
    message = (
        "data-dependent output shape (CPU fallback + a new graph per size); use fixed-size forms: "
        "`torch.where(cond, a, b)`, `masked_fill`, multiply by the mask, `topk` with a fixed k"
    )
    symptoms = (
        "aten::nonzero",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_consecutive",
        "pt-xla-profiler: Op(s) not lowered: aten::nonzero",
    )
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats 1", "pytorch/xla#4248")
    valid = (
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, c, a, b):\n        return torch.where(c, a, b)\n",
        "import numpy as np\nidx = np.arange(3).nonzero()\n",
        "import torch\ndef collate(batch):\n    return torch.unique(torch.tensor(batch))\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        op = next((DYNAMIC_SHAPE_FUNCTIONS[n] for n in names if n in DYNAMIC_SHAPE_FUNCTIONS), None)
        if op is None and "torch.where" in names and len(node.args) == 1 and node.args[0].keyword is None:
            op = "aten::nonzero"
        if op is None and method_name(node) in DYNAMIC_SHAPE_METHODS and not self._is_torch_function(node.func):
            if not self.is_host_value(node.func.value):
                op = DYNAMIC_SHAPE_METHODS[method_name(node)]
        if op is not None and self.in_device_context(node):
            self.report(node, f"{self.message} [{op}]")
