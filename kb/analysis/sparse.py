"""Sparse tensors in one module: a value built by a sparse constructor, `.to_sparse()`, a name every assignment
of which is one, or a call of one of the module's own functions every `return` of which is one
(`adj = to_torch_sparse(matrix)` with `def to_torch_sparse(m): ... return torch.sparse.FloatTensor(...)`).
torch_xla has no sparse kernels, so such a value must not be moved to the device as it is."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ..cst_helpers import find_nodes, method_name

if TYPE_CHECKING:
    from .view import ScopedView

SPARSE_BUILDERS = frozenset(
    {
        "torch.sparse_coo_tensor",
        "torch.sparse_csr_tensor",
        "torch.sparse_csc_tensor",
        "torch.sparse_bsr_tensor",
        "torch.sparse.FloatTensor",
        "torch.sparse.DoubleTensor",
        "torch.sparse.LongTensor",
    }
)
SPARSE_METHODS = frozenset({"to_sparse", "to_sparse_csr", "to_sparse_csc", "to_sparse_coo"})
# matmuls whose first operand is sparse: `torch.spmm(adj, x)` (graph convolutions)
SPARSE_MATMULS = frozenset({"torch.spmm", "torch.sparse.mm", "torch.sparse.addmm", "torch.smm", "torch.hspmm"})
# methods that give a tensor of the receiver's layout: `to_torch_sparse(m).float()` is sparse too
KEEPS_LAYOUT = frozenset({"float", "double", "half", "bfloat16", "coalesce", "detach", "clone", "requires_grad_"})
MAX_DEPTH = 3


def is_sparse(rule: ScopedView, node: cst.CSTNode, depth: int = 0) -> bool:
    """Is `node` a sparse tensor, as far as this module shows?"""
    if isinstance(node, cst.Call):
        if rule.qualified_names(node.func) & SPARSE_BUILDERS or method_name(node) in SPARSE_METHODS:
            return True
        if method_name(node) in KEEPS_LAYOUT and isinstance(node.func, cst.Attribute):
            return depth < MAX_DEPTH and is_sparse(rule, node.func.value, depth + 1)
        return depth < MAX_DEPTH and _returns_sparse(rule, node, depth + 1)
    if isinstance(node, cst.Name) and depth < MAX_DEPTH:
        values = rule.assigned_values(node)
        return (
            bool(values)
            and all(is_sparse(rule, v, depth + 1) or _same_name(v, node) for v in values)
            and any(is_sparse(rule, v, depth + 1) for v in values)
        )
    return False


def _returns_sparse(rule: ScopedView, call: cst.Call, depth: int) -> bool:
    """A call of a function defined at this module's top level whose every `return` gives a sparse tensor."""
    if not isinstance(call.func, cst.Name) or call.func.value in rule.analysis.names().imported_heads:
        return False  # an import, or not a plain name (a tree summary names the module's own functions too)
    name = call.func.value
    for stmt in rule.analysis.module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            returns = [r.value for r in find_nodes(stmt.body, cst.Return)]  # not those of nested functions
            return bool(returns) and all(v is not None and is_sparse(rule, v, depth) for v in returns)
    return False


def _same_name(value: cst.CSTNode, name: cst.Name) -> bool:
    """`adj = adj.to(device)`: the name's own move, not another value."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        value = value.func.value
    return isinstance(value, cst.Name) and value.value == name.value
