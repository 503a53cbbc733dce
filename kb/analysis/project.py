"""Optimizer steps across the modules of one tree: which of the tree's functions, methods and callable classes
run an optimizer step each time they are called, so that a training loop in another module that calls them
gets its step barrier (`loss_scaler(loss, optimizer)` with a scaler class whose `__call__` steps, in MAE;
`self.mp_trainer.optimize(self.opt)` in guided-diffusion).

`ProjectSteps` is computed once per tree (kb/batch.py `summarize_project`, from each module's `ModuleSteps`,
see steps.py `module_steps`) and handed to the analysis of every module. Names are the tree's dotted module
paths (`util/misc.py` -> `util.misc`) followed by the definition's path: `util.misc.NativeScaler.__call__`,
`fp16_util.MixedPrecisionTrainer.optimize`, `train_lib.train_step`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import QualifiedNameSource

from ..cst_helpers import code_of, positional_args
from ..cst_walk import walk
from .bindings import TopLevelBindings
from .cst_scopes import full_name
from .device_facts import key_of
from .devices import FLAG_NAME
from .project_steps import UNKNOWN, absolute_module

_absolute = absolute_module

if TYPE_CHECKING:
    from .view import StepView


def absolute_names(rule: StepView, node: cst.CSTNode) -> set[str]:
    """Dotted names of what `node` refers to, absolute: imports (relative ones resolved against this module)
    and the module's own top-level definitions (`Trainer` -> `train.Trainer`)."""
    module = rule.analysis.module_name or ""
    name = full_name(node)
    if name is not None:
        # the answers of libcst's scope analysis that need no analysis of the whole module
        head = name.partition(".")[0]
        bindings = rule.analysis.names().top_level
        if head not in bindings.outside_functions:
            # nothing libcst would name without `<locals>` binds it: only imports can name it, and the module's
            # import table answers those (`self.x`, a local, a parameter), or a star import of the tree's module
            found = {_absolute(n, module) for n in rule.analysis.imported_names(node)}
            star = None if found else star_imported(rule, name)
            return {star} if star else found
        if head not in rule.analysis.names().imported_heads:
            # no import of it anywhere: a module-level binding names itself, a function's local nothing
            scope = _binding_scope(rule, node, head, bindings)
            if scope == "module" and head in bindings.module_level:
                return {f"{module}.{name}"} if module else set()
            if scope == "function" or scope == "module" and head not in bindings.module_unsure:
                return set()  # a function's local, or bound only in a class body or a comprehension
    found = set()
    if name is not None and (star := star_imported(rule, name)) is not None:
        return {star}
    if name is not None and name.partition(".")[0] in rule.analysis.names().imported_heads:
        # bound by an import and otherwise (`try: from a import f` / `except ImportError: def f(): ...`): the
        # module's tables answer where libcst's order of the bindings is certain
        read = rule.analysis.names().read_bindings(node)
        if read is not None:
            imported, own = read
            found = {_absolute(n, module) for n in imported}
            if own and module:
                found.add(f"{module}.{name}")
            return found
    for q in rule.analysis.qualified_name_objects(node):
        if q.source is QualifiedNameSource.IMPORT:
            found.add(_absolute(q.name, module))
        elif q.source is QualifiedNameSource.LOCAL and "<locals>" not in q.name and module:
            found.add(f"{module}.{q.name}")
    return found


_CST_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _binding_scope(rule: StepView, node: cst.CSTNode, head: str, bindings: TopLevelBindings) -> str | None:
    """Where the binding of `head` that `node` sees is: "function" (the innermost function body around `node`
    that binds it), "module" (no function body around binds it), or None: unknown here (a class body, a
    comprehension or a lambda is in between, or the function's binding is unsure: the slow path)."""
    functions = rule.analysis.names().function_bindings
    in_function = False  # the walk up passed through a function's body
    outside = False  # the walk up came through a parameter's default or annotation
    child = node
    for anc in rule.ancestors(node):
        kind = type(anc)
        if kind is cst.Param and child is not anc.name:
            outside = True
        elif kind is cst.FunctionDef:
            if child is not anc.body:
                # a decorator, the return annotation, a parameter's default or annotation: read in the scope around
                # the function, as in libcst (cst_scopes.scopes_around); a parameter's own name is the function's
                if child is anc.params and not outside:
                    return None
                outside = False
                child = anc
                continue
            if functions is None:
                return None
            own, unsure, declared_global, declared_nonlocal = functions[anc]
            if head in declared_global:
                return "module"  # declared `global` here: the module's binding, read or written
            if head in declared_nonlocal:
                return "function"  # an enclosing function's local (libcst names it `outer.<locals>.x`)
            if head in own:
                return "function"  # a local (or a `nonlocal`'s): whatever else the function does with it
            if head in unsure:
                return None
            in_function = True
        elif kind is cst.ClassDef:
            if not in_function and child is anc.body and head in rule.analysis.names().bindings.class_bound:
                return None  # in a class body that may bind it: libcst names its bindings `Class.x`
            # a class body that binds no such name sees the scope around it; so do its decorators and bases
        elif kind in _CST_SCOPES:
            if _binds(anc, head):
                if kind is not cst.Lambda and _iterates_into(anc, head) and _in_function_body(rule, anc):
                    return "function"  # a comprehension's own variable in a function (`f.<locals>.<comprehension>.x`)
                return None
            # a comprehension or lambda that does not bind `head` sees the binding of the scope around it
        child = anc
    return "module"


