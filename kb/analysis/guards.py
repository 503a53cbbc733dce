"""Code that only runs with CUDA: what a CUDA guard protects (the guards are found in devices.py), and the
rest of a function after `if not torch.cuda.is_available(): return`. A TPU host never runs what a quiet guard
protects (CUDA-only housekeeping); a guard that flips is rewritten to hold on XLA, so its code does run there,
and only rules about CUDA-only settings (cuDNN flags) leave it alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .devices import analyse

if TYPE_CHECKING:
    from .view import RuleView

AVAILABILITY = frozenset({"torch.cuda.is_available"})


def _regions(rule: RuleView, quiet_only: bool) -> set[int]:
    """The ids of the regions guards protect; gathered once per module (kept with its facts), not once per
    question (a module of many guards asked about every node was quadratic)."""
    facts = analyse(rule.analysis.module).facts
    cache = facts.__dict__.setdefault("_guarded_regions", {})
    if quiet_only not in cache:
        cache[quiet_only] = {id(r) for guard in facts.guards if guard.quiet or not quiet_only for r in guard.regions}
    return cache[quiet_only]


def guarded_by_cuda(rule: RuleView, node: cst.CSTNode, quiet_only: bool = False) -> bool:
    """Is `node` inside code that a CUDA guard protects (`quiet_only`: a guard that does not flip, around
    CUDA-only housekeeping), or after an early return for hosts without CUDA?"""
    regions = _regions(rule, quiet_only)
    return any(id(n) in regions for n in (node, *rule.ancestors(node))) or after_cuda_early_return(rule, node)


def after_cuda_early_return(rule: RuleView, node: cst.CSTNode) -> bool:
    """`if not torch.cuda.is_available() [or ...]: return` earlier in the function that holds `node`."""
    for anc in (node, *rule.ancestors(node)):
        block = rule.parent(anc)
        if isinstance(block, cst.IndentedBlock) and isinstance(rule.parent(block), cst.FunctionDef):
            for stmt in block.body:
                if stmt is anc:
                    return False
                if is_cuda_early_return(rule, stmt):
                    return True
            return False
    return False


def is_cuda_early_return(rule: RuleView, stmt: cst.CSTNode) -> bool:
    """`if not torch.cuda.is_available(): return` (also as one operand of an `or`)."""
    if not (isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(stmt.body, cst.IndentedBlock)):
        return False
    if not all(
        isinstance(line, cst.SimpleStatementLine) and all(isinstance(s, cst.Return) for s in line.body)
        for line in stmt.body.body
    ):
        return False
    operands, pending = [], [stmt.test]
    while pending:
        test = pending.pop()
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
            pending += [test.left, test.right]
        else:
            operands.append(test)
    return any(
        isinstance(op, cst.UnaryOperation)
        and isinstance(op.operator, cst.Not)
        and rule.is_call_to(op.expression, *AVAILABILITY)
        for op in operands
    )
