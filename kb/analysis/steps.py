"""The one definition of a training step and of the loops that run it.

A *step call* is `loss.backward()`, `optimizer.step()` (not `scheduler.step()`), `xm.optimizer_step(...)`,
`torch_xla.sync()` or `xm.mark_step()`, recognised by name. A *step loop* is a loop whose own body (not a
nested loop, function or lambda) makes a step call: it runs once per training step. A *training loop* is a
step loop or a loop around one (the epoch loop): code there handles the device tensors of training.

A *barrier site* is where a step needs `torch_xla.sync()`: once per iteration of the innermost loop that runs
the optimizer update (`optimizer.step()`, `scaler.step(optimizer)`, `xm.optimizer_step(optimizer)`), in its
body or through the helper functions and methods it calls (`self._run_batch(...)`, `train_step(...)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from ..cst_helpers import (
    SCOPES,
    code_of,
    find_nodes,
    identifier,
    is_literal,
    keyword_arg,
    method_name,
    positional_args,
)
from .device_gates import device_gates
from .project import (
    absolute_names,
    classes_of,
    definition_name,
    flag_passes,
    passes,
    project_step,
    project_steppers,
    star_imported,
)
from .project_steps import ModuleSteps
from .sparse import sparse_returns

if TYPE_CHECKING:
    from .view import RuleView, StepView

Loop = cst.For | cst.While
_LOOP_TYPES = frozenset({cst.For, cst.While})
_SCOPE_TYPES = frozenset(SCOPES)

SYNC_CALLS = frozenset(
    {
        "torch_xla.sync",
        "torch_xla.torch_xla.sync",
        "torch_xla.step",
        "torch_xla.torch_xla.step",
        "torch_xla.core.xla_model.mark_step",
        "torch_xla.core.xla_model.optimizer_step",
    }
)
XM_OPTIMIZER_STEP = frozenset({"torch_xla.core.xla_model.optimizer_step"})
PREPARE_METHODS = frozenset({"prepare", "prepare_data_loader"})  # accelerate's Accelerator methods


def is_optimizer_name(node: cst.CSTNode) -> bool:
    name = (identifier(node) or "").lower()
    if "sched" in name:
        return False
    return "optim" in name or name == "opt" or name.startswith("opt_") or name.endswith("_opt")


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


def _find_loops(rule: RuleView) -> tuple[set[int], set[int]]:
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


def _loops(rule: RuleView) -> tuple[set[int], set[int]]:
    analysis = rule.analysis
    if analysis.step_loops is None or analysis.training_loops is None:
        analysis.step_loops, analysis.training_loops = _find_loops(rule)
    return analysis.step_loops, analysis.training_loops


def runs_step(rule: RuleView, loop: Loop) -> bool:
    """Is `loop` a step loop (its own body makes a step call)?"""
    return id(loop) in _loops(rule)[0]


def step_loop(rule: RuleView, node: cst.CSTNode) -> Loop | None:
    """The innermost step loop that executes `node` on each of its iterations.

    Stops at function, lambda and class boundaries, so code in `xm.add_step_closure(lambda ...)` or in a
    function called from the loop is not in the loop. A `for` loop's iterable is evaluated once, so it is
    not inside that loop; an epoch loop whose step runs in a nested batch loop is not a step loop.
    """
    step_loops = _loops(rule)[0]
    child = node
    for anc in rule.ancestors(node):
        kind = type(anc)  # exact types in these walks up the tree: isinstance goes through ABCMeta
        if kind in _SCOPE_TYPES:
            return None
        if kind in _LOOP_TYPES and _runs_each_iteration(anc, child) and id(anc) in step_loops:
            return anc
        child = anc
    return None


def per_step_loop(rule: RuleView, node: cst.CSTNode) -> Loop | None:
    """`step_loop(node)`, unless `node` only runs every N steps (in the body of `if step % N == 0:`)."""
    loop = step_loop(rule, node)
    if loop is None:
        return None
    child = node
    for anc in rule.ancestors(node):
        if anc is loop:
            break
        if type(anc) is cst.If and child is anc.body and every_n_steps(rule, anc.test):
            return None
        child = anc
    return loop


def training_loop(rule: RuleView, node: cst.CSTNode) -> Loop | None:
    """The innermost training loop around `node` (a step loop or a loop around one), in the same function."""
    training_loops = _loops(rule)[1]
    for anc in rule.ancestors(node):
        kind = type(anc)
        if kind in _SCOPE_TYPES:
            return None
        if kind in _LOOP_TYPES and id(anc) in training_loops:
            return anc
    return None


def every_n_steps(rule: RuleView, test: cst.CSTNode) -> bool:
    """Does an `if` test hold only every N steps: `step % N == 0`, or a call of this module's function that tests
    a modulo (`divisible_by(step, N)` with `def divisible_by(n, d): return n % d == 0`)?"""
    if has_modulo(test):
        return True
    for call in find_nodes(test, cst.Call):
        if isinstance(call.func, cst.Name) and call.func.value in _modulo_functions(rule):
            return True
    return False


# id of a module -> (the module, kept so the id stays its own; its _modulo_functions): asked for at every `if`
# around every node whose step loop is looked up
_MODULO_FUNCTIONS: dict[int, tuple[cst.Module, frozenset[str]]] = {}


def _modulo_functions(rule: RuleView) -> frozenset[str]:
    """The module's top-level functions whose body is one `return` of a modulo test."""
    module = rule.analysis.module
    known = _MODULO_FUNCTIONS.get(id(module))
    if known is not None and known[0] is module:
        return known[1]
    if len(_MODULO_FUNCTIONS) > 16:
        _MODULO_FUNCTIONS.clear()
    found = _find_modulo_functions(module)
    _MODULO_FUNCTIONS[id(module)] = (module, found)
    return found


