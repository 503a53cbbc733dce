"""Code that only runs with CUDA: what a CUDA guard protects (the guards are found in devices.py), and the
rest of a function after `if not torch.cuda.is_available(): return`. A TPU host never runs what a quiet guard
protects (CUDA-only housekeeping); a guard that flips is rewritten to hold on XLA, so its code does run there,
and only rules about CUDA-only settings (cuDNN flags) leave it alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .cst_scopes import full_name
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


STOPS = frozenset({"sys.exit", "exit", "quit", "os._exit"})
SAYS = frozenset({"print", "logging.error", "logging.warning", "logging.critical", "warnings.warn"})


def needs_gpu_guard(rule: RuleView, call: cst.Call) -> cst.If | None:
    """The `if` that `call` (`torch.cuda.is_available()`) makes a "needs a GPU" stop: `if not
    torch.cuda.is_available(): raise ...` or `if args.cuda and not torch.cuda.is_available(): sys.exit(...)`
    (the negated call alone or one operand of an `and`; no `else`; the body only raises or exits, after an
    optional message). On a TPU host the accelerator asked for is the XLA device, so the stop never applies."""
    negation = rule.parent(call)
    if not (isinstance(negation, cst.UnaryOperation) and isinstance(negation.operator, cst.Not)):
        return None
    test: cst.CSTNode = negation
    while isinstance(rule.parent(test), cst.BooleanOperation) and isinstance(rule.parent(test).operator, cst.And):
        test = rule.parent(test)
    stmt = rule.parent(test)
    if not (isinstance(stmt, cst.If) and stmt.test is test and stmt.orelse is None):
        return None
    body = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else [stmt.body]
    small = [s for line in body for s in (line.body if hasattr(line, "body") else [line])]
    if not small or any(not isinstance(s, (cst.Raise, cst.Expr, cst.Pass)) for s in small):
        return None
    if isinstance(small[-1], cst.Raise):
        return stmt
    last = small[-1]
    if not (isinstance(last, cst.Expr) and _calls(rule, last.value, STOPS)):
        return None
    if all(isinstance(s, cst.Expr) and _calls(rule, s.value, SAYS) for s in small[:-1]):
        return stmt
    return None


def _calls(rule: RuleView, node: cst.CSTNode, names: frozenset[str]) -> bool:
    """A call of one of `names`, imported (`sys.exit`) or a builtin (`print`, `exit`)."""
    return isinstance(node, cst.Call) and (rule.is_call_to(node, *names) or full_name(node.func) in names)
