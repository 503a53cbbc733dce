"""The one copy of each small libcst helper the rules share: reading nodes, building nodes, edits of calls.

Nothing here needs a rule's metadata except `whole_statement`, `block_of` and `calls_in`, which take the rule
(any `TreeView`) for its parent and name lookups. The bottom of kb with kb/cst_walk.py: nothing of the analysis or
the rules is imported here.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Protocol

import libcst as cst
from libcst.helpers import get_full_name_for_node

from .cst_walk import children_of

DATALOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
# Functions, classes and lambdas: their bodies do not run where they are written.
SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
TEXT = (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)  # string literals of every kind
# `name=value` with no spaces, as PEP 8 writes keyword arguments.
EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


class TreeView(Protocol):
    """The parent and import-resolved names of a node: what a rule (kb/rule.py `Rule`) knows of its module."""

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None: ...
    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]: ...


# --- reading nodes ---------------------------------------------------------------------
def code_of(node: cst.CSTNode) -> str:
    """The source text of `node`."""
    dotted = _plain_dotted_name(node)
    return dotted if dotted is not None else cst.Module([]).code_for_node(node)


def _plain_dotted_name(node: cst.CSTNode) -> str | None:
    """The text of `a` or `a.b.c` written plainly (no parentheses, no blanks around a dot), else None: what code
    generation gives, without it. Rules compare names by their text (XLA502 looks for its scaler among every name
    and attribute of the module: ~1,700 code generations of a 200-line fix)."""
    parts = []
    while type(node) is cst.Attribute and not node.lpar and not node.attr.lpar and _no_blanks(node.dot):
        parts.append(node.attr.value)
        node = node.value
    if type(node) is not cst.Name or node.lpar:
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def _no_blanks(dot: cst.Dot) -> bool:
    return all(
        type(ws) is cst.SimpleWhitespace and ws.value == "" for ws in (dot.whitespace_before, dot.whitespace_after)
    )


def string_value(node: cst.CSTNode | None) -> str | None:
    """The value of a plain string literal, else None."""
    if type(node) is cst.SimpleString:  # exact types in these small helpers: isinstance goes through ABCMeta
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def is_cuda_string(node: cst.CSTNode | None) -> bool:
    value = string_value(node)
    return value is not None and (value == "cuda" or value.startswith("cuda:"))


def is_literal(node: cst.CSTNode | None, *values: str) -> bool:
    """`True` / `False` / `None` written as a literal name."""
    return isinstance(node, cst.Name) and node.value in values


def keyword_arg(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def positional_args(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def has_star_args(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


def method_name(call: cst.Call) -> str | None:
    """`x.item()` -> "item"; None for plain function calls."""
    func = call.func
    return func.attr.value if type(func) is cst.Attribute else None  # exact type: cheaper than isinstance


def identifier(node: cst.CSTNode) -> str | None:
    """The last identifier of a Name or attribute chain: `self.optimizer` -> "optimizer"."""
    kind = type(node)
    if kind is cst.Name:
        return node.value
    if kind is cst.Attribute:
        return node.attr.value
    return None


def dotted(node: cst.CSTNode | None) -> str | None:
    """`model`, `self.model.encoder` for a Name/Attribute chain, else None."""
    kind = type(node)
    if kind is cst.Name:
        return node.value
    if kind is cst.Attribute:
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def module_name(node: cst.CSTNode | None) -> str:
    """Dotted name of a Name/Attribute node ("" for anything else)."""
    if node is None:
        return ""
    return get_full_name_for_node(node) or ""


@cache
def node_kinds(types: tuple[type, ...]) -> frozenset[type]:
    """The classes whose instances are instances of one of `types` (the types and all their subclasses): a set
    lookup by exact type, instead of isinstance, which goes through ABCMeta's check for every libcst class (~1 us,
    tens of thousands of times per lint)."""
    found: set[type] = set()
    pending = list(types)
    while pending:
        kind = pending.pop()
        if kind not in found:
            found.add(kind)
            pending.extend(kind.__subclasses__())
    return frozenset(found)


def find_nodes(root: cst.CSTNode, *types: type, enter_root: bool = True) -> list:
    """Nodes of `types` inside `root` (root included), in source order, not inside nested defs/lambdas.

    With `enter_root=False` a root that is itself a def/class/lambda is not entered either (a statement
    `def f(): ...` runs none of its body where it stands). A plain walk: a libcst visitor rebuilds every node.
    """
    kinds = node_kinds(types)
    found = []
    stack = [root]
    while stack:
        node = stack.pop()
        if type(node) in kinds:
            found.append(node)
        if type(node) in SCOPES and (node is not root or not enter_root):
            continue
        stack.extend(reversed(children_of(node)))
    return found


def every_call(node: cst.CSTNode) -> Iterator[cst.Call]:
    """Every call inside `node` (itself included, nested functions too), outermost first."""
    if isinstance(node, cst.Call):
        yield node
    for child in children_of(node):
        yield from every_call(child)


def whole_statement(rule: TreeView, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The statement line when `call` is all of it (so deleting the line deletes just the call)."""
    expr_node = rule.parent(call)
    if isinstance(expr_node, cst.Expr):
        line = rule.parent(expr_node)
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return line
    return None