def _find_modulo_functions(module: cst.Module) -> frozenset[str]:
    found = set()
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and isinstance(stmt.body, cst.IndentedBlock):
            body = stmt.body.body
            line = body[-1] if body else None
            if isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.Return):
                value = line.body[0].value
                if value is not None and has_modulo(value):
                    found.add(stmt.name.value)
    return frozenset(found)


def has_modulo(node: cst.CSTNode) -> bool:
    """Does a condition test `something % N` (the every-N-steps idiom)?"""
    kind = type(node)
    if kind is cst.BinaryOperation:
        return type(node.operator) is cst.Modulo or has_modulo(node.left) or has_modulo(node.right)
    if kind is cst.Comparison:
        return has_modulo(node.left) or any(has_modulo(c.comparator) for c in node.comparisons)
    if kind is cst.BooleanOperation:
        return has_modulo(node.left) or has_modulo(node.right)
    if kind is cst.UnaryOperation:
        return has_modulo(node.expression)
    return False


# --- functions that run once per training step ---------------------------------------------------------
def per_step_function(rule: StepView, node: cst.CSTNode) -> cst.FunctionDef | None:
    """The function around `node` when it runs once per training step and `node` runs each time it does (not in
    the body of an every-N-steps `if`): a model's `forward`, a function or method that a step loop calls, one that
    such a function calls (`self._dequeue_and_enqueue(k)` in `forward`), or one that another module of the tree
    calls once per step (`ProjectSteps.per_step`)."""
    child = node
    for anc in rule.ancestors(node):
        kind = type(anc)
        if kind is cst.If and child is anc.body and every_n_steps(rule, anc.test):
            return None
        if kind is cst.Lambda or kind is cst.ClassDef:
            return None
        if kind is cst.FunctionDef:
            return anc if id(anc) in per_step_functions(rule) else None
        child = anc
    return None


def per_step_functions(rule: StepView) -> dict[int, cst.FunctionDef]:
    """The module's functions that run once per training step (see `per_step_function`), by id."""
    analysis = rule.analysis
    key = analysis.project
    if analysis.per_step is None or analysis.per_step[0] is not key:
        analysis.per_step = (key, _find_per_step_functions(rule))
    return analysis.per_step[1]


def _find_per_step_functions(rule: StepView) -> dict[int, cst.FunctionDef]:
    project = rule.analysis.project
    reached = project.per_step if project is not None else frozenset()
    top_level: dict[str, cst.FunctionDef] = {}
    methods: dict[tuple[int, str], cst.FunctionDef] = {}
    pending: list[cst.FunctionDef] = []
    for func in rule.analysis.nodes.functions:
        if not isinstance(func, cst.FunctionDef):
            continue
        block = rule.parent(func)
        owner = rule.parent(block) if block is not None else None
        if isinstance(block, cst.Module):
            top_level[func.name.value] = func
        elif isinstance(owner, cst.ClassDef):
            methods[(id(owner), func.name.value)] = func
            if func.name.value == "forward":
                pending.append(func)
        if reached and definition_name(rule, func) in reached:
            pending.append(func)
    if not top_level and not methods:
        return {}
    pending += [
        f
        for c in rule.analysis.nodes.calls
        if (f := _callee(rule, c, top_level, methods)) is not None and per_step_loop(rule, c) is not None
    ]
    found: dict[int, cst.FunctionDef] = {}
    while pending:
        func = pending.pop()
        if id(func) in found:
            continue
        found[id(func)] = func
        for call in rule.nodes_in(func.body, False).calls:
            callee = _callee(rule, call, top_level, methods)
            if callee is not None and id(callee) not in found and _every_time(rule, call, func):
                pending.append(callee)
    return found


