"""Family logging_reads: per-step host reads made for logging, moved off the step.

Two rewrites, chosen per site (a line the check measured a host read at, or every read in a training loop):

- an accumulator (`total += loss.item()`, `total += float(loss)`) keeps its sum on the device:
  `total += loss.detach()`; it is read on the host only where it is printed (every N steps);
- anything else that only logs (a `print`/log call, an `if step % N == 0:` block, an assignment and the
  statements that use it) becomes a function handed to `xm.add_step_closure`: it runs after the step's graph
  ran, at the barrier, without cutting the graph. The values it reads are bound when the step registers it
  (default arguments), names it assigns that the rest of the code uses are declared `global`/`nonlocal`.
  When the loop's barrier comes before the logging, the closure runs at the next step's barrier: a barrier
  after the loop runs the last one.

Logging code that leaves the loop (`break`, `return`) or makes a step (`backward()`, `step()`) is left alone.
"""

from __future__ import annotations

import libcst as cst

from ..imports import add_imports
from . import Rewrite
from .blocks import (
    BARRIERS,
    BUILTINS,
    STEP_CALLS,
    BlockEdit,
    Tree,
    assigned_names,
    call_names,
    has_flow_exit,
    imported_names,
    names_in,
    xm_alias,
)

FAMILY = "logging_reads"
READ_METHODS = frozenset({"item", "tolist", "cpu", "numpy"})
READ_FUNCTIONS = frozenset({"float", "int"})
CLOSURE_PREFIX = "_log_step_"


def read_calls(root: cst.CSTNode) -> list[cst.Call]:
    """Calls under `root` that copy a tensor's value to the host: `t.item()`, `float(t)`, `t.cpu()` ..."""
    found = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in READ_METHODS and not node.args:
                found.append(node)
            elif isinstance(func, cst.Name) and func.value in READ_FUNCTIONS and len(node.args) == 1:
                found.append(node)
        stack.extend(node.children)
    return found


def rewrite(source: str, path: str = "<string>", lines: list[int] | tuple[int, ...] = ()) -> Rewrite | None:
    """The module with the logging reads at `lines` (default: every read in a training loop) moved off the
    step; None when no site could be rewritten (the notes of a None are lost: call `plan` to see them)."""
    result, _ = plan(source, path, lines)
    return result


def plan(source: str, path: str, lines: list[int] | tuple[int, ...] = ()) -> tuple[Rewrite | None, list[str]]:
    tree = Tree(source)
    notes: list[str] = []
    targets = sorted(set(lines)) or _reads_in_training_loops(tree)
    swap: dict[int, list[cst.BaseStatement]] = {}
    flush_after: dict[int, cst.CSTNode] = {}
    handled: set[int] = set()
    answered: list[int] = []
    xm = xm_alias(tree.module) or "xm"
    imports = imported_names(tree.module)
    for line in targets:
        stmt = tree.statement_at(line)
        if stmt is None or not read_calls(stmt):
            notes.append(f"{path}:{line}: no host read found on this line")
            continue
        if id(stmt) in handled:
            answered.append(line)
            continue
        loop = tree.enclosing_loop(stmt)
        if loop is None:
            notes.append(f"{path}:{line}: the read is not inside a loop of its function")
            continue
        accumulated = _on_device_accumulator(stmt)
        if accumulated is not None:
            swap[id(stmt)] = [accumulated]
            handled.add(id(stmt))
            answered.append(line)
            continue
        unit, block_owner = _logging_unit(tree, stmt, loop)
        if unit is None:
            notes.append(f"{path}:{line}: {block_owner}")
            continue
        if any(id(s) in handled for s in unit):
            answered.append(line)
            continue
        deferred = not _barrier_after(tree, unit[-1], loop)
        late = _read_late(unit, loop) if deferred else set()
        if late:
            notes.append(
                f"{path}:{line}: left alone: the loop's barrier comes before this logging, so a step closure would "
                f"run one step later, after the loop changed {', '.join(sorted(late))}"
            )
            continue
        closure = _closure(tree, unit, loop, line, xm, imports)
        swap[id(unit[0])] = closure
        for other in unit[1:]:
            swap[id(other)] = []
        handled.update(id(s) for s in unit)
        answered.append(line)
        if deferred:
            flush_after[id(loop)] = loop
    if not swap:
        return None, notes
    flush = cst.parse_statement(f"{xm}.mark_step()  # runs the logging closures of the last step\n")
    module = tree.module.visit(BlockEdit(swap, after={key: [flush] for key in flush_after}))
    if xm_alias(tree.module) is None:
        module = add_imports(module, [("torch_xla.core.xla_model", None, "xm")])
    summary = (
        f"host reads for logging at line(s) {', '.join(map(str, answered))} moved off the step "
        "(step closures, device-side accumulators)"
    )
    return Rewrite(family=FAMILY, text=module.code, lines=answered, summary=summary, notes=notes), notes