def block_of(rule: TreeView, stmt: cst.CSTNode) -> cst.IndentedBlock | cst.Module | None:
    """The block whose statement list holds `stmt`."""
    parent = rule.parent(stmt)
    return parent if isinstance(parent, (cst.IndentedBlock, cst.Module)) else None


def calls_in(rule: TreeView, root: cst.CSTNode, names: set[str] | frozenset[str]) -> list[cst.Call]:
    """Calls of `names` (qualified) under `root`, not inside nested defs/lambdas."""
    return [c for c in find_nodes(root, cst.Call, enter_root=False) if rule.qualified_names(c.func) & names]


def target_leaves(target: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """What an assignment target binds, one by one: `a, (b, *c) = ...` gives a, b, c (names, attributes, subscripts)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from target_leaves(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from target_leaves(target.value)
    else:
        yield target


def bound_names(root: cst.CSTNode) -> set[str]:
    """Names (and dotted attribute targets) that statements under `root` assign, import or define."""
    bound: set[str] = set()
    kinds = (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.AsName, cst.NamedExpr)
    for node in find_nodes(root, *kinds, enter_root=False):
        target = node.name if isinstance(node, cst.AsName) else node.target
        bound |= {name for leaf in target_leaves(target) if (name := dotted(leaf)) is not None}
    for node in find_nodes(root, cst.Import, cst.ImportFrom, cst.FunctionDef, cst.ClassDef, enter_root=False):
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            bound.add(node.name.value)
        elif not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                if alias.asname is None:
                    bound.add((dotted(alias.name) or "").split(".")[0])
    return bound


def used_names(root: cst.CSTNode) -> set[str]:
    """Names and dotted chains read under `root` (`self.model.to(dev)`: self, self.model, self.model.to, dev)."""
    not_reads = {id(a.attr) for a in find_nodes(root, cst.Attribute)}
    not_reads |= {id(a.keyword) for a in find_nodes(root, cst.Arg) if a.keyword is not None}
    used = set()
    for node in find_nodes(root, cst.Name, cst.Attribute):
        name = dotted(node)
        if name is not None and id(node) not in not_reads:
            used.add(name)
    return used


# --- building nodes --------------------------------------------------------------------
def expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def statements(code: str) -> list[cst.BaseStatement]:
    return list(cst.parse_module(code).body)


def same_quotes(node: cst.SimpleString, value: str) -> cst.SimpleString:
    """A string literal with `node`'s quotes and prefix holding `value`."""
    return cst.SimpleString(f"{node.prefix}{node.quote}{value}{node.quote}")


def parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` wrapped in parentheses when it is an operation (to put `.method()` after it)."""
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


# --- editing calls -----------------------------------------------------------------------
def kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """The argument `name=value`."""
    return cst.Arg(value=value, keyword=cst.Name(name), equal=EQUAL)


def with_commas(args: list[cst.Arg]) -> list[cst.Arg]:
    """Arguments with clean `, ` separators (the last one without)."""
    out = []
    for i, arg in enumerate(args):
        comma = (
            cst.MaybeSentinel.DEFAULT if i == len(args) - 1 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
        out.append(arg.with_changes(comma=comma))
    return out


def call_with(call: cst.Call, func: str, args: list[cst.Arg]) -> cst.Call:
    """`func(args)` with clean `, ` separators, keeping the original call's parentheses whitespace."""
    return call.with_changes(func=expr(func), args=with_commas(args))


def drop_args(call: cst.Call, drop: list[cst.Arg]) -> cst.Call:
    """`call` without the `drop` arguments, keeping the layout of the others."""
    kept = [a for a in call.args if not any(a is d for d in drop)]
    if kept and any(call.args[-1] is d for d in drop):
        last = call.args[-1]  # its comma and the layout before `)` stay
        kept[-1] = kept[-1].with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
    if kept and _left_on_lines_of_their_own(call, kept):
        # `DDP(\n    model)`: what is left fits on the call's line, as a person would have written it
        last = kept[-1].with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
        return call.with_changes(args=[*kept[:-1], last], whitespace_before_args=cst.SimpleWhitespace(""))
    return call.with_changes(args=kept)


def _left_on_lines_of_their_own(call: cst.Call, kept: list[cst.Arg]) -> bool:
    """Do the arguments left after a drop sit on one line of their own between the parentheses, without a
    trailing comma (a trailing comma asks for one argument a line: that layout stays)?"""
    if not isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        return False
    if not isinstance(kept[-1].comma, cst.MaybeSentinel) or "\n" in cst.Module(body=[]).code_for_node(
        kept[-1].whitespace_after_arg
    ):
        return False  # a trailing comma, or `)` on a line of its own: a layout of its own that stays
    empty = cst.Module(body=[])
    inner = [a.with_changes(whitespace_after_arg=cst.SimpleWhitespace("")) for a in kept]
    return not any("\n" in empty.code_for_node(a) for a in inner)


def add_kwarg(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value` appended (one-per-line layouts stay one per line)."""
    new = kwarg(name, value)
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # trailing comma: the new argument takes its place
        before = args[-2].comma if len(args) > 1 else cst.Comma(whitespace_after=call.whitespace_before_args)
        args[-1] = last.with_changes(comma=before)
        new = new.with_changes(comma=last.comma)
    else:
        # the layout after the last argument (`\n    )`) moves behind the new one; one-per-line stays so
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        one_per_line = isinstance(last.whitespace_after_arg, cst.ParenthesizedWhitespace)
        if one_per_line and len(args) > 1 and isinstance(args[-2].comma, cst.Comma):
            separator = args[-2].comma
        args[-1] = last.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
        new = new.with_changes(whitespace_after_arg=last.whitespace_after_arg)
    return call.with_changes(args=[*args, new])


def bound_arguments(call: cst.Call, positions: tuple[str, ...]) -> dict[str, cst.BaseExpression]:
    """Parameter name -> argument value of `call`, positional arguments named by `positions`."""
    given = dict(zip(positions, [a.value for a in positional_args(call)], strict=False))
    given.update({a.keyword.value: a.value for a in call.args if a.keyword is not None})
    return given


def launch_arguments(given: dict[str, cst.BaseExpression]) -> list[cst.Arg]:
    """`torch_xla.launch` arguments for a spawn call's `fn`, `args` and `start_method` (spawn is the default)."""
    args = [cst.Arg(given["fn"])]
    if "args" in given:
        args.append(kwarg("args", given["args"]))
    start = given.get("start_method")
    if start is not None and string_value(start) != "spawn":
        args.append(kwarg("start_method", start))
    return args