def _callee(
    rule: StepView,
    call: cst.Call,
    top_level: dict[str, cst.FunctionDef],
    methods: dict[tuple[int, str], cst.FunctionDef],
) -> cst.FunctionDef | None:
    """This module's function that `call` runs: `helper(...)` (a top-level function), `self.method(...)`."""
    func = call.func
    if isinstance(func, cst.Name):
        return top_level.get(func.value)
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
        cls = rule.enclosing_class(call)
        return methods.get((id(cls), func.attr.value)) if cls is not None else None
    return None


def _every_time(rule: StepView, node: cst.CSTNode, func: cst.FunctionDef) -> bool:
    """Does `node` run each time `func` runs (not in the body of an every-N-steps `if`)?"""
    child = node
    for anc in rule.ancestors(node):
        if anc is func:
            return True
        if isinstance(anc, cst.If) and child is anc.body and every_n_steps(rule, anc.test):
            return False
        child = anc
    return True


def per_step_calls(rule: StepView) -> frozenset[str]:
    """The tree's functions (full names) that this module calls once per training step: from a step loop or from
    one of its per-step functions (`apply_rotary_emb(q, freqs)` in a `forward`, `trainer.train_step(batch)`)."""
    project = rule.analysis.project
    if project is None:
        return frozenset()
    functions = per_step_functions(rule)
    found = set()
    for call in rule.analysis.nodes.calls:
        if per_step_loop(rule, call) is None and per_step_function(rule, call) is None:
            continue
        func = call.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            continue  # the module's own methods: per_step_functions follows them
        names = {project.resolve(n) for n in absolute_names(rule, func)} - {None}
        if isinstance(func, cst.Attribute):
            names |= {f"{klass}.{func.attr.value}" for klass in classes_of(rule, func.value)}
        found |= names
    own = {definition_name(rule, f) for f in functions.values()}
    return frozenset(found - own)


# --- step barriers: where the optimizer step is, and where its barrier goes ----------------------------
@dataclass(frozen=True)
class BarrierSite:
    """One step barrier to add: after statement `after` (in `loop`'s body, at any depth), once per iteration.

    `call` is the optimizer step, or the call of the helper function that runs it (`helper`)."""

    call: cst.Call
    after: cst.BaseStatement
    loop: Loop
    helper: str | None


def is_barrier(rule: StepView, call: cst.Call) -> bool:
    """`torch_xla.sync()`, `xm.mark_step()`, `xm.optimizer_step(opt, barrier=True)` (not without barrier=True)."""
    names = rule.qualified_names(call.func)
    if names & XM_OPTIMIZER_STEP:
        barrier = keyword_arg(call, "barrier")
        return barrier is not None and not is_literal(barrier.value, "False")
    return bool(names & SYNC_CALLS)


def is_optimizer_update(rule: StepView, call: cst.Call) -> bool:
    """The call that updates the weights: `optimizer.step()`, `scaler.step(optimizer)` (GradScaler),
    `xm.optimizer_step(optimizer)`, a wrapper's `optimizer.step_and_update_lr()`."""
    if rule.is_optimizer_step(call):
        return True
    name = method_name(call) or ""
    if name.startswith("step_") and not call.args and is_optimizer_name(call.func.value):
        return True
    args = positional_args(call)
    if method_name(call) == "step" and len(call.args) == 1 and len(args) == 1:
        optimizer = args[0].value
        return is_optimizer_name(optimizer) or code_of(optimizer) in rule.facts().optimizer_keys
    return bool(rule.qualified_names(call.func) & XM_OPTIMIZER_STEP)