def _binds(scope: cst.CSTNode, head: str) -> bool:
    """Might a comprehension or lambda bind `head` itself (a `for` target, a parameter, a `:=`)?"""
    if isinstance(scope, cst.Lambda):
        params = scope.params
        every = [*params.posonly_params, *params.params, *params.kwonly_params]
        every += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
        return any(p.name.value == head for p in every) or _has_walrus(scope)
    return _iterates_into(scope, head) or _has_walrus(scope)


def _iterates_into(comprehension: cst.CSTNode, head: str) -> bool:
    """Is `head` a `for` target of the comprehension (its own variable, whatever the scopes around declare)?"""
    for_in = getattr(comprehension, "for_in", None)
    while for_in is not None:
        if any(isinstance(n, cst.Name) and n.value == head for n in walk(for_in.target)):
            return True
        for_in = for_in.inner_for_in
    return False


def _in_function_body(rule: StepView, node: cst.CSTNode) -> bool:
    child = node
    for anc in rule.ancestors(node):
        if type(anc) is cst.FunctionDef and child is anc.body:
            return True
        child = anc
    return False


def _has_walrus(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.NamedExpr) for n in walk(node))


STAR_IMPORT = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+\*", re.MULTILINE)


def _star_targets(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules of `sources` it star-imports (relative ones resolved against the importer)."""
    targets: dict[str, set[str]] = {}
    for importer, text in sources.items():
        for target in STAR_IMPORT.findall(text):
            targets.setdefault(importer, set()).add(_absolute(target, importer))
    return targets


def star_exports(sources: dict[str, str]) -> frozenset[tuple[str, str]]:
    """(module, name) for each top-level definition of the modules (module name -> text) that some module
    star-imports. Relative star imports are resolved against the importing module."""
    wanted = {m for targets in _star_targets(sources).values() for m in targets}
    found = set()
    for module in wanted & sources.keys():
        try:
            tree = ast.parse(sources[module])
        except (SyntaxError, ValueError):
            continue
        found.update((module, name) for name in _top_level_names(tree))
    return frozenset(found)


def star_torch_imports(sources: dict[str, str]) -> frozenset[tuple[str, str, str]]:
    """(module, name, torch's name) for each name that `from module import *` binds to a torch module or object
    by an import in that module (`import torch.nn as nn`: nn is torch.nn; `from torch import optim`;
    `import torch.nn.functional as F`), also through its own star imports of the tree (`from base import *`).
    Only names the module binds by torch imports alone, and only those of a literal `__all__` when it has one."""
    targets = _star_targets(sources)
    wanted = {m for found in targets.values() for m in found} & sources.keys()
    own: dict[str, dict[str, str]] = {}
    other: dict[str, set[str]] = {}  # names the module binds any other way (anywhere in it)
    public: dict[str, set[str] | None] = {}  # `__all__` when literal
    for module in wanted:
        try:
            tree = ast.parse(sources[module])
        except (SyntaxError, ValueError):
            continue
        own[module], other[module] = _torch_imports(tree)
        names = _top_level_names(tree)
        public[module] = names if _literal_all(tree) else None
    changed = True
    while changed:  # a module re-exports what its own star imports give it (one pass per level of the chain)
        changed = False
        for module, found in own.items():
            if not targets.get(module, set()) <= sources.keys():
                continue  # a star import from outside the tree could bind any name
            for source in targets.get(module, ()):
                for name, target in own.get(source, {}).items():
                    if name in other[module]:
                        continue
                    if name not in found:
                        found[name] = target
                        changed = True
                    elif found[name] != target:  # two torch names for one name: which wins depends on order
                        del found[name]
                        other[module].add(name)
                        changed = True
    return frozenset(
        (module, name, target)
        for module, found in own.items()
        for name, target in found.items()
        if not name.startswith("_") and (public[module] is None or name in public[module])
    )


def _torch_imports(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """(name -> torch's name for the names the module's top-level imports of torch bind; every other name the
    module binds anywhere, and the names bound by two different torch imports)."""
    imports: dict[str, set[str]] = {}
    top = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            top.add(id(stmt))
            for alias in stmt.names:
                torch = alias.name == "torch" or alias.name.startswith("torch.")
                local = alias.asname or alias.name.partition(".")[0]
                imports.setdefault(local, set()).add(
                    (alias.name if alias.asname else local) if torch else f"!{alias.name}"
                )
        elif isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module:
            top.add(id(stmt))
            torch = stmt.module == "torch" or stmt.module.startswith("torch.")
            for alias in stmt.names:
                if alias.name != "*":
                    full = f"{stmt.module}.{alias.name}"
                    imports.setdefault(alias.asname or alias.name, set()).add(full if torch else f"!{full}")
    other = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
            other.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            other.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other.add(node.name)
        elif isinstance(node, ast.arg):
            other.add(node.arg)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            other.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            other.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            other.add(node.name)
    found = {}
    for name, bound in imports.items():
        if len(bound) == 1 and not next(iter(bound)).startswith("!") and name not in other:
            found[name] = next(iter(bound))
        else:
            other.add(name)
    return found, other


def _literal_all(tree: ast.Module) -> bool:
    return any(
        isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
        and isinstance(stmt.value, (ast.List, ast.Tuple))
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in stmt.value.elts)
        for stmt in tree.body
    )


def _top_level_names(tree: ast.Module) -> set[str]:
    """What `from module import *` binds: `__all__` when it is a literal list, else the top-level definitions."""
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets):
            if isinstance(stmt.value, (ast.List, ast.Tuple)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in stmt.value.elts
            ):
                return {e.value for e in stmt.value.elts}
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("_")}


def star_imported(rule: StepView, name: str) -> str | None:
    """`utils.save_checkpoint` for `save_checkpoint` when nothing in this module binds it and the module
    star-imports a module of the tree that defines it (`from utils import *`); else None."""
    project = rule.analysis.project
    head = name.partition(".")[0]
    if project is None or not project.exports or head in rule.analysis.names().bound:
        return None
    module = rule.analysis.module_name or ""
    for imp in rule.analysis.nodes.imports:
        if not (isinstance(imp, cst.ImportFrom) and isinstance(imp.names, cst.ImportStar)):
            continue
        target = "." * len(imp.relative) + (full_name(imp.module) if imp.module is not None else "")
        source = _absolute(target, module)
        if (source, head) in project.exports:
            return f"{source}.{name}"
    return None


def definition_name(rule: StepView, func: cst.FunctionDef) -> str:
    """`module.Class.method` / `module.function` of a definition in this module."""
    parts = [func.name.value]
    for anc in rule.ancestors(func):
        if isinstance(anc, (cst.ClassDef, cst.FunctionDef)):
            parts.append(anc.name.value)
    module = rule.analysis.module_name
    return ".".join(([module] if module else []) + parts[::-1])


def classes_of(rule: StepView, value: cst.CSTNode) -> set[str]:
    """The tree's classes `value` is an instance of, when every value it can hold is built by one:
    `NativeScaler()`, a local assigned `NativeScaler()`, `self.trainer` assigned `Trainer(...)` in the class,
    a parameter that every caller in the tree passes such an instance."""
    project = rule.analysis.project
    if project is None:
        return set()
    if isinstance(value, cst.Call):
        return {r for r in map(project.resolve, absolute_names(rule, value.func)) if r is not None}
    values: list[cst.BaseExpression] = []
    if isinstance(value, cst.Name):
        func = rule.enclosing_function(value)
        if func is not None and value.value in rule.scope(func).params and value.value not in rule.scope(func).assigns:
            klass = project.class_of_param(definition_name(rule, func), value.value)
            return {klass} if klass else set()
        values = rule.assigned_values(value)
    elif isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.value.value == "self":
        cls = rule.enclosing_class(value)
        if cls is None:
            return set()
        key = code_of(value)
        for assign in rule.nodes_in(cls).assigns:
            if isinstance(assign, cst.Assign) and any(code_of(t.target) == key for t in assign.targets):
                values.append(assign.value)
    if not values or not all(isinstance(v, cst.Call) for v in values):
        return set()
    found = [classes_of(rule, v) for v in values]
    return set.union(*found) if all(found) else set()


def project_step(rule: StepView, call: cst.Call) -> bool:
    """Does `call` run one of the tree's stepping callables: `train_step(...)`, `scaler(...)` (an instance of
    a class whose `__call__` steps), `self.trainer.optimize(opt)`?"""
    return bool(project_steppers(rule, call))


def project_steppers(rule: StepView, call: cst.Call) -> set[str]:
    """The full names of the tree's stepping callables that `call` runs (see `project_step`)."""
    project = rule.analysis.project
    if project is None or not project.steppers:
        return set()
    names = {project.resolve(n) for n in absolute_names(rule, call.func)} & project.steppers
    if names:
        return names
    func = call.func
    if isinstance(func, cst.Attribute):
        receiver, method = func.value, func.attr.value
    else:
        receiver, method = func, "__call__"
    if isinstance(receiver, cst.Name) and receiver.value == "self":
        return set()  # the module's own methods: steps.py follows them
    return {f"{klass}.{method}" for klass in classes_of(rule, receiver)} & project.steppers


def passes(rule: StepView) -> tuple[tuple[str, int | str, str], ...]:
    """What this module passes to the tree's functions: (function, position or keyword, class) for each
    argument, the class `UNKNOWN` when the argument is not an instance of one class of the tree."""
    found = []
    for callees, arguments in _tree_calls(rule):
        for where, arg in arguments:
            classes = {r for r in map(rule.analysis.project.resolve, _constructed(rule, arg.value)) if r is not None}
            klass = next(iter(classes)) if len(classes) == 1 else UNKNOWN
            found += [(callee, where, klass) for callee in callees]
    return tuple(found)


def flag_passes(rule: StepView) -> tuple[tuple[str, int | str, str], ...]:
    """The device flags this module passes to the tree's functions: (function, position or keyword, the flag's
    key) for each argument named like one (`load_data(path, args.cuda)`, `to_device(x, self.use_cuda)`)."""
    found = []
    for callees, flags in _tree_calls(rule, _flags):
        found += [(callee, where, key) for callee in sorted(callees) for where, key in flags]
    return tuple(found)


Place = int | str  # an argument's position, or its keyword


def _tree_calls(
    rule: StepView, select: Callable[[list[tuple[Place, cst.Arg]]], list] | None = None
) -> Iterator[tuple[set[str], list]]:
    """The module's calls that name functions of the tree: (those functions, the call's arguments but `*args` and
    `**kwargs` with their places), one call at a time. `select`: a cheap look at the arguments, made before the
    call's name is resolved (the cost of this summary): what it keeps replaces the arguments, and a call it keeps
    nothing of is not resolved."""
    project = rule.analysis.project
    if project is None:
        return
    defined, imported = project.defined, rule.analysis.names().imported_heads
    for call in rule.analysis.nodes.calls:
        kept = select(_arguments(call)) if select is not None else None
        if select is not None and not kept:
            continue
        if defined is not None and not _may_name_function(call.func, defined, imported):
            continue  # resolving its name would find none of the tree's functions
        callees = {r for r in map(project.resolve, absolute_names(rule, call.func)) if r is not None}
        if callees:
            yield callees, kept if select is not None else _arguments(call)


def _arguments(call: cst.Call) -> list[tuple[Place, cst.Arg]]:
    positions = {id(a): i for i, a in enumerate(positional_args(call))}
    return [
        (arg.keyword.value if arg.keyword is not None else positions[id(arg)], arg) for arg in call.args if not arg.star
    ]


def _flags(arguments: list[tuple[Place, cst.Arg]]) -> list[tuple[Place, str]]:
    """(place, key) of the arguments named like a device flag (`args.cuda`, `self.use_cuda`)."""
    return [
        (where, key)
        for where, arg in arguments
        if isinstance(arg.value, (cst.Name, cst.Attribute)) and FLAG_NAME.search(key := key_of(arg.value) or "")
    ]


def _may_name_function(func: cst.CSTNode, defined: frozenset[str], imported: frozenset[str]) -> bool:
    """Can `func` name a function whose name is one of `defined`? A name resolves to a name that ends as it
    does (`x.step` -> `pkg.mod.step`), unless an import renames it (`from m import step as run`: `run`)."""
    kind = type(func)
    if kind is cst.Attribute:
        return func.attr.value in defined
    if kind is cst.Name:
        return func.value in defined or func.value in imported
    return True


def _constructed(rule: StepView, value: cst.CSTNode) -> set[str]:
    """Absolute names of the classes that build `value` (a call, or a name assigned only calls)."""
    if isinstance(value, cst.Call):
        return absolute_names(rule, value.func)
    if isinstance(value, cst.Name):
        values = rule.assigned_values(value)
        if values and all(isinstance(v, cst.Call) for v in values):
            return set.union(*(absolute_names(rule, v.func) for v in values))
    return set()