def _reads_in_training_loops(tree: Tree) -> list[int]:
    """Lines of `t.item()`-style reads inside a loop that makes training steps (nothing measured, no kb lines)."""
    found = []
    for loop in _walk_loops(tree.module):
        if not (call_names(loop.body) & {"backward", "step", "optimizer_step", "sync", "mark_step"}):
            continue
        for call in read_calls(loop.body):
            if not isinstance(call.func, cst.Attribute):
                continue  # `float(x)` of what may be a plain number: only the kb's findings (typed) say
            stmt = next((a for a in tree.ancestors(call) if isinstance(a, cst.SimpleStatementLine)), None)
            if stmt is not None and tree.enclosing_loop(stmt) is not None:
                found.append(tree.lines(stmt)[0])
    return sorted(set(found))


def _walk_loops(root: cst.CSTNode):
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.For, cst.While)):
            yield node
        stack.extend(node.children)


def _on_device_accumulator(stmt: cst.SimpleStatementLine) -> cst.SimpleStatementLine | None:
    """`total += loss.item()` -> `total += loss.detach()` (also `float(loss)`); None for anything else."""
    if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.AugAssign):
        return None
    aug = stmt.body[0]
    if not isinstance(aug.target, cst.Name) or not isinstance(aug.operator, (cst.AddAssign, cst.SubtractAssign)):
        return None
    reads = read_calls(aug.value)
    if not reads or any(not _scalar_read(c) for c in reads):
        return None

    class OnDevice(cst.CSTTransformer):
        def leave_Call(self, original_node, updated_node):  # noqa: N802
            if any(original_node is r for r in reads):
                inner = (
                    updated_node.func.value
                    if isinstance(updated_node.func, cst.Attribute)
                    else updated_node.args[0].value
                )
                return cst.Call(func=cst.Attribute(value=inner, attr=cst.Name("detach")))
            return updated_node

    return stmt.with_changes(body=[aug.with_changes(value=aug.value.visit(OnDevice()))])


def _scalar_read(call: cst.Call) -> bool:
    func = call.func
    return (isinstance(func, cst.Attribute) and func.attr.value == "item") or (
        isinstance(func, cst.Name) and func.value == "float"
    )


def _logging_unit(tree: Tree, stmt: cst.SimpleStatementLine, loop) -> tuple[list | None, str]:
    """The statements to run in a closure: the body of the outermost `if` between the read and the loop that
    only logs, else the statement itself with the statements after it that use what it assigns."""
    chosen = None
    for above in tree.ancestors(stmt):
        if above is loop:
            break
        if isinstance(above, cst.If) and isinstance(above.body, cst.IndentedBlock):
            if not (call_names(above) & STEP_CALLS) and not has_flow_exit([above.body]):
                chosen = above
    if chosen is not None:
        unit = list(chosen.body.body)
        return unit, ""
    block = tree.parents.get(stmt)
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None, "the read is not a statement of a block"
    if call_names(stmt) & STEP_CALLS or has_flow_exit([stmt]):
        return None, "the statement that reads also makes a training step or leaves the loop; left alone"
    siblings = list(block.body)
    index = next(i for i, s in enumerate(siblings) if s is stmt)
    unit = [stmt]
    bound = assigned_names([stmt])
    if bound and not isinstance(stmt.body[0], cst.Expr):
        for later in siblings[index + 1 :]:
            uses = {n.value for n in names_in([later])}
            if not (uses & bound) or call_names(later) & STEP_CALLS or has_flow_exit([later]):
                break
            unit.append(later)
            bound |= assigned_names([later])
    elif not isinstance(stmt.body[0], cst.Expr):
        return None, "the read is not in a call, an assignment or a logging block"
    return unit, ""