def barrier_sites(rule: StepView) -> list[BarrierSite]:
    """Where the module's training steps need a barrier: one per iteration of the innermost loop that runs the
    optimizer update, directly or through helper functions and methods (`self._run_batch(...)`,
    `train_step(...)`), unless that loop already syncs or iterates a loader that syncs per batch."""
    analysis = rule.analysis
    if analysis.barrier_sites is None:
        analysis.barrier_sites = _find_barrier_sites(rule)
    return analysis.barrier_sites


def _find_barrier_sites(rule: StepView) -> list[BarrierSite]:
    found, _ = _climb(rule)
    per_loop: dict[int, list[BarrierSite]] = {}
    for call, loop, helper in found:
        site = _site(rule, call, loop, helper)
        if site is not None:
            per_loop.setdefault(id(loop), []).append(site)
    for call, func in _uncalled_steps(rule):
        after = rule.statement_of(call)
        if after is not None:
            per_loop.setdefault(id(func), []).append(BarrierSite(call, _after_scaler_update(rule, after), func, None))
    last = []
    for sites in per_loop.values():
        site = max(sites, key=lambda s: _start(rule, s.after))
        after = _holding_all(rule, [s.after for s in sites], site.after)
        if after is not site.after:
            site = BarrierSite(site.call, _after_scaler_update(rule, after), site.loop, site.helper)
        last.append(site)
    return sorted(last, key=lambda s: _start(rule, s.after))


def _uncalled_steps(rule: StepView) -> list[tuple[cst.Call, cst.FunctionDef]]:
    """Updates (or calls of the tree's stepping callables) in a function that is the step, called in a loop that
    the analysis cannot resolve (`agent.train()` with `agent = build(kind)`): every chain of callers up from the
    function ends in a function that nothing in the tree is known to call, and a loop of the tree calls one of
    them by name. The barrier then goes at the end of the step, in the function: one per call is one per step.
    A chain that reaches a loop, a barrier, a module-level call or a resolved caller is left to that caller; a
    function nothing calls by name is not known to train."""
    _climb(rule)
    starts = rule.analysis.climb[2]
    project = rule.analysis.project
    if not starts or project is None or not project.looped_names:
        return []
    found = []
    for call, _ in starts:
        func = _helper_function(rule, call) if _innermost_loop(rule, call) is None else None
        ends = _chain_ends(rule, func, project.called) if func is not None else None
        if ends and not ends.isdisjoint(project.looped_names):
            found.append((call, func))
    return found


def _chain_ends(rule: StepView, start: cst.FunctionDef, called: frozenset[str]) -> set[str] | None:
    """The names of the functions where the chains of callers of `start` (in this module, without a loop between)
    end, none called; None when a chain reaches a loop, a barrier, a module-level call, or a function that another
    module of the tree calls."""
    calls = rule.analysis.nodes.calls
    seen: set[int] = set()
    ends: set[str] = set()
    pending = [start]
    while pending:
        func = pending.pop()
        if id(func) in seen:
            continue
        seen.add(id(func))
        if any(is_barrier(rule, c) for c in rule.nodes_in(func, False).calls) or definition_name(rule, func) in called:
            return None
        callers = [c for c in calls if _calls(rule, c, func) and rule.enclosing_function(c) is not func]
        for call in callers:
            caller = _helper_function(rule, call)
            if caller is None:
                return None  # in a loop, at module level, in a lambda or class body: not this function's end
            pending.append(caller)
        if not callers:
            ends.add(func.name.value)
    return ends


