"""Family fixed_generation: a sampling loop that grows its sequence by one token per step, into a fixed buffer.

    for _ in range(n):                              _pos = torch.full((1,), idx.size(1), dtype=torch.long, device=idx.device)
        logits = model(idx)                         idx = torch.nn.functional.pad(idx, (0, n))
        logits = logits[:, -1, :]           ->      for _ in range(n):
        nxt = torch.argmax(logits, -1, True)            logits = model(idx)
        idx = torch.cat((idx, nxt), dim=1)              logits = logits.index_select(1, _pos - 1).squeeze(1)
                                                        nxt = torch.argmax(logits, -1, True)
                                                        idx = idx.index_copy(1, _pos, nxt)
                                                        _pos = _pos + 1

The model sees the same shape every token and the position is a device tensor, so one graph serves every
token instead of one compile per length. It is right only for a causal model that returns logits for every
position (later, still empty positions cannot change earlier ones): the program run decides (greedy outputs
must stay the same). Left alone: loops that crop the sequence (`idx[:, -block_size:]`), leave early
(`break`), use the sequence for anything else, or grow it along another axis than the last of a 2-D batch.
"""

from __future__ import annotations

import libcst as cst

from . import Rewrite
from .blocks import BlockEdit, Tree, has_flow_exit, names_in

FAMILY = "fixed_generation"
CAT = frozenset({"torch.cat", "torch.concat"})
POSITION = "_pos"


def plan(source: str, path: str, lines: list[int] | tuple[int, ...] = ()) -> tuple[Rewrite | None, list[str]]:
    tree = Tree(source)
    notes: list[str] = []
    swap: dict[int, list[cst.BaseStatement]] = {}
    answered = []
    for loop in _range_loops(tree.module):
        grow = _growing_append(loop)
        if grow is None:
            continue
        stmt, name = grow
        line = tree.lines(stmt)[0]
        if lines and not any(tree.lines(loop)[0] <= want <= tree.lines(loop)[1] for want in lines):
            continue
        why = _why_not(loop, stmt, name)
        if why:
            notes.append(f"{path}:{line}: left alone: {why}")
            continue
        body = _rewritten_body(loop, stmt, name)
        if body is None:
            notes.append(
                f"{path}:{line}: left alone: the model's output is not read at the last position "
                "(`logits[:, -1, :]`) in the loop"
            )
            continue
        count = cst.Module([]).code_for_node(loop.iter.args[0].value)
        before = cst.parse_module(
            f"{POSITION} = torch.full((1,), {name}.size(1), dtype=torch.long, device={name}.device)\n"
            f"{name} = torch.nn.functional.pad({name}, (0, {count}))  # a fixed-size buffer: one graph for every token\n"
        ).body
        first = [before[0].with_changes(leading_lines=loop.leading_lines), before[1]]
        swap[id(loop)] = [*first, loop.with_changes(body=body, leading_lines=())]
        answered.append(line)
    if not swap:
        return None, notes
    module = tree.module.visit(BlockEdit(swap))
    summary = f"growing sequence(s) at line(s) {', '.join(map(str, answered))} generated into a fixed-size buffer"
    return Rewrite(family=FAMILY, text=module.code, lines=answered, summary=summary, notes=notes), notes


def _range_loops(root: cst.CSTNode):
    stack = [root]
    while stack:
        node = stack.pop()
        if (
            isinstance(node, cst.For)
            and isinstance(node.iter, cst.Call)
            and isinstance(node.iter.func, cst.Name)
            and node.iter.func.value == "range"
            and len(node.iter.args) == 1
        ):
            yield node
        stack.extend(node.children)


