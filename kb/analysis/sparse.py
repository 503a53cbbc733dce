"""Sparse tensors: a value built by a sparse constructor, `.to_sparse()`, a name every assignment of which is one,
or a call of one of the module's own functions every `return` of which is one (`adj = to_torch_sparse(matrix)`
with `def to_torch_sparse(m): ... return torch.sparse.FloatTensor(...)`). Across a tree's modules: a name unpacked
from a call of another module's function whose return holds a sparse tensor at that place (`adj, features, labels
= load_data()` in train.py, `load_data` in utils.py returning `adj` last built by a sparse constructor), from the
tree summary (`sparse_returns`). torch_xla has no sparse kernels, so such a value must not be moved to the device
as it is."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ..cst_helpers import find_nodes, method_name
from .project import absolute_names, definition_name

if TYPE_CHECKING:
    from .view import ScopedView, StepView

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


WHOLE = -1  # a function's return value itself, not one item of a returned tuple


def is_sparse(rule: ScopedView, node: cst.CSTNode, depth: int = 0) -> bool:
    """Is `node` a sparse tensor, as far as this module and its tree's summary show?"""
    if isinstance(node, cst.Call):
        if rule.qualified_names(node.func) & SPARSE_BUILDERS or method_name(node) in SPARSE_METHODS:
            return True
        if method_name(node) in KEEPS_LAYOUT and isinstance(node.func, cst.Attribute):
            return depth < MAX_DEPTH and is_sparse(rule, node.func.value, depth + 1)
        return depth < MAX_DEPTH and _returns_sparse(rule, node, WHOLE, depth + 1)
    if isinstance(node, cst.Name) and depth < MAX_DEPTH:
        values = rule.assigned_values(node)
        unpacked = [_returns_sparse(rule, call, index, depth + 1) for call, index in _unpacked_from(rule, node)]
        if not (values or unpacked) or not all(unpacked):
            return False
        return all(is_sparse(rule, v, depth + 1) or _same_name(v, node) for v in values) and (
            bool(unpacked) or any(is_sparse(rule, v, depth + 1) for v in values)
        )
    return False


def _returns_sparse(rule: ScopedView, call: cst.Call, index: int, depth: int) -> bool:
    """A call of a function defined at this module's top level whose every `return` gives a sparse tensor (its
    `index`-th item for a tuple), or of another module's function the tree summary says does."""
    if isinstance(call.func, cst.Name) and not rule.qualified_names(call.func):
        for stmt in rule.analysis.module.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == call.func.value:
                return index in _sparse_positions(rule, stmt, depth)
        # not defined here: a star import's (`from utils import *`), which the tree summary may know
    project = rule.analysis.project
    if project is None or not project.sparse_returns:
        return False
    names = {project.resolve(n) for n in absolute_names(rule, call.func)} - {None}
    return any((name, index) in project.sparse_returns for name in names)


def _sparse_positions(rule: ScopedView, func: cst.FunctionDef, depth: int) -> set[int]:
    """Where every `return` of `func` holds a sparse tensor: WHOLE, or the positions of the returned tuples."""
    returns = [r for r in find_nodes(func.body, cst.Return) if r.value is not None]  # not nested functions'
    if not returns or any(r.value is None for r in find_nodes(func.body, cst.Return)):
        return set()
    found: set[int] | None = None
    for ret in returns:
        value = ret.value
        items = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        positions = {
            i if isinstance(value, cst.Tuple) else WHOLE
            for i, item in enumerate(items)
            if _sparse_when_returned(rule, item, ret, depth)
        }
        found = positions if found is None else found & positions
    return found or set()


def _sparse_when_returned(rule: ScopedView, item: cst.CSTNode, ret: cst.Return, depth: int) -> bool:
    """Is `item` of `return ...` sparse there: a sparse value, or a name whose last assignment before the return,
    in the function's own body (not under a condition or a loop), is one (`adj = to_sparse(adj)` after dense
    normalisations of `adj`)."""
    if is_sparse(rule, item, depth):
        return True
    if not isinstance(item, cst.Name):
        return False
    block = rule.parent(rule.parent(ret))  # Return -> SimpleStatementLine -> the block
    body = list(getattr(block, "body", ()))
    line = rule.parent(ret)
    before = body[: next((i for i, s in enumerate(body) if s is line), 0)]
    for stmt in reversed(before):
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False  # an `if` or a loop between: no single last value
        for small in reversed(stmt.body):
            if isinstance(small, cst.Assign) and any(
                isinstance(t.target, cst.Name) and t.target.value == item.value for t in small.targets
            ):
                return is_sparse(rule, small.value, depth)
    return False


def _unpacked_from(rule: ScopedView, name: cst.Name) -> list[tuple[cst.Call, int]]:
    """(call, position) of each `a, b = f(...)` in `name`'s scope that binds `name` at that position."""
    scope = rule.scope_node(name)
    found = []
    for assign in rule.analysis.nodes.assigns:
        if not isinstance(assign, cst.Assign) or not isinstance(assign.value, cst.Call):
            continue
        for target in assign.targets:
            if not isinstance(target.target, (cst.Tuple, cst.List)):
                continue
            for i, element in enumerate(target.target.elements):
                if isinstance(element.value, cst.Name) and element.value.value == name.value:
                    if rule.scope_node(assign) is scope:
                        found.append((assign.value, i))
    return found


def sparse_returns(rule: StepView) -> frozenset[tuple[str, int]]:
    """What this module tells its tree: (function, position) for each top-level function whose every return holds
    a sparse tensor there (WHOLE: the value itself). Only modules that name something sparse are read."""
    if not any(_names_sparse(c.func) for c in rule.analysis.nodes.calls):
        return frozenset()
    found = set()
    for stmt in rule.analysis.module.body:
        if isinstance(stmt, cst.FunctionDef):
            found |= {(definition_name(rule, stmt), i) for i in _sparse_positions(rule, stmt, 1)}
    return frozenset(found)


def _names_sparse(func: cst.CSTNode) -> bool:
    """Does a call's name say sparse (`torch.sparse.FloatTensor`, `x.to_sparse`, `to_torch_sparse`)?"""
    while isinstance(func, cst.Attribute):
        if "sparse" in func.attr.value.lower():
            return True
        func = func.value
    return isinstance(func, cst.Name) and "sparse" in func.value.lower()


def _same_name(value: cst.CSTNode, name: cst.Name) -> bool:
    """`adj = adj.to(device)`: the name's own move, not another value."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        value = value.func.value
    return isinstance(value, cst.Name) and value.value == name.value