def _holding_all(rule: StepView, statements: list[cst.BaseStatement], last: cst.BaseStatement) -> cst.CSTNode:
    """The statement, on `last`'s path, that holds every update of one loop iteration: the barrier goes after it,
    so that it runs whenever any of them ran. Updates under different conditions (`if enc_opt is not None:
    enc_opt.step()` after `dec_opt.step()`; `scaler.step(opt)` / `else: opt.step()`) get it after the `if`;
    a single update under a condition (gradient accumulation) keeps it right after the update."""
    path = [last, *rule.ancestors(last)]
    holders = {id(n) for n in path}
    for stmt in statements:
        holders &= {id(stmt), *(id(a) for a in rule.ancestors(stmt))}
    common = next(n for n in path if id(n) in holders)
    if isinstance(common, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        return common  # one update, or an `if` whose branches hold them all
    return next(n for n in path if rule.parent(n) is common)  # the statement of the common block on the path


def _climb(rule: StepView) -> tuple[list[tuple[cst.Call, Loop, str | None]], list[cst.FunctionDef]]:
    """From each optimizer update (in this module, or a call of the tree's stepping callables) up through
    the helpers that run it to the innermost loop that runs it: (update or helper call, loop, helper name) for
    each loop reached, and the helpers passed, which step once per call (none of them syncs)."""
    analysis = rule.analysis
    key = analysis.project  # the tree summary changes between the rounds of summarize_project
    if analysis.climb is None or analysis.climb[0] is not key:
        calls = analysis.nodes.calls
        project = analysis.project
        backward = any(method_name(c) == "backward" for c in calls)
        # without a `.backward()` in sight, only an optimizer this module builds (torch.optim) is a training
        # step: its gradients come from a call that runs the backward itself (`wrapper(x, backward=True)`)
        built = rule.facts().optimizer_keys
        if not backward and not built and not (project and project.steppers):
            analysis.climb = (key, ([], []), [])
        else:
            starts: list[tuple[cst.Call, str | None]] = [
                (c, None) for c in calls if is_optimizer_update(rule, c) and (backward or _steps_built(c, built))
            ]
            if project and project.steppers:
                starts += [(c, code_of(c.func)) for c in calls if project_step(rule, c)]
            analysis.climb = (key, _climb_from(rule, starts), starts)
    return analysis.climb[1]


def _steps_built(call: cst.Call, built: set[str]) -> bool:
    """`optim.step()` on an optimizer the module built from torch.optim."""
    return method_name(call) == "step" and not call.args and code_of(call.func.value) in built


def _climb_from(
    rule: StepView, starts: list[tuple[cst.Call, str | None]]
) -> tuple[list[tuple[cst.Call, Loop, str | None]], list[cst.FunctionDef]]:
    calls = rule.analysis.nodes.calls
    pending = list(starts)
    found: list[tuple[cst.Call, Loop, str | None]] = []
    helpers: dict[int, cst.FunctionDef] = {}
    while pending:
        call, helper = pending.pop()
        loop = _innermost_loop(rule, call)
        if loop is not None:
            found.append((call, loop, helper))
            continue
        func = _helper_function(rule, call)
        if func is None or id(func) in helpers or any(is_barrier(rule, c) for c in rule.nodes_in(func, False).calls):
            continue
        helpers[id(func)] = func
        name = func.name.value
        pending += [
            (c, helper or name) for c in calls if _calls(rule, c, func) and rule.enclosing_function(c) is not func
        ]
    return found, list(helpers.values())


def trains_on_cpu(rule: StepView) -> bool:
    """A script that names no device trains on the CPU (no lazy graph, host reads cost nothing), unless it runs
    the tree's stepping callables: then the device is named in the module that steps (`agent.train()` in main.py,
    `Agent` in agent.py moving its networks to `device`)."""
    if not rule.facts().cpu_script:
        return False
    project = rule.analysis.project
    return not (project and project.steppers and any(project_step(rule, c) for c in rule.analysis.nodes.calls))


def module_steps(rule: StepView, with_passes: bool = True) -> ModuleSteps:
    """What this module tells the rest of its tree (project.py): its functions, methods and callable classes
    that run an optimizer step once per call, without a loop or barrier of their own; its functions'
    parameters, and (`with_passes`) the instances of classes it passes to functions."""
    _, helpers = _climb(rule)
    signatures = []
    for func in rule.analysis.nodes.functions:
        if isinstance(func, cst.FunctionDef):
            params = func.params
            names = tuple(p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params])
            if rule.enclosing_class(func) is not None:
                names = names[1:]  # `self`: callers name the instance, not the parameter
            signatures.append((definition_name(rule, func), names))
    return ModuleSteps(
        module=rule.analysis.module_name or "",
        steppers=frozenset(definition_name(rule, f) for f in helpers),
        signatures=tuple(signatures),
        passes=passes(rule) if with_passes else (),
        per_step_calls=per_step_calls(rule),
        gates=device_gates(rule),
        flag_passes=flag_passes(rule),
        stepper_calls=frozenset(name for c in rule.analysis.nodes.calls for name in project_steppers(rule, c)),
        looped_names=_looped_stepper_names(rule),
        sparse_returns=sparse_returns(rule),
    )