def _growing_append(loop: cst.For) -> tuple[cst.SimpleStatementLine, str] | None:
    """`X = torch.cat((X, new), dim=1)` (or dim=-1) directly in the loop's body: (that statement, "X")."""
    for stmt in loop.body.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            continue
        assign = stmt.body[0]
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
            continue
        target, call = assign.targets[0].target, assign.value
        if not (isinstance(target, cst.Name) and isinstance(call, cst.Call)):
            continue
        if cst.Module([]).code_for_node(call.func) not in CAT or not call.args:
            continue
        parts = call.args[0].value
        if not isinstance(parts, (cst.Tuple, cst.List)) or len(parts.elements) != 2:
            continue
        first = parts.elements[0].value
        if isinstance(first, cst.Name) and first.value == target.value:
            return stmt, target.value
    return None


def _cat_dim(stmt: cst.SimpleStatementLine) -> str | None:
    call = stmt.body[0].value
    dims = [a.value for a in call.args[1:] if a.keyword is None or a.keyword.value == "dim"]
    if not dims:
        return "0"
    return cst.Module([]).code_for_node(dims[0]).strip()


def _why_not(loop: cst.For, stmt: cst.SimpleStatementLine, name: str) -> str | None:
    if has_flow_exit([loop.body]):
        return "the loop can leave early (`break`/`return`): a fixed buffer would keep its empty tail"
    if _cat_dim(stmt) not in ("1", "-1"):
        return "the sequence grows along an axis other than the last of a (batch, length) tensor"
    fed = [
        c
        for c in _calls(loop.body)
        if any(isinstance(a.value, cst.Name) and a.value.value == name for a in c.args) and c is not stmt.body[0].value
    ]
    if not fed:
        return f"`{name}` does not go into the model as it is (cropped or sliced first)"
    uses = [n for n in names_in([loop.body]) if n.value == name]
    # the model call, and the append (target, first part): three uses; anything else reads the length
    if len(uses) != 3:
        return f"`{name}` is used for more than the model's input and the append (cropped, measured or sliced)"
    return None


def _rewritten_body(loop: cst.For, stmt: cst.SimpleStatementLine, name: str) -> cst.IndentedBlock | None:
    reads = []

    class Rewriter(cst.CSTTransformer):
        def leave_Subscript(self, original_node, updated_node):  # noqa: N802
            axis = _last_position_axis(updated_node)
            if axis is None:
                return updated_node
            reads.append(axis)
            value = cst.Module([]).code_for_node(updated_node.value)
            if not isinstance(updated_node.value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                value = f"({value})"
            return cst.parse_expression(f"{value}.index_select({axis}, {POSITION} - 1).squeeze({axis})")

    new_body = []
    for child in loop.body.body:
        if child is stmt:
            new_body.append(
                cst.parse_statement(
                    f"{name} = {name}.index_copy(1, {POSITION}, {_appended_code(stmt)})\n"
                ).with_changes(leading_lines=stmt.leading_lines)
            )
            new_body.append(cst.parse_statement(f"{POSITION} = {POSITION} + 1\n"))
        else:
            new_body.append(child.visit(Rewriter()))
    if not reads:
        return None
    return loop.body.with_changes(body=new_body)


def _appended_code(stmt: cst.SimpleStatementLine) -> str:
    return cst.Module([]).code_for_node(stmt.body[0].value.args[0].value.elements[1].value)


def _last_position_axis(node: cst.Subscript) -> int | None:
    """The axis of `x[:, -1, :]` or `x[:, -1]` (1): the literal -1 after `:` and followed only by `:`."""
    elements = list(node.slice)
    for axis, element in enumerate(elements):
        if _is_full_slice(element):
            continue
        index = element.slice
        if not isinstance(index, cst.Index) or axis == 0:
            return None
        if cst.Module([]).code_for_node(index.value).replace(" ", "") != "-1":
            return None
        return axis if all(_is_full_slice(e) for e in elements[axis + 1 :]) else None
    return None


def _is_full_slice(element: cst.SubscriptElement) -> bool:
    s = element.slice
    return isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None


def _calls(root: cst.CSTNode) -> list[cst.Call]:
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call):
            found.append(node)
        stack.extend(node.children)
    return found
