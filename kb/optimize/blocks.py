"""What the optimization families share: line positions, parents, and swapping statements of a block."""

from __future__ import annotations

import builtins
from collections.abc import Iterator

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from ..cst_helpers import find_nodes, target_leaves

BUILTINS = frozenset(dir(builtins))
LOOPS = (cst.For, cst.While)
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
# calls that make a training step or end one: a block holding one is not logging
STEP_CALLS = frozenset({"backward", "step", "zero_grad", "sync", "mark_step", "optimizer_step"})
BARRIERS = frozenset({"sync", "mark_step", "optimizer_step"})


class Tree:
    """A parsed module with each node's parent and source lines (1-based, inclusive)."""

    def __init__(self, source: str) -> None:
        wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        self.module = wrapper.module
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.positions = wrapper.resolve(PositionProvider)

    def lines(self, node: cst.CSTNode) -> tuple[int, int]:
        where = self.positions[node]
        return where.start.line, where.end.line

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def statement_at(self, line: int) -> cst.SimpleStatementLine | None:
        """The innermost simple statement whose lines hold `line`."""
        found = None
        for node in _all_simple_statements(self.module):
            start, end = self.lines(node)
            if start <= line <= end:
                found = node
        return found

    def enclosing_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        """The nearest loop above `node` in the same function."""
        for above in self.ancestors(node):
            if isinstance(above, SCOPES):
                return None
            if isinstance(above, LOOPS):
                return above
        return None

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for above in self.ancestors(node):
            if isinstance(above, cst.FunctionDef):
                return above
        return None


def _all_simple_statements(root: cst.CSTNode) -> Iterator[cst.SimpleStatementLine]:
    """Every simple statement line, nested functions included."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.SimpleStatementLine):
            yield node
            continue
        stack.extend(reversed(node.children))


def call_names(root: cst.CSTNode) -> set[str]:
    """The last name of every call under `root` (`self.opt.step()` -> "step"), not inside nested defs."""
    names = set()
    for call in find_nodes(root, cst.Call):
        func = call.func
        if isinstance(func, cst.Attribute):
            names.add(func.attr.value)
        elif isinstance(func, cst.Name):
            names.add(func.value)
    return names


def has_flow_exit(nodes: list[cst.CSTNode]) -> bool:
    """A `break`, `continue`, `return`, `yield` or `await` that would leave (or suspend) the code it stands in."""
    kinds = (cst.Break, cst.Continue, cst.Return, cst.Yield, cst.Await)
    return any(find_nodes(node, *kinds) for node in nodes)


def names_in(nodes: list[cst.CSTNode]) -> list[cst.Name]:
    """Every `Name` node under `nodes` that names a variable (not an attribute or a keyword), nested defs too."""
    found: list[cst.Name] = []
    for root in nodes:
        skip = {id(a.attr) for a in _walk(root, cst.Attribute)}
        skip |= {id(a.keyword) for a in _walk(root, cst.Arg) if a.keyword is not None}
        found += [n for n in _walk(root, cst.Name) if id(n) not in skip]
    return found


def _walk(root: cst.CSTNode, kind: type) -> Iterator:
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            yield node
        stack.extend(reversed(node.children))


def assigned_names(nodes: list[cst.CSTNode]) -> set[str]:
    """Plain names the statements bind (`x = ...`, `x += ...`, `for x in`, `with ... as x`), not attributes."""
    bound: set[str] = set()
    for root in nodes:
        for node in find_nodes(root, cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.AsName):
            target = node.name if isinstance(node, cst.AsName) else node.target
            bound |= {leaf.value for leaf in target_leaves(target) if isinstance(leaf, cst.Name)}
    return bound


def imported_names(module: cst.Module) -> set[str]:
    """Names bound by an import anywhere in the module."""
    names = set()
    for node in _walk(module, (cst.Import, cst.ImportFrom)):
        if isinstance(node.names, cst.ImportStar):
            continue
        for alias in node.names:
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                names.add(alias.asname.name.value)
            else:
                names.add(cst.Module([]).code_for_node(alias.name).split(".")[0])
    return names


def xm_alias(module: cst.Module) -> str | None:
    """The name `torch_xla.core.xla_model` is imported as (`xm`), if it is."""
    for node in _walk(module, cst.Import):
        for alias in node.names:
            if cst.Module([]).code_for_node(alias.name) == "torch_xla.core.xla_model" and alias.asname is not None:
                return alias.asname.name.value
    return None


class BlockEdit(cst.CSTTransformer):
    """Replaces statements of blocks, matched by identity (`id` of the original node): each key of `swap` by its
    list of statements; `after` adds statements after a (possibly rebuilt) statement."""

    def __init__(
        self, swap: dict[int, list[cst.BaseStatement]], after: dict[int, list[cst.BaseStatement]] | None = None
    ) -> None:
        super().__init__()
        self.swap = swap
        self.after = after or {}

    def _rebuilt(self, original, updated):
        body = []
        for old, new in zip(original.body, updated.body, strict=True):
            body.extend(self.swap.get(id(old), [new]))
            body.extend(self.after.get(id(old), []))
        return updated.with_changes(body=body)

    def leave_IndentedBlock(self, original_node, updated_node):  # noqa: N802 (libcst's names)
        return self._rebuilt(original_node, updated_node)

    def leave_Module(self, original_node, updated_node):  # noqa: N802
        return self._rebuilt(original_node, updated_node)
