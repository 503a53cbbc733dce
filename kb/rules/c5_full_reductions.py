"""C5 — `amax()` / `amin()` with no dimension: torch_xla 2.9 returns the tensor unreduced."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import expr, method_name, positional_args
from ..rule import IMPORT_TORCH, Rule

SPELLING = {"amax": "max", "amin": "min"}


def _no_dim(args: list[cst.Arg]) -> bool:
    """No dimension given, or an empty one (`dim=()`, `dim=[]`): torch reduces over every dimension."""
    dims = [a for a in args if a.keyword is not None and a.keyword.value == "dim"]
    if any(a.keyword is not None and a.keyword.value not in ("dim",) for a in args):
        return False  # keepdim=True / out=: shapes a human decides
    if dims:
        value = dims[0].value
        return isinstance(value, (cst.Tuple, cst.List)) and not value.elements
    return True


class FullReductionUnreduced(Rule):
    code = "XLA522"
    needs = ("amax", "amin")
    title = "`amax()` / `amin()` over all dimensions returns the tensor unreduced on torch_xla"
    category = "C5"
    fix = "safe"
    autofix = True
    detects = "`x.amax()`, `x.amin()`, `torch.amax(x)`, `torch.amin(x)` with no dimension (or `dim=()`)."
    why = (
        "torch_xla 2.9 treats the missing dimension list as 'reduce nothing': `torch.tensor([1, 3, 2, 0]).to(xla)"
        ".amax()` has shape [4] on XLA and [] on the CPU (measured). The next `.item()` raises 'a Tensor with 4 "
        "elements cannot be converted to Scalar', and arithmetic broadcasts silently. `max()` / `min()` with no "
        "dimension reduce everything on both, with the same value and the same gradient (split evenly between "
        "equal extremes, as amax's)."
    )
    before = "import torch\n\ndef largest(x):\n    return x.amax().item()\n"
    after = "import torch\n\ndef largest(x):\n    return x.max().item()\n"
    message = "`amax()`/`amin()` with no dimension does not reduce on torch_xla 2.9; `max()`/`min()` does"
    symptoms = ("RuntimeError: a Tensor with 4 elements cannot be converted to Scalar",)
    valid = (
        "import torch\n\ndef per_row(x):\n    return x.amax(dim=-1)\n",
        "import torch\n\ndef per_row(x):\n    return torch.amax(x, 1)\n",
        "import torch\n\ndef kept(x):\n    return x.amax(keepdim=True)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = method_name(node)
        if name not in SPELLING or not isinstance(node.func, cst.Attribute):
            return
        qualified = self.call_name(node)
        if qualified in ("torch.amax", "torch.amin"):
            if len(positional_args(node)) == 1 and _no_dim([a for a in node.args if a.keyword is not None]):
                self.report(
                    node, replacement=node.with_changes(func=expr(f"torch.{SPELLING[name]}")), imports=(IMPORT_TORCH,)
                )
            return
        if qualified is not None and not qualified.startswith("torch."):
            return  # a library's own amax (numpy has none as a method; jax arrays do)
        if not positional_args(node) and _no_dim(list(node.args)):
            func = node.func.with_changes(attr=cst.Name(SPELLING[name]))
            self.report(node, replacement=node.with_changes(func=func, args=[]))
