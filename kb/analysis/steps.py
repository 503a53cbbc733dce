"""The one definition of a training step and of the loops that run it.

A *step call* is `loss.backward()`, `optimizer.step()` (not `scheduler.step()`), `xm.optimizer_step(...)`,
`torch_xla.sync()` or `xm.mark_step()`, recognised by name. A *step loop* is a loop whose own body (not a
nested loop, function or lambda) makes a step call: it runs once per training step. A *training loop* is a
step loop or a loop around one (the epoch loop): code there handles the device tensors of training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ..cst_helpers import SCOPES, code_of

if TYPE_CHECKING:
    from ..rule import Rule

Loop = cst.For | cst.While


def is_step_call(call: cst.Call) -> bool:
    """backward / optimizer step / sync, by name (`scheduler.step()` is not a training step)."""
    func = call.func
    name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
    if name in ("backward", "optimizer_step", "sync", "mark_step"):
        return True
    return name == "step" and isinstance(func, cst.Attribute) and "sched" not in code_of(func.value).lower()


def _runs_each_iteration(loop: cst.CSTNode, child: cst.CSTNode) -> bool:
    """Does `child` of `loop` run on every iteration (the body; a `while` loop's test)?
    A `for` loop's iterable is evaluated once, so it is not inside the loop."""
    return child is loop.body or (isinstance(loop, cst.While) and child is loop.test)


def _find_loops(rule: Rule) -> tuple[set[int], set[int]]:
    """(step loops, training loops) of the module, as node ids."""
    step_loops: set[int] = set()
    training_loops: set[int] = set()
    for call in rule.analysis.nodes.calls:
        if not is_step_call(call):
            continue
        child: cst.CSTNode = call
        innermost = True
        for anc in rule.ancestors(call):
            if isinstance(anc, SCOPES):
                break
            if isinstance(anc, (cst.For, cst.While)) and _runs_each_iteration(anc, child):
                if innermost:
                    step_loops.add(id(anc))
                    innermost = False
                training_loops.add(id(anc))
            elif isinstance(anc, (cst.For, cst.While)):
                innermost = False  # a step call in a loop's iterable: only the loops around it train
            child = anc
    return step_loops, training_loops


def _loops(rule: Rule) -> tuple[set[int], set[int]]:
    analysis = rule.analysis
    if analysis.step_loops is None or analysis.training_loops is None:
        analysis.step_loops, analysis.training_loops = _find_loops(rule)
    return analysis.step_loops, analysis.training_loops


def runs_step(rule: Rule, loop: Loop) -> bool:
    """Is `loop` a step loop (its own body makes a step call)?"""
    return id(loop) in _loops(rule)[0]


def step_loop(rule: Rule, node: cst.CSTNode) -> Loop | None:
    """The innermost step loop that executes `node` on each of its iterations.

    Stops at function, lambda and class boundaries, so code in `xm.add_step_closure(lambda ...)` or in a
    function called from the loop is not in the loop. A `for` loop's iterable is evaluated once, so it is
    not inside that loop; an epoch loop whose step runs in a nested batch loop is not a step loop.
    """
    step_loops = _loops(rule)[0]
    child = node
    for anc in rule.ancestors(node):
        if isinstance(anc, SCOPES):
            return None
        if isinstance(anc, (cst.For, cst.While)) and _runs_each_iteration(anc, child) and id(anc) in step_loops:
            return anc
        child = anc
    return None


def per_step_loop(rule: Rule, node: cst.CSTNode) -> Loop | None:
    """`step_loop(node)`, unless `node` only runs every N steps (in the body of `if step % N == 0:`)."""
    loop = step_loop(rule, node)
    if loop is None:
        return None
    child = node
    for anc in rule.ancestors(node):
        if anc is loop:
            break
        if isinstance(anc, cst.If) and child is anc.body and has_modulo(anc.test):
            return None
        child = anc
    return loop


def training_loop(rule: Rule, node: cst.CSTNode) -> Loop | None:
    """The innermost training loop around `node` (a step loop or a loop around one), in the same function."""
    training_loops = _loops(rule)[1]
    for anc in rule.ancestors(node):
        if isinstance(anc, SCOPES):
            return None
        if isinstance(anc, (cst.For, cst.While)) and id(anc) in training_loops:
            return anc
    return None


def has_modulo(node: cst.CSTNode) -> bool:
    """Does a condition test `something % N` (the every-N-steps idiom)?"""
    if isinstance(node, cst.BinaryOperation):
        return isinstance(node.operator, cst.Modulo) or has_modulo(node.left) or has_modulo(node.right)
    if isinstance(node, cst.Comparison):
        return has_modulo(node.left) or any(has_modulo(c.comparator) for c in node.comparisons)
    if isinstance(node, cst.BooleanOperation):
        return has_modulo(node.left) or has_modulo(node.right)
    if isinstance(node, cst.UnaryOperation):
        return has_modulo(node.expression)
    return False