def _looped_stepper_names(rule: StepView) -> frozenset[str]:
    """The last names of the tree's stepping callables that this module calls in a loop (`agent.train()`)."""
    project = rule.analysis.project
    if project is None or not project.steppers:
        return frozenset()
    names = {s.rsplit(".", 1)[-1] for s in project.steppers}
    return frozenset(
        n for c in rule.analysis.nodes.calls if (n := identifier(c.func)) in names and _innermost_loop(rule, c)
    )


def uncertain_steps(rule: StepView) -> list[cst.Call]:
    """Calls that hand an optimizer to a callable this analysis cannot see (a parameter, an object of unknown
    class: `step_fn(loss, optimizer)`, `self.helper.apply(self.opt)`), run by a loop (directly or through
    helpers) that has no optimizer update and no barrier that the analysis knows of: it may step there."""
    calls = rule.analysis.nodes.calls
    if not any(_is_optimizer_value(rule, a.value) for c in calls for a in c.args):
        return []
    covered = {id(loop) for _, loop, _ in _climb(rule)[0]}
    found = []
    for call in calls:
        if not any(_is_optimizer_value(rule, a.value) for a in call.args) or is_optimizer_update(rule, call):
            continue
        if not _unknown_callable(rule, call.func):
            continue
        loops = [loop for _, loop, _ in _climb_from(rule, [(call, None)])[0]]
        if any(
            id(loop) not in covered and not any(is_barrier(rule, c) for c in rule.nodes_in(loop.body, False).calls)
            for loop in loops
        ):
            found.append(call)
    return found


def _is_optimizer_value(rule: StepView, node: cst.CSTNode) -> bool:
    if is_optimizer_name(node):
        return True
    keys = rule.facts().optimizer_keys  # most modules have none: then no code is generated to compare
    return bool(keys) and isinstance(node, (cst.Name, cst.Attribute)) and code_of(node) in keys


def _unknown_callable(rule: StepView, func: cst.CSTNode) -> bool:
    """A callable whose code no analysis reaches: rooted in a parameter or a local of unknown origin, or an
    attribute of `self` (not a method of this class); not an import, a builtin or this module's function."""
    root = func
    while isinstance(root, cst.Attribute):
        root = root.value
    if not isinstance(root, cst.Name):
        return False
    receiver = func.value if isinstance(func, cst.Attribute) else func
    if classes_of(rule, receiver):
        return False  # an object of the tree's classes: the tree's summary says whether it steps
    if not _is_local_variable(rule, root) and rule.analysis.has_qualified_names(root):
        # an import, a builtin, a class or function of this module (a local is asked first: cheaper)
        return False
    if star_imported(rule, root.value) is not None:
        return False  # a function of the tree's module that this one star-imports: the tree's summary has it
    if root.value == "self":
        return isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute)  # self.x.method(), self.x()
    return True


def _is_local_variable(rule: StepView, name: cst.Name) -> bool:
    values = rule.assigned_values(name)
    func = rule.enclosing_function(name)
    is_param = func is not None and name.value in rule.scope(func).params
    return is_param or bool(values)


def _site(rule: StepView, call: cst.Call, loop: Loop, helper: str | None) -> BarrierSite | None:
    if any(is_barrier(rule, c) for c in rule.nodes_in(loop.body, False).calls):
        return None
    for anc in [loop, *rule.ancestors(loop)]:
        if isinstance(anc, cst.For) and (rule.iterates_device_loader(anc) or prepared_by_accelerate(rule, anc)):
            return None
    if draws_from_prepared(rule, loop):
        return None
    after = rule.statement_of(call)
    if after is None or after is loop:
        return None
    return BarrierSite(call, _after_scaler_update(rule, after), loop, helper)


def _innermost_loop(rule: StepView, node: cst.CSTNode) -> Loop | None:
    """The innermost loop of the same function that runs `node` on each iteration."""
    child = node
    for anc in rule.ancestors(node):
        if isinstance(anc, SCOPES):
            return None
        if isinstance(anc, (cst.For, cst.While)) and _runs_each_iteration(anc, child):
            return anc
        child = anc
    return None


def _helper_function(rule: StepView, node: cst.CSTNode) -> cst.FunctionDef | None:
    """The function `node` is in, when no loop, lambda or class lies between them."""
    for anc in rule.ancestors(node):
        if isinstance(anc, cst.FunctionDef):
            return anc
        if isinstance(anc, (cst.Lambda, cst.ClassDef, cst.For, cst.While)):
            return None
    return None