def _closure(tree: Tree, unit: list, loop, line: int, xm: str, imports: set[str]) -> list[cst.BaseStatement]:
    """`def _log_step_N(a=a, ...): [global/nonlocal ...] <unit>` and `xm.add_step_closure(_log_step_N)`."""
    function = tree.enclosing_function(loop)
    scope = function.body if function is not None else tree.module
    unit_names = names_in(unit)
    unit_ids = {id(n) for n in unit_names}
    outside = {n.value for n in names_in([scope]) if id(n) not in unit_ids}
    assigned = assigned_names(unit)
    declared = sorted(assigned & outside)
    globals_here = set()
    if function is not None:
        for g in _global_statements(function):
            globals_here |= g
    reads = sorted({n.value for n in unit_names} - assigned - BUILTINS - imports - {xm})
    name = f"{CLOSURE_PREFIX}{line}"
    params = ", ".join(f"{r}={r}" for r in reads)
    header = []
    if declared:
        if function is None:
            header.append(f"global {', '.join(declared)}")
        else:
            glob = [d for d in declared if d in globals_here]
            nonlocal_ = [d for d in declared if d not in globals_here]
            if glob:
                header.append(f"global {', '.join(glob)}")
            if nonlocal_:
                header.append(f"nonlocal {', '.join(nonlocal_)}")
    body = [cst.parse_statement(h + "\n") for h in header] + [
        s.with_changes(leading_lines=()) if i == 0 else s for i, s in enumerate(unit)
    ]
    definition = cst.FunctionDef(
        name=cst.Name(name),
        params=cst.parse_expression(f"lambda {params}: 0").params,
        body=cst.IndentedBlock(body=body),
        leading_lines=getattr(unit[0], "leading_lines", ()),
    )
    register = cst.parse_statement(f"{xm}.add_step_closure({name})\n")
    return [definition, register]


def _global_statements(function: cst.FunctionDef) -> list[set[str]]:
    found = []
    stack = [function.body]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Global):
            found.append({n.name.value for n in node.names})
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(node.children)
    return found


def _barrier_after(tree: Tree, last: cst.CSTNode, loop) -> bool:
    """Whether the loop body has a barrier after the logging (its closures then run in the same step)."""
    top = last
    for above in tree.ancestors(last):
        if above is loop.body:
            break
        top = above
    body = list(loop.body.body)
    index = next((i for i, s in enumerate(body) if s is top), len(body))
    return any(call_names(s) & BARRIERS for s in body[index + 1 :])


def _read_late(unit: list, loop) -> set[str]:
    """Names the logging assigns that the rest of the loop assigns too: a closure run a step later would
    interleave its updates with the loop's (a windowed sum reset one step late). A name the rest of the loop
    only reads (a metric logged again at evaluation) is read one step older; that is accepted."""
    outside = [s for s in _statements_outside(loop.body, unit)]
    return assigned_names(unit) & assigned_names(outside)


def _statements_outside(block: cst.IndentedBlock, unit: list) -> list[cst.CSTNode]:
    """The statements of `block`, nested ones included, that are not part of `unit` (nor hold it)."""
    unit_ids = {id(s) for s in unit}
    found = []
    stack = list(block.body)
    while stack:
        node = stack.pop()
        if id(node) in unit_ids:
            continue
        if isinstance(node, cst.SimpleStatementLine):
            found.append(node)
        elif isinstance(node, cst.BaseCompoundStatement):
            stack.extend(c for c in node.children if not isinstance(c, cst.BaseSuite))
            for suite in [node.body, getattr(node, "orelse", None)]:
                while suite is not None and not isinstance(suite, cst.IndentedBlock):
                    suite = getattr(suite, "body", None)
                if suite is not None:
                    stack.extend(suite.body)
    return found
