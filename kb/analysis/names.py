"""Import-resolved names from per-module import tables, without libcst's scope analysis.

libcst's QualifiedNameProvider resolves names through a scope analysis of the whole module (about three times
the cost of parsing it). The names rules ask about are nearly all imports (`import torch.distributed as dist`,
`from torch.cuda.amp import autocast`, `import matplotlib.pyplot as plt` inside a function): when the module and
the functions around a node bind its name by imports alone, the import tables give libcst's answer. Where they
also bind it otherwise (`try: import numpy as np` / `except ImportError: np = None`, a parameter named like an
import), libcst's rules are followed here: a read takes the bindings of its own scope that come before it (by
statement lines), anything else every binding of the innermost scope that has one. What remains uncertain (a
name bound in a class body, a lambda or a comprehension, `global`, a read inside the statement that binds it, a
`for` target) is answered by libcst's scope analysis, which the module then pays for once.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Collection, Mapping
from functools import cached_property

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import ImportAssignment, QualifiedName, QualifiedNameSource

from .bindings import TopLevelBindings, module_bindings, own_bindings, top_level_bindings
from .cst_scopes import (
    head_name,
    import_scope,
    in_class_scope,
    is_method,
    is_read,
    own_scope,
    resolved_name,
    scopes_around,
)

Resolver = Callable[[cst.CSTNode], Collection[QualifiedName]]


def _dotted_names(node: cst.BaseExpression) -> list[str]:
    """`a.b.c` -> ["a.b.c", "a.b", "a"]: the names an `import a.b.c` binds, as libcst records them."""
    name = get_full_name_for_node(node) or ""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)] if name else []


_TARGETS = {cst.AssignTarget, cst.AnnAssign, cst.For}
_UNPACKING = {cst.Element, cst.StarredElement, cst.Tuple, cst.List}  # between a target and the names it unpacks into
_OTHER_TARGETS = {cst.AsName, cst.CompFor, cst.Del}


class FunctionBindings:
    """libcst's function definition -> `own_bindings` of CPython's same definition, found on first use (a tree's
    summary asks about the functions around a few names of each module)."""

    def __init__(self, pairs: dict[cst.FunctionDef, ast.FunctionDef | ast.AsyncFunctionDef]) -> None:
        self.pairs = pairs
        self.found: dict[cst.FunctionDef, tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]] = {}

    def __getitem__(
        self, function: cst.FunctionDef
    ) -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
        found = self.found.get(function)
        if found is None:
            found = self.found[function] = own_bindings(self.pairs[function])
        return found


class ImportNames:
    """The alias table of one module: the import-resolved and builtin names of a node, as libcst gives them."""

    def __init__(
        self,
        tree: ast.Module,
        imports: list[cst.Import | cst.ImportFrom],
        parents: dict,
        fallback: Resolver,
        functions: list[cst.FunctionDef],
        line_of: Callable[[cst.CSTNode], int | None] | None = None,
        star_names: Mapping[str, str] | None = None,
    ) -> None:
        """`functions`: the module's function definitions in source order; `line_of`: a node's first line (None:
        unknown), for names bound both ways around a node; `star_names`: name -> torch's name for what the
        module's star imports of its tree bind by imports of torch (ProjectSteps.star_torch_names)."""
        self.parents = parents
        self.fallback = fallback
        self.line_of = line_of
        # scope (the module or a function) -> dotted name -> the imports there that bind it (libcst's assignments)
        self.tables: dict[cst.CSTNode, dict[str, list[ImportAssignment]]] = {}
        for stmt in imports:
            scope = import_scope(stmt, self.parents)
            if scope is None or isinstance(stmt.names, cst.ImportStar):
                continue  # in a class body: its names are resolved by the fallback
            table = self.tables.setdefault(scope, {})
            for alias in stmt.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                for name in _dotted_names(bound):
                    table.setdefault(name, []).append(ImportAssignment(name, None, stmt, 0, bound))
        # heads that only the module's own imports bind: their dotted names resolve the same wherever they are read
        # (where `_answerable`), so each is resolved once (`_resolved`)
        in_functions = {
            n.partition(".")[0] for scope, t in self.tables.items() if type(scope) is not cst.Module for n in t
        }
        self.module_heads = {n.partition(".")[0] for t in self.tables.values() for n in t} - in_functions
        self._resolved: dict[str, frozenset[str]] = {}
        self.tree = tree
        self.functions = functions
        self.bindings = module_bindings(tree)
        self.imported_heads = self.bindings.imported
        self.bound = self.bindings.bound
        # `from utils import *` as the module's only source of `torch` (utils.py did `import torch`): a `torch`
        # nothing here binds can only be what the star import gives, and no code binds that name to anything else
        self.star_torch = "torch" not in self.bound and any(
            isinstance(stmt, ast.ImportFrom) and any(alias.name == "*" for alias in stmt.names) for stmt in tree.body
        )
        # `nn`, `F`, `optim` from `from common import *` (common.py: `import torch.nn as nn`, ...): only where
        # nothing in this module binds the name
        self.star_names = {n: t for n, t in (star_names or {}).items() if n not in self.bound}
        if self.star_torch:
            self.star_names.setdefault("torch", "torch")
        numbered = self.bindings.functions
        # libcst's functions -> their numbers in Bindings (None when the two trees disagree: every scope counts)
        self.numbers: dict[cst.CSTNode, int] | None = (
            {f: i for i, f in enumerate(functions, 1)} if numbered == len(functions) else None
        )

    @cached_property
    def top_level(self) -> TopLevelBindings:
        """What the module binds outside function bodies and in each function (built on first use)."""
        return top_level_bindings(self.tree, self.bindings)

    @cached_property
    def function_bindings(self) -> FunctionBindings | None:
        """libcst's function definitions -> (what each binds in its own scope, what it binds unsurely, what it
        declares `global`), paired in source order with CPython's (by name); None when they do not pair."""
        ast_functions = self.top_level.functions
        if len(self.functions) != len(ast_functions):
            return None
        if any(d.name.value != f.name for d, f in zip(self.functions, ast_functions, strict=True)):
            return None
        return FunctionBindings(dict(zip(self.functions, ast_functions, strict=True)))

    def _answerable(self, node: cst.CSTNode, head: str) -> bool:
        """Do the import tables give libcst's answer for `head` at `node`? Yes unless the module and functions
        around `node` bind `head` other than by imports (a parameter, an assignment), or order matters there
        (a read before its import), or a class body, lambda or comprehension binds it."""
        b = self.bindings
        if head in b.tangled or head in b.class_bound and in_class_scope(node, self.parents):
            return False
        scopes = b.others.get(head, set()) | b.ordered.get(head, set())
        if not scopes:
            return True
        if self.numbers is None:
            return False
        return not any(self.numbers.get(scope, 0) in scopes for scope in scopes_around(node, self.parents))

    def imported(self, node: cst.CSTNode) -> frozenset[str]:
        """The import-resolved names of `node` (`dist.init_process_group` -> torch.distributed.init_process_group)."""
        if head_name(node) not in self.imported_heads:
            target = self.star_names.get(head_name(node)) if self.star_names else None
            if target is not None:
                full = resolved_name(node, self.parents)
                return frozenset({target + full[len(head_name(node)) :]}) if full else frozenset()
            return frozenset()  # most names: no import binds their head (checked before any parent is looked up)
        full = resolved_name(node, self.parents)
        head = full.partition(".")[0] if full else None
        if head not in self.imported_heads:
            return frozenset()
        if not self._answerable(node, head):
            found = self._in_order(node, full, head)
            if found is None:
                return frozenset(q.name for q in self.fallback(node) if q.source is QualifiedNameSource.IMPORT)
            return frozenset(q.name for a in found[0] for q in a.get_qualified_names_for(full))
        if head in self.module_heads:
            resolved = self._resolved.get(full)
            if resolved is None:
                resolved = self._resolved[full] = self._import_names(node, full)
            return resolved
        return self._import_names(node, full)

    def _import_names(self, node: cst.CSTNode, full: str) -> frozenset[str]:
        return frozenset(q.name for a in self._assignments(node, full) for q in a.get_qualified_names_for(full))

    def builtin(self, node: cst.CSTNode) -> str | None:
        """`builtins.len` for `len` when it names the builtin (nothing in its scope shadows it)."""
        full = resolved_name(node, self.parents)
        head = full.partition(".")[0] if full else ""
        if not hasattr(builtins, head):
            return None
        if head not in self.bound:
            return f"builtins.{head}"
        if self._answerable(node, head):
            return None if self._assignments(node, head) else f"builtins.{head}"
        found = self._in_order(node, head, head)
        if found is not None:
            return None if found[0] or found[1] else f"builtins.{head}"
        return next((q.name for q in self.fallback(node) if q.source is QualifiedNameSource.BUILTIN), None)

    def qualified(self, node: cst.CSTNode) -> Collection[QualifiedName]:
        """libcst's whole QualifiedNameProvider answer for `node`, local names included (those need the fallback
        unless the name is unbound or bound by imports alone around `node`)."""
        full = resolved_name(node, self.parents)
        head = full.partition(".")[0] if full else None
        if head is None:
            return set()
        if head in self.bound and not self._answerable(node, head):
            return self.fallback(node)
        found = {QualifiedName(name, QualifiedNameSource.IMPORT) for name in self.imported(node)}
        builtin = None if found else self.builtin(node)
        return found | ({QualifiedName(builtin, QualifiedNameSource.BUILTIN)} if builtin else set())

    def has_names(self, node: cst.CSTNode) -> bool:
        """`bool(self.qualified(node))` (does libcst resolve `node` to anything: an import, a builtin, a local?),
        answered from the tables where they know (a local's qualified name needs libcst's scope analysis)."""
        full = resolved_name(node, self.parents)
        head = full.partition(".")[0] if full else None
        if head is None:
            return False
        if head not in self.bound or self._answerable(node, head):
            return bool(self.imported(node)) or self.builtin(node) is not None
        found = self._in_order(node, full, head)
        if found is None:
            return bool(self.fallback(node))
        imports, others, _ = found
        return bool(imports) or others or hasattr(builtins, head)

    def read_bindings(self, node: cst.CSTNode) -> tuple[frozenset[str], bool] | None:
        """For a name that the scopes around `node` bind both by imports and otherwise (`try: from a import f` /
        `except ImportError: def f(): ...`): (the import-resolved names of `node`, whether the module's own
        binding counts too: libcst's LOCAL name, the dotted name itself), in libcst's order of bindings. None
        where only libcst's scope analysis knows (a class body binds it, the order is not certain here)."""
        full = resolved_name(node, self.parents)
        head = full.partition(".")[0] if full else None
        if head is None or head in self.bindings.class_bound and in_class_scope(node, self.parents):
            return None
        found = self._in_order(node, full, head)
        if found is None:
            return None
        imports, others, scope = found
        names = frozenset(q.name for a in imports for q in a.get_qualified_names_for(full))
        return names, others and type(scope) is cst.Module

    def _in_order(
        self, node: cst.CSTNode, full: str, head: str
    ) -> tuple[list[ImportAssignment], bool, cst.CSTNode | None] | None:
        """libcst's assignments for `head` at `node` where the scopes around it bind `head` both by imports and
        otherwise: (the imports among them, whether there are others, the scope they are in). libcst takes every
        binding of the innermost scope that has one, or, when that is the node's own scope, those before the node
        (by the statements' lines), else the next scope's. None where that order is not certain here: the
        fallback answers."""
        b = self.bindings
        if self.numbers is None or self.line_of is None or head in b.tangled:
            return None
        scopes = scopes_around(node, self.parents)
        if full != head and any(
            full.startswith(name + ".") or full == name for s in scopes for name in self._dotted(s)
        ):
            return None  # a dotted import (`import a.b`) decides: not handled here
        parent = self.parents.get(node)
        kind = type(parent)
        unpacked = self._unpacked_into(node) if kind in _UNPACKING else None
        if type(node) is cst.Name and (kind in _TARGETS and parent.target is node or unpacked):
            return [], True, scopes[0]  # an assignment's own target: libcst names it by that assignment alone
        named = (kind is cst.Param or kind is cst.FunctionDef or kind is cst.ClassDef) and parent.name is node
        if type(node) is not cst.Name or named:
            # not a read (libcst's Access) but an attribute, a call, a definition's name: every binding of the
            # innermost scope that has one, whatever the order
            for scope in scopes:
                number = self.numbers.get(scope, 0)
                imports = self.tables.get(scope, {}).get(head, [])
                if imports or (number, head) in b.sites:
                    return imports, (number, head) in b.sites, scope
            return [], False, None
        if not (is_read(node, parent) or unpacked is False):
            return None
        own = own_scope(node, scopes[0], self.parents)
        if own is False:
            return None
        for scope in scopes:
            number = self.numbers.get(scope, 0)
            imports = self.tables.get(scope, {}).get(head, [])
            others = b.sites.get((number, head), [])
            if not imports and not others:
                continue
            if scope is not own:
                return imports, bool(others), scope
            line = self.line_of(node)
            import_lines = b.import_sites.get((number, head), [])
            if line is None or None in others or len(import_lines) != len(imports):
                return None
            lines = [site for site in others if site is not None] + [(a, z) for a, z, _ in import_lines]
            if any(first <= line <= last for first, last in lines if (first, last) != (0, 0)):
                return None  # the node is in a statement that binds its name
            before = [what for first, last, what in import_lines if last < line]
            if before and len(before) < len(imports) and len({what for *_, what in import_lines}) > 1:
                return None  # some imports before the node, some after, importing different things
            other_before = any(last < line for first, last in others)
            if before or other_before:
                return (imports if before else []), other_before, scope
            if number != 0 and is_method(scope, self.parents):
                return None  # the next scope is a class body's
            own = None  # nothing before the node: the scopes around answer with all their bindings
        return [], False, None

    def _unpacked_into(self, name: cst.CSTNode) -> bool | None:
        """For a name in a tuple or list: True when the tuple is a target it is unpacked into (`device, dtype =
        ...`, `for a, b in`: libcst records the name as an assignment of its own, as a plain target), False when the
        tuple is a value (`return device, dtype`: a read), None when neither is certain here."""
        node, parent = name, self.parents.get(name)
        while type(parent) in _UNPACKING:
            node, parent = parent, self.parents.get(parent)
        kind = type(parent)
        if kind in _TARGETS:
            return parent.target is node
        if kind in _OTHER_TARGETS:  # `with ... as (a, b)`, a comprehension's `for a, b in`
            return None
        return False

    def _dotted(self, scope: cst.CSTNode) -> list[str]:
        return [name for name in self.tables.get(scope, {}) if "." in name]

    def _assignments(self, node: cst.CSTNode, full: str) -> list[ImportAssignment]:
        """The imports that bind the longest dotted prefix of `full` that `node`'s scopes see, innermost first."""
        scopes = [table for scope in scopes_around(node, self.parents) if (table := self.tables.get(scope))]
        prefix = full
        while prefix:
            for table in scopes:
                if prefix in table:
                    return table[prefix]
            prefix = prefix.rpartition(".")[0]
        return []