# nn.Module's own methods: `self.net.train()` in a method is the network's mode switch, not a call of a stepping
# method of the same name (`Agent.train()`, which runs the optimizer step)
MODULE_METHODS = frozenset({"train", "eval", "forward", "to", "cuda", "cpu", "zero_grad", "apply", "float", "half"})


def _calls(rule: StepView, call: cst.Call, func: cst.FunctionDef) -> bool:
    """`name(...)`, `self.name(...)`, `trainer.name(...)` for `func` named `name` (not a scheduler's method of the
    same name; for a method named as one of nn.Module's, only a receiver that may be an instance of its class)."""
    name = func.name.value
    target = call.func
    if isinstance(target, cst.Name):
        return target.value == name
    if not isinstance(target, cst.Attribute) or target.attr.value != name or "sched" in code_of(target.value).lower():
        return False
    cls = rule.enclosing_class(func)
    return cls is None or name not in MODULE_METHODS or _may_be_instance(rule, target.value, cls)


def _may_be_instance(rule: StepView, receiver: cst.BaseExpression, cls: cst.ClassDef) -> bool:
    """Is `receiver` `self` in a method of `cls`, or a value the tree or the module builds with `cls(...)`?"""
    if isinstance(receiver, cst.Name) and receiver.value == "self":
        return rule.enclosing_class(receiver) is cls
    if classes_of(rule, receiver):
        return definition_name(rule, cls) in classes_of(rule, receiver)
    values = rule.assigned_values(receiver) if isinstance(receiver, cst.Name) else []
    return bool(values) and all(isinstance(v, cst.Call) and identifier(v.func) == cls.name.value for v in values)


def _after_scaler_update(rule: StepView, stmt: cst.BaseStatement) -> cst.BaseStatement:
    """`stmt`, or the `scaler.update()` right after it: the barrier closes the step after the scale update."""
    block = rule.parent(stmt)
    body = list(getattr(block, "body", ()))
    index = next((i for i, s in enumerate(body) if s is stmt), None)
    if index is None or index + 1 >= len(body):
        return stmt
    following = body[index + 1]
    if isinstance(following, cst.SimpleStatementLine) and len(following.body) == 1:
        value = getattr(following.body[0], "value", None)
        if isinstance(value, cst.Call) and method_name(value) == "update" and not value.args:
            return following
    return stmt


def prepared_by_accelerate(rule: StepView, loop: cst.For) -> bool:
    """Does `loop` iterate a loader returned by `accelerator.prepare(...)` (it moves batches and syncs already)?"""
    name = rule.iterated_name(loop)
    if name is None or not rule.facts().uses("accelerate"):
        return False
    for assign in rule.analysis.nodes.assigns:
        if not (isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)):
            continue
        if method_name(assign.value) not in PREPARE_METHODS:
            continue
        for target in assign.targets:
            names = (
                [target.target]
                if isinstance(target.target, cst.Name)
                else [e.value for e in getattr(target.target, "elements", ())]
            )
            if any(isinstance(n, cst.Name) and n.value == name.value for n in names):
                return True
    return False


def draws_from_prepared(rule: StepView, loop: Loop) -> bool:
    """Does `loop` take its batches with `next(self.dl)` from a loader accelerate prepared (`self.dl =
    cycle(dl)` after `dl = accelerator.prepare(dl)`)? Its device loader marks a step per batch."""
    for call in rule.nodes_in(loop.body, False).calls:
        if not (rule.is_builtin(call.func, "next") and call.args):
            continue
        key = identifier(call.args[0].value)
        for assign in rule.analysis.nodes.assigns:
            if not (isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)):
                continue
            if not any(identifier(t.target) == key for t in assign.targets):
                continue
            value = assign.value
            if method_name(value) in PREPARE_METHODS or any(
                isinstance(a.value, cst.Name) and passed_to_accelerate(rule, a.value.value) for a in value.args
            ):
                return True
    return False


def passed_to_accelerate(rule: StepView, name: str) -> bool:
    """Is the local `name` handed to `accelerator.prepare(...)` (which evens out the batches of a loader)?"""
    if not rule.facts().uses("accelerate"):
        return False
    for call in rule.analysis.nodes.calls:
        if method_name(call) in PREPARE_METHODS and any(
            isinstance(arg.value, cst.Name) and arg.value.value == name for arg in call.args
        ):
            return True
    return False


def _start(rule: StepView, node: cst.CSTNode) -> tuple[int, int]:
    pos = rule.position(node).start
    return (pos.line, pos.column)
