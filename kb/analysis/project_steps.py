"""What each module of a tree tells the others about its optimizer steps (`ModuleSteps`), and their sum over the
tree (`ProjectSteps`), which the analysis of every module holds. Plain data: project.py and steps.py compute it."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePath

UNKNOWN = "?"  # an argument that is not an instance of one known class of the tree


@lru_cache(maxsize=8192)  # a tree's summary asks for every module's name in each round
def module_name(path: str | PurePath) -> str:
    """`util/misc.py` -> `util.misc`; `pkg/__init__.py` -> `pkg`."""
    parts = list(PurePath(path).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(p for p in parts if p not in ("", "."))


@dataclass(frozen=True)
class ModuleSteps:
    """What one module tells the tree: the callables defined here that step once per call, their parameters,
    and the instances of the tree's classes that it passes to the tree's functions."""

    module: str
    steppers: frozenset[str] = frozenset()  # full names
    signatures: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (function, parameter names in order)
    # (the tree's function called; argument position or keyword; the tree's class of the argument, or UNKNOWN)
    passes: tuple[tuple[str, int | str, str], ...] = ()
    # the tree's functions (full names) that this module calls once per training step: from a step loop, or
    # from a function that itself runs every step (a `forward`, a helper the loop calls)
    per_step_calls: frozenset[str] = frozenset()
    # what the module's tests of device flags guard (devices.py `flag_tests`): ("key:KEY" or
    # "param:FUNCTION:PARAMETER", "device" or "blocked"), and the flags it passes to the tree's functions
    # (function, position or keyword, the flag's key)
    gates: tuple[tuple[str, str], ...] = ()
    flag_passes: tuple[tuple[str, int | str, str], ...] = ()
    # the tree's stepping callables (full names) that this module calls, from a loop or not: a stepper nobody in
    # the tree calls gets its barrier at its own end (steps.py `barrier_sites`)
    stepper_calls: frozenset[str] = frozenset()
    # the last names of the tree's stepping callables that this module calls in a loop, resolved or not
    # (`agent.train()` with `agent = build(kind)`)
    looped_names: frozenset[str] = frozenset()
    # (function, position): this module's functions whose return holds a sparse tensor there (sparse.py)
    sparse_returns: frozenset[tuple[str, int]] = frozenset()


@dataclass(frozen=True)
class ProjectSteps:
    modules: frozenset[str] = frozenset()
    steppers: frozenset[str] = frozenset()
    # (function, parameter, class): every call of the function in the tree passes an instance of the class there
    param_classes: frozenset[tuple[str, str, str]] = frozenset()
    # (path, module) where a caller names a module's file by another path than its path from the root
    # (`xlaport lint DIR` names them `DIR/engine.py`)
    paths: frozenset[tuple[str, str]] = frozenset()
    # (module, name): the top-level names of the tree's modules that another module star-imports
    # (`from utils import *` in train.py: `save_checkpoint` there is `utils.save_checkpoint`)
    exports: frozenset[tuple[str, str]] = frozenset()
    # (module, name, torch's name): what `from module import *` binds to torch by that module's imports
    # (`import torch.nn as nn` in common.py: `nn` in a module that does `from common import *` is torch.nn)
    star_torch: frozenset[tuple[str, str, str]] = frozenset()
    # the tree's functions that some module calls once per training step (steps.py `per_step_functions`)
    per_step: frozenset[str] = frozenset()
    # the tree's stepping callables that some module of the tree calls (`ModuleSteps.stepper_calls`)
    called: frozenset[str] = frozenset()
    looped_names: frozenset[str] = frozenset()  # `ModuleSteps.looped_names` of every module
    sparse_returns: frozenset[tuple[str, int]] = frozenset()  # `ModuleSteps.sparse_returns` of every module
    # every name the tree's texts define with `def` (None: not known). `combine` keeps only what is passed to the
    # tree's functions, so project.py `passes` resolves no call that cannot name one of them
    defined: frozenset[str] | None = None
    # keys of device flags that choose the device somewhere in the tree, and guard no CUDA-only call anywhere in
    # it: tested by that key (`if args.cuda: model.cuda()`), or passed to a parameter that is (`load(path,
    # args.cuda)` with `def load(path, cuda): ... x.cuda() if cuda else x`). A CUDA test assigned to one of them
    # flips (devices.py `tree_device_flags`).
    device_flags: frozenset[str] = frozenset()

    def star_torch_names(self, module: str, tree: ast.Module) -> dict[str, str]:
        """Name -> torch's name, for the names `module` (parsed: `tree`) gets from its top-level star imports of
        the tree's modules by their imports of torch (`star_torch`). A name that two of its star imports give
        differently, or one that another of them defines, is left out, and so is everything when one of its star
        imports is not a module of the tree (it could bind any name)."""
        if not self.star_torch:
            return {}
        targets = [
            absolute_module("." * stmt.level + (stmt.module or ""), module)
            for stmt in tree.body
            if isinstance(stmt, ast.ImportFrom) and any(alias.name == "*" for alias in stmt.names)
        ]
        if not targets or any(t not in self.modules for t in targets):
            return {}
        given: dict[str, set[str]] = {}
        for source, name, target in self.star_torch:
            if source in targets:
                given.setdefault(name, set()).add(target)
        return {
            name: next(iter(found))
            for name, found in given.items()
            if len(found) == 1 and not any((t, name) in self.exports for t in targets)
        }

    def module_of(self, path: str) -> str:
        """The dotted name of the module at `path` (relative to the tree's root, or as `paths` names it)."""
        return next((m for p, m in self.paths if p == path), None) or module_name(path)

    @classmethod
    def combine(cls, summaries: list[ModuleSteps]) -> ProjectSteps:
        project = cls(modules=frozenset(s.module for s in summaries))
        steppers = frozenset(s for m in summaries for s in m.steppers)
        signatures = {name: params for m in summaries for name, params in m.signatures}
        seen: dict[tuple[str, str], set[str]] = {}
        for summary in summaries:
            for function, where, owner in summary.passes:
                if function not in signatures:
                    continue
                params = signatures[function]
                if isinstance(where, int):
                    where = params[where] if where < len(params) else None
                if where in params:
                    seen.setdefault((function, where), set()).add(owner)
        bound = frozenset((f, p, k) for (f, p), c in seen.items() if len(c) == 1 and (k := next(iter(c))) != UNKNOWN)
        per_step = frozenset(f for m in summaries for f in m.per_step_calls)
        called = frozenset(f for m in summaries for f in m.stepper_calls)
        looped = frozenset(n for m in summaries for n in m.looped_names)
        sparse = frozenset(r for m in summaries for r in m.sparse_returns)
        return cls(
            modules=project.modules,
            steppers=steppers,
            param_classes=bound,
            per_step=per_step,
            device_flags=_device_flags(summaries, signatures),
            called=called,
            looped_names=looped,
            sparse_returns=sparse,
        )

    def resolve(self, name: str) -> str | None:
        """The tree's full name of a definition that code names `name` (absolute, as imported); None when
        it is not the tree's. A module may be named from a folder above the tree's root (`pkg.util.misc`)."""
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            if module in self.modules:
                return name
            matches = _by_suffix(self.modules).get(module, ())
            if len(matches) == 1:
                return ".".join([matches[0], *parts[cut:]])
        return None

    def class_of_param(self, function: str, param: str) -> str | None:
        return next((k for f, p, k in self.param_classes if f == function and p == param), None)


def _device_flags(summaries: list[ModuleSteps], signatures: dict[str, tuple[str, ...]]) -> frozenset[str]:
    verdicts: dict[str, set[str]] = {}
    for summary in summaries:
        for gated, verdict in summary.gates:
            verdicts.setdefault(gated, set()).add(verdict)
    for summary in summaries:
        for function, where, key in summary.flag_passes:
            params = signatures.get(function, ())
            if isinstance(where, int):
                where = params[where] if where < len(params) else None
            if where in params:
                verdicts.setdefault(f"key:{key}", set()).update(verdicts.get(f"param:{function}:{where}", ()))
    return frozenset(
        name.removeprefix("key:")
        for name, found in verdicts.items()
        if name.startswith("key:") and "device" in found and "blocked" not in found
    )


@lru_cache(maxsize=8)
def _by_suffix(modules: frozenset[str]) -> dict[str, list[str]]:
    """Dotted suffix -> the modules whose name ends with it after a dot (`util.misc` -> [`pkg.util.misc`]): a
    name is resolved once per call of every module, so no scan of the tree's modules each time."""
    index: dict[str, list[str]] = {}
    for name in modules:
        parts = name.split(".")
        for cut in range(1, len(parts)):
            index.setdefault(".".join(parts[cut:]), []).append(name)
    return index


def absolute_module(name: str, module: str) -> str:
    """`name` as imported in `module`, absolute (`..utils` in `pkg.sub.train` -> `pkg.utils`)."""
    dots = len(name) - len(name.lstrip("."))
    if not dots:
        return name
    package = module.split(".")[: max(0, module.count(".") + 1 - dots)]
    return ".".join([*package, name[dots:]])
