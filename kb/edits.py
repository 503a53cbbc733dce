"""Swapping nodes of a libcst tree for others, rebuilding only the nodes above them.

libcst's transformers rebuild every node of the tree they walk; here the walk enters only the nodes on a path
to a replaced one (`on_path`), so a rewrite costs about the size of the paths, not of the module. A statement
replaced by `removal_marker` disappears, and the comments above it move to the next statement of its block
(or stay at the block's end as a `pass`). A statement that `once` accepts (a barrier) is kept once where a rewrite
puts it right next to another one: the second does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import libcst as cst

Replacement = cst.CSTNode | cst.RemovalSentinel


def ancestors(nodes: Iterable[cst.CSTNode], parents: Mapping[cst.CSTNode, cst.CSTNode]) -> set[cst.CSTNode]:
    """Every node above one of `nodes` (`parents`: child -> parent of the whole tree)."""
    above: set[cst.CSTNode] = set()
    for node in nodes:
        while node in parents:
            node = parents[node]
            if node in above:
                break
            above.add(node)
    return above


def replace_nodes(
    root: cst.Module,
    replacements: Mapping[cst.CSTNode, Replacement],
    on_path: set,
    drop_markers: bool = False,
    once: Callable[[cst.CSTNode], bool] | None = None,
) -> cst.Module:
    """`root` with each key of `replacements` (matched by identity) swapped for its value. `on_path`: the nodes
    above the replaced ones (`ancestors`). `drop_markers`: remove the `removal_marker`s, and give a block that
    lost all its statements a `pass`; then `once`: of two statements it accepts next to each other in a rebuilt
    block, one of them new (a rewrite put it there or changed it), one goes."""
    return root.visit(_Replacer(replacements, on_path, drop_markers, once))


_MARKER = "__xlaport_removed__"


def removal_marker(stmt: cst.BaseStatement) -> cst.SimpleStatementLine:
    """A placeholder that carries the removed statement's comments until its block is rebuilt."""
    return cst.SimpleStatementLine(body=[cst.Expr(cst.Name(_MARKER))], leading_lines=getattr(stmt, "leading_lines", ()))


class _Replacer(cst.CSTTransformer):
    def __init__(
        self,
        replacements: Mapping[cst.CSTNode, Replacement],
        on_path: set,
        drop_markers: bool,
        once: Callable[[cst.CSTNode], bool] | None,
    ) -> None:
        super().__init__()
        self.replacements = replacements
        self.on_path = on_path
        self.drop_markers = drop_markers
        self.once = once

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.on_path

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        if original_node in self.replacements:
            return self.replacements[original_node]
        if not self.drop_markers:
            return updated_node
        kind = type(updated_node)
        if kind is cst.IndentedBlock and original_node in self.on_path or kind is cst.Module:
            body = updated_node.body
            if self.once is not None:
                body = _once(body, {id(stmt) for stmt in original_node.body}, self.once)
            return updated_node.with_changes(body=_without_markers(body, kind is cst.IndentedBlock))
        return updated_node


def _once(body, kept: set[int], once: Callable[[cst.CSTNode], bool]) -> list:
    """`body` without the second of two statements `once` accepts, one of them new (`kept`: the ids of the
    statements the block had before): the new one goes, its comments on the one kept, above it (a rewritten
    line's comments stay with the barrier that now starts it)."""
    out = list(body)
    previous = None  # the index of the last statement kept
    for i, stmt in enumerate(out):
        if _is_marker(stmt):
            continue
        if previous is not None and once(out[previous]) and once(stmt) and not {id(out[previous]), id(stmt)} <= kept:
            earlier = out[previous]
            out[previous] = earlier.with_changes(leading_lines=[*earlier.leading_lines, *stmt.leading_lines])
            out[i] = removal_marker(stmt.with_changes(leading_lines=()))
            continue
        previous = i
    return out


def _is_marker(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.Name)
        and stmt.body[0].value.value == _MARKER
    )


def _without_markers(body, need_statement: bool) -> list:
    """`body` without the removal markers; their comments go to the next statement. `need_statement`: a block
    (not the module), where one blank line at most separates statements (two at module level)."""
    out, pending, removed = [], [], False
    most_blank = 1 if need_statement else 2
    for stmt in body:
        if _is_marker(stmt):
            pending.extend(stmt.leading_lines)
            removed = True
            continue
        if removed:
            lines = _fewer_blank_lines([*pending, *stmt.leading_lines], most_blank, first=not out)
            stmt = stmt.with_changes(leading_lines=lines)
            pending, removed = [], False
        out.append(stmt)
    if not any(line.comment is not None for line in pending):
        pending = []  # blank lines a removed statement leaves at the end of a block go with it
    if need_statement and not out:
        out.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=pending))
    elif pending:
        # comments at the end of a block stay as the block's trailing lines
        out.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=pending))
    return out


def _fewer_blank_lines(lines: list[cst.EmptyLine], most: int, first: bool) -> list[cst.EmptyLine]:
    """`lines` with runs of blank lines cut to `most`, and none before the first statement of a body: the
    blank lines around a removed statement would otherwise add up."""
    out: list[cst.EmptyLine] = []
    run = 0
    for line in lines:
        blank = line.comment is None
        run = run + 1 if blank else 0
        if blank and (run > most or (first and not out)):
            continue
        out.append(line)
    return out
