"""Processes started by `torch_xla.launch`: the world size a GPU script counts in the parent and hands to the
launched function. On XLA nothing can count the processes before the launch (counting starts the runtime,
and a started runtime makes the launch fail), so the launched function reads `xr.world_size()` itself."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..cst_helpers import bound_arguments, expr, find_nodes
from .view import RuleView

XLA_LAUNCHES = frozenset({"torch_xla.launch", "torch_xla.torch_xla.launch"})
LAUNCH_POSITIONS = ("fn", "args")


@dataclass
class WorldSizeMove:
    """`n = torch.cuda.device_count()` ... `torch_xla.launch(fn, args=(n, ...))` with `def fn(rank, n, ...)`."""

    assignment: cst.SimpleStatementLine  # `n = <count>`: removed
    args: cst.Tuple  # the launch's args: loses `n`
    new_args: cst.Tuple
    params: cst.Parameters  # fn's parameters: lose `n`
    new_params: cst.Parameters
    first: cst.BaseStatement  # fn's first statement (after its docstring): `n = xr.world_size()` goes above it
    new_first: cst.FlattenSentinel
    function: str


def world_size_move(rule: RuleView, count: cst.Call) -> WorldSizeMove | None:
    """The rewrite that reads the count inside the launched function, when the count is assigned to a name whose
    only use is one element of a `torch_xla.launch` `args` tuple, and the launched function is defined in this
    module and called nowhere else. None otherwise."""
    assign = rule.parent(count)
    line = rule.parent(assign)
    if not (
        isinstance(assign, cst.Assign)
        and assign.value is count
        and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)
        and isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
    ):
        return None
    name = assign.targets[0].target.value
    scope = next((a for a in rule.ancestors(line) if isinstance(a, (cst.FunctionDef, cst.Module))), None)
    uses = [n for n in _reads(scope) if n.value == name and n is not assign.targets[0].target]
    if len(uses) != 1:
        return None
    args, launch = _launch_tuple(rule, uses[0])
    if args is None or launch is None:
        return None
    position = next(k for k, e in enumerate(args.elements) if e.value is uses[0])
    function = _launched_function(rule, launch)
    if function is None or position + 1 >= len(function.params.params):
        return None
    param = function.params.params[position + 1]
    if param.default is not None or param.name.value != name:
        return None  # the function calls it something else: keep its own name in view, report instead
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
    first_index = 1 if body and _is_docstring(body[0]) else 0
    if first_index >= len(body):
        return None
    first = body[first_index]
    rebind = cst.SimpleStatementLine(
        [cst.Assign([cst.AssignTarget(cst.Name(name))], expr("xr.world_size()"))], leading_lines=()
    )
    return WorldSizeMove(
        assignment=line,
        args=args,
        new_args=_without(args, position),
        params=function.params,
        new_params=function.params.with_changes(params=_drop_param(function.params.params, position + 1)),
        first=first,
        new_first=cst.FlattenSentinel([rebind, first]),  # comments above `first` stay with it
        function=function.name.value,
    )


def _reads(scope: cst.CSTNode | None) -> list[cst.Name]:
    """Plain names in `scope` (not attribute parts or keyword names), outside nested functions."""
    if scope is None:
        return []
    skip = {id(a.attr) for a in find_nodes(scope, cst.Attribute)}
    skip |= {id(a.keyword) for a in find_nodes(scope, cst.Arg) if a.keyword is not None}
    return [n for n in find_nodes(scope, cst.Name) if id(n) not in skip]


def _launch_tuple(rule: RuleView, use: cst.Name) -> tuple[cst.Tuple | None, cst.Call | None]:
    element = rule.parent(use)
    args = rule.parent(element) if isinstance(element, cst.Element) else None
    arg = rule.parent(args) if isinstance(args, cst.Tuple) else None
    launch = rule.parent(arg) if isinstance(arg, cst.Arg) else None
    if not (isinstance(launch, cst.Call) and rule.qualified_names(launch.func) & XLA_LAUNCHES):
        return None, None
    if bound_arguments(launch, LAUNCH_POSITIONS).get("args") is not args:
        return None, None
    return args, launch


def _launched_function(rule: RuleView, launch: cst.Call) -> cst.FunctionDef | None:
    fn = bound_arguments(launch, LAUNCH_POSITIONS).get("fn")
    if not isinstance(fn, cst.Name):
        return None
    module = next((a for a in rule.ancestors(launch) if isinstance(a, cst.Module)), None)
    defs = [f for f in find_nodes(module, cst.FunctionDef) if f.name.value == fn.value] if module else []
    mentions = [n for n in rule.analysis.nodes.names if isinstance(n, cst.Name) and n.value == fn.value]
    if len(defs) != 1 or len(mentions) != 2 or not isinstance(rule.parent(defs[0]), cst.Module):
        return None  # defined twice, nested, or called elsewhere with the world size too
    return defs[0]


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _without(args: cst.Tuple, position: int) -> cst.Tuple:
    kept = [e for k, e in enumerate(args.elements) if k != position]
    if len(kept) == 1:
        kept[0] = kept[0].with_changes(comma=cst.Comma())  # `(x,)` stays a tuple
    elif kept:
        kept[-1] = kept[-1].with_changes(comma=args.elements[-1].comma)
    return args.with_changes(elements=kept)


def _drop_param(params, position: int) -> list[cst.Param]:
    kept = [p for k, p in enumerate(params) if k != position]
    if kept:
        kept[-1] = kept[-1].with_changes(comma=params[-1].comma)
    return kept
