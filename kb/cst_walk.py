"""Walking a libcst tree the cheap way: the children of a node in syntax order, without layout nodes, read from
the dataclass fields (~10x cheaper than a libcst visitor, which rebuilds every node). The bottom of kb: it imports
nothing of xlaport."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from dataclasses import fields
from functools import cache
from typing import Literal, get_args, get_origin

import libcst as cst

# Nodes that only hold layout and punctuation: whitespace, comments, commas, brackets, dots, operators. About two
# thirds of a module's nodes; no analysis reaches them through the tree (an operator is read as its expression's
# `operator` field), so the walks below leave them out, and a rule cannot visit them (see engine._visit_batched).
LAYOUT: tuple[type[cst.CSTNode], ...] = (
    cst.BaseParenthesizableWhitespace,
    cst.Newline,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Comment,
    cst.Comma,
    cst.Dot,
    cst.Colon,
    cst.Semicolon,
    cst.AssignEqual,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.ImportStar,
    cst.ParamStar,
    cst.ParamSlash,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
    cst.BaseAugOp,
)


@cache
def _node_fields(node_type: type) -> tuple[str, ...]:
    """The fields of a node type that can hold a walked node (not only LAYOUT ones), in the order libcst visits
    them (its syntax order), read once from the `visit_*(self, "field", ...)` calls of the type's
    `_visit_and_replace_children`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(node_type._visit_and_replace_children)))
    visits = [
        call
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id.startswith("visit_")
        and len(call.args) >= 2
        and isinstance(call.args[1], ast.Constant)
    ]
    ordered = [c.args[1].value for c in sorted(visits, key=lambda c: (c.lineno, c.col_offset))]
    names = [f.name for f in fields(node_type) if _may_hold_walked(f.type)]
    return tuple(dict.fromkeys([*(n for n in ordered if n in names), *names]))


def _may_hold_walked(annotation: object) -> bool:
    """Can a field declared as `annotation` (`Sequence[Arg]`, `Union[Comma, MaybeSentinel]`, ...) hold a node
    that is not LAYOUT? Unknown forms (a forward reference) count as yes."""
    if isinstance(annotation, type):
        return issubclass(annotation, cst.CSTNode) and not issubclass(annotation, LAYOUT)
    if get_origin(annotation) is Literal:
        return False
    parts = get_args(annotation)
    return any(_may_hold_walked(part) for part in parts) if parts else annotation is not type(None)


def _is_walked(kind: type) -> bool:
    return issubclass(kind, cst.CSTNode) and not issubclass(kind, LAYOUT)


# type -> walked or not, and node type -> its fields (`_node_fields`): plain dicts, read once per node and child
# (a dict look-up is cheaper than a call of a cached function: the walks below run over every node of a tree)
_WALKED: dict[type, bool] = {}
_FIELDS: dict[type, tuple[str, ...]] = {}


def children_of(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The children of `node` in syntax order, without LAYOUT nodes (a list: cheaper than a generator here)."""
    children = []
    kind = type(node)
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = _node_fields(kind)
    for name in names:
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            for item in value:
                walked = _WALKED.get(type(item))
                if walked is None:
                    walked = _WALKED[type(item)] = _is_walked(type(item))
                if walked:
                    children.append(item)
        else:
            walked = _WALKED.get(kind)
            if walked is None:
                walked = _WALKED[kind] = _is_walked(kind)
            if walked:
                children.append(value)
    return children


def walk(root: cst.CSTNode, skip: tuple[type, ...] = ()) -> Iterator[cst.CSTNode]:
    """`root` and the nodes under it, in syntax order; nodes of the `skip` types (exact types) below `root`
    are left out with everything under them."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node is not root and type(node) in skip:
            continue
        yield node
        stack.extend(reversed(children_of(node)))


_WALKS: dict[int, tuple[cst.Module, list[cst.CSTNode], dict[cst.CSTNode, cst.CSTNode], list[int]]] = {}


def module_walk(module: cst.Module) -> tuple[list[cst.CSTNode], dict[cst.CSTNode, cst.CSTNode]]:
    """Every node of `module` in syntax order (module first), and child -> parent for every node but the
    module, in the order libcst's ParentNodeProvider fills it (a node's children are added when the walk
    leaves it). One plain walk per module, shared by the analyses that need it (the last few modules are
    kept). Reading dataclass fields is ~10x cheaper than a libcst visitor, which rebuilds every node."""
    walked = _walk(module)
    return walked[1], walked[2]


def node_depths(module: cst.Module) -> list[int]:
    """The depth of each node of `module_walk(module)`'s list (the module is 0): a batched visit leaves a node
    when the next one is not deeper. (libcst shares some leaf nodes between parents, so the parent map cannot
    tell where a subtree ends.)"""
    return _walk(module)[3]


def _walk(module: cst.Module) -> tuple[cst.Module, list[cst.CSTNode], dict[cst.CSTNode, cst.CSTNode], list[int]]:
    cached = _WALKS.get(id(module))
    if cached is not None and cached[0] is module:
        return cached
    nodes: list[cst.CSTNode] = []
    depths: list[int] = []
    parents: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[tuple[cst.CSTNode, list[cst.CSTNode] | None, int]] = [(module, None, 0)]
    while stack:
        node, kids, depth = stack.pop()
        if kids is None:
            nodes.append(node)
            depths.append(depth)
            kids = children_of(node)
            if kids:  # a leaf (half the nodes) has no children to give a parent when the walk leaves it
                stack.append((node, kids, depth))
                stack.extend([(kid, None, depth + 1) for kid in reversed(kids)])
        else:
            for kid in kids:
                parents[kid] = node
    return remember_walk(module, nodes, parents, depths)


def remember_walk(
    module: cst.Module, nodes: list[cst.CSTNode], parents: dict[cst.CSTNode, cst.CSTNode], depths: list[int]
) -> tuple[cst.Module, list[cst.CSTNode], dict[cst.CSTNode, cst.CSTNode], list[int]]:
    """Keeps `module`'s walk (one of the last few) for the analyses that walk it next. A tree's lint walks every
    module for the tree's summary first, so by the time a module is linted its walk has left this cache: the
    module's analysis, which kept it, hands it back here (kb/analysis/module.py `next_pass`)."""
    cached = _WALKS.get(id(module))
    if cached is not None and cached[0] is module:
        return cached
    if len(_WALKS) >= 4:
        _WALKS.pop(next(iter(_WALKS)))
    _WALKS[id(module)] = walked = (module, nodes, parents, depths)
    return walked


def parent_map(module: cst.Module) -> dict[cst.CSTNode, cst.CSTNode]:
    """Child -> parent for every node but the module (see `module_walk`)."""
    return module_walk(module)[1]
