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
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import ImportAssignment, QualifiedName, QualifiedNameSource

Resolver = Callable[[cst.CSTNode], Collection[QualifiedName]]


def full_name(node: cst.CSTNode) -> str | None:
    """libcst's `get_full_name_for_node` (`a.b` for an attribute, a call's callee, a subscript's value; `None.x`
    for an attribute of an expression), by exact type: isinstance on libcst's abstract classes is slow."""
    kind = type(node)
    if kind is cst.Name:
        return node.value
    if kind is cst.Attribute:
        return f"{full_name(node.value)}.{node.attr.value}"
    if kind is cst.Call:
        return full_name(node.func)
    if kind is cst.Subscript:
        return full_name(node.value)
    if kind is cst.FunctionDef or kind is cst.ClassDef:
        return full_name(node.name)
    if kind is cst.Decorator:
        return full_name(node.decorator)
    return None


def head_name(node: cst.CSTNode) -> str | None:
    """The first part of `full_name(node)` when it is a name (`torch` for `torch.cuda.is_available()`), else None;
    without building the dotted name."""
    while True:
        kind = type(node)
        if kind is cst.Name:
            return node.value
        if kind is cst.Attribute or kind is cst.Subscript:
            node = node.value
        elif kind is cst.Call:
            node = node.func
        elif kind is cst.FunctionDef or kind is cst.ClassDef:
            node = node.name
        elif kind is cst.Decorator:
            node = node.decorator
        else:
            return None


def _dotted_names(node: cst.BaseExpression) -> list[str]:
    """`a.b.c` -> ["a.b.c", "a.b", "a"]: the names an `import a.b.c` binds, as libcst records them."""
    name = get_full_name_for_node(node) or ""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)] if name else []


@dataclass
class Bindings:
    """What binds each head, per scope. Scopes are numbered as the module (0) and its functions in source order
    (1, 2, ...), the same order in libcst's tree and CPython's."""

    imported: set[str] = field(default_factory=set)  # heads some import binds (anywhere)
    bound: set[str] = field(default_factory=set)  # heads bound any way (anywhere)
    # Bound where a scope is neither a function nor the module (a lambda, a comprehension), imported in a class
    # body, or declared global/nonlocal: only libcst's scope analysis answers these.
    tangled: set[str] = field(default_factory=set)
    # Bound in a class body otherwise (a method `def replicate(...)`, a class attribute): libcst's scope analysis
    # answers reads in that scope; no other scope sees a class body's names (not even its methods).
    class_bound: set[str] = field(default_factory=set)
    others: dict[str, set[int]] = field(default_factory=dict)  # head -> scopes binding it other than by import
    # head -> scopes where libcst's answer depends on a read's place among the imports: a read before the first
    # import there, or one between imports that bind it differently (`import a` ... `import a.b`).
    ordered: dict[str, set[int]] = field(default_factory=dict)
    # (scope, head) -> the lines (first, last) of each statement there that binds it other than by an import; (0, 0)
    # for a parameter of that function (bound before its body runs); None where libcst's order of a binding and a
    # read is not the statements' order (a `for` target, a `del`, an annotation without a value, a `match`).
    sites: dict[tuple[int, str], list[tuple[int, int] | None]] = field(default_factory=dict)
    # (scope, head) -> the lines of each import there that binds it, and what it imports
    import_sites: dict[tuple[int, str], list[tuple[int, int, tuple]]] = field(default_factory=dict)
    functions: int = 0  # how many functions (def and async def) the module defines


_ORDERED_STATEMENTS = (ast.Assign, ast.AugAssign, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.With)


def _site(stmt: ast.stmt | None, node: ast.AST) -> tuple[int, int] | None:
    """The lines of the statement whose end binds a name stored at `node` (see Bindings.sites)."""
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None or isinstance(stmt, _ORDERED_STATEMENTS):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Del):
            return None
        decorators = getattr(stmt, "decorator_list", None)
        first = min(d.lineno for d in decorators) if decorators else stmt.lineno
        return (first, stmt.end_lineno or stmt.lineno)
    return None


# The node types `_bindings` looks at (a name, an import, a scope, a parameter, ...); it only walks through others.
_BINDING_NODES = frozenset(
    {
        ast.Name,
        ast.Import,
        ast.ImportFrom,
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.Lambda,
        ast.comprehension,
        ast.arg,
        ast.Global,
        ast.Nonlocal,
        ast.ExceptHandler,
        ast.MatchAs,
        ast.MatchStar,
        ast.MatchMapping,
    }
)
_CONTEXTS = (ast.Load, ast.Store, ast.Del)


def _children(node: ast.AST) -> list[ast.AST]:
    """`ast.iter_child_nodes(node)` as a list, without the Load/Store/Del markers (they bind nothing)."""
    found: list[ast.AST] = []
    for name in node._fields:
        value = getattr(node, name, None)
        if type(value) is list:
            found.extend(item for item in value if isinstance(item, ast.AST))
        elif isinstance(value, ast.AST) and not isinstance(value, _CONTEXTS):
            found.append(value)
    return found


def _bindings(tree: ast.Module) -> Bindings:
    """The Bindings of a module. Reads in lambdas, comprehensions and class bodies count for the function around
    them: that can only send a name to the fallback, never answer it wrongly."""
    found = Bindings()
    functions: list[ast.AST] = []
    imports: dict[tuple[int, str], list[tuple[tuple[int, int], tuple]]] = {}  # (scope, head) -> (position, import)
    first_read: dict[tuple[int, str], tuple[int, int]] = {}
    others: list[tuple[str, int, tuple[int, int] | None]] = []  # (head, scope id, site)
    # (node, scope id, nested: in a lambda or comprehension of that scope, in a class body of it, the statement
    # around)
    stack: list[tuple[ast.AST, int, bool, bool, ast.stmt | None]] = [(tree, 0, False, False, None)]
    while stack:
        node, scope, nested, in_class, stmt = stack.pop()
        if isinstance(node, ast.stmt):
            stmt = node
        children = _children(node)
        if type(node) not in _BINDING_NODES:  # most nodes bind nothing themselves
            stack.extend((child, scope, nested, in_class, stmt) for child in children)
            continue
        stored: list[str] = []
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                key, at = (scope, node.id), (node.lineno, node.col_offset)
                first_read[key] = min(first_read.get(key, at), at)
            else:
                stored.append(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            source = (node.module, node.level) if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                head = (alias.asname or alias.name).split(".")[0]
                found.imported.add(head)
                found.bound.add(head)
                if nested or in_class:
                    found.tangled.add(head)
                at, what = (node.lineno, node.col_offset), (source, alias.name, alias.asname)
                imports.setdefault((scope, head), []).append((at, what))
                lines = (node.lineno, node.end_lineno or node.lineno, what)
                found.import_sites.setdefault((scope, head), []).append(lines)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            stored.append(node.name)
            functions.append(node)
            stack.extend((inner, id(node), False, False, inner) for inner in node.body)
            arguments = node.args
            params = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            params += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            for param in params:
                found.bound.add(param.arg)
                others.append((param.arg, id(node), (0, 0)))
            # decorators, defaults, annotations: the scope around
            children = [c for c in children if c not in node.body and c is not arguments]
            children += [d for d in [*arguments.defaults, *arguments.kw_defaults] if d is not None]
            children += [a.annotation for a in params if a.annotation is not None]
        elif isinstance(node, ast.ClassDef):
            stored.append(node.name)
            stack.extend((inner, scope, nested, True, inner) for inner in node.body)
            children = [c for c in children if c not in node.body]
        elif isinstance(node, ast.Lambda | ast.comprehension):
            nested = True
        elif isinstance(node, ast.arg):  # a lambda's
            stored.append(node.arg)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            found.bound.update(node.names)
            found.tangled.update(node.names)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            stored.append(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            stored.append(node.rest)
        for name in stored:
            found.bound.add(name)
            if nested:
                found.tangled.add(name)
            elif in_class:
                found.class_bound.add(name)
            else:
                others.append((name, scope, _site(stmt, node)))
        stack.extend((child, scope, nested, in_class, stmt) for child in children)
    index = {id(f): i for i, f in enumerate(sorted(functions, key=lambda f: (f.lineno, f.col_offset)), 1)}
    found.functions = len(functions)
    index[0] = 0
    for name, scope, site in others:
        found.others.setdefault(name, set()).add(index[scope])
        found.sites.setdefault((index[scope], name), []).append(site)
    found.import_sites = {(index[scope], head): lines for (scope, head), lines in found.import_sites.items()}
    for (scope, head), bound in imports.items():
        read = first_read.get((scope, head))
        if read is None:
            continue
        positions = [at for at, _ in bound]
        differ = len({what for _, what in bound}) > 1
        if read < min(positions) or differ and read < max(positions):
            found.ordered.setdefault(head, set()).add(index[scope])
    return found


# Parents whose Name children are only ever read (libcst records an Access for them)
_READING_PARENTS = {
    cst.Call,
    cst.Arg,
    cst.BinaryOperation,
    cst.UnaryOperation,
    cst.BooleanOperation,
    cst.Comparison,
    cst.ComparisonTarget,
    cst.Return,
    cst.Expr,
    cst.IfExp,
    cst.If,
    cst.While,
    cst.Await,
    cst.FormattedStringExpression,
    cst.Decorator,
    cst.Annotation,
    cst.Index,
    cst.Assert,
    cst.Raise,
}


def _is_read(name: cst.Name, parent: cst.CSTNode | None) -> bool:
    kind = type(parent)
    if kind is cst.Attribute or kind is cst.Subscript:
        return parent.value is name
    if kind is cst.Call:
        return parent.func is name
    if kind is cst.Arg:
        return parent.value is name
    if kind is cst.Assign:
        return parent.value is name
    return kind in _READING_PARENTS


_TARGETS = {cst.AssignTarget, cst.AnnAssign, cst.For}
_COMPREHENSIONS = {cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp}


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
    ) -> None:
        """`functions`: the module's function definitions in source order; `line_of`: a node's first line (None:
        unknown), for names bound both ways around a node."""
        self.parents = parents
        self.fallback = fallback
        self.line_of = line_of
        # scope (the module or a function) -> dotted name -> the imports there that bind it (libcst's assignments)
        self.tables: dict[cst.CSTNode, dict[str, list[ImportAssignment]]] = {}
        for stmt in imports:
            scope = self._scope_of(stmt)
            if scope is None or isinstance(stmt.names, cst.ImportStar):
                continue  # in a class body: its names are resolved by the fallback
            table = self.tables.setdefault(scope, {})
            for alias in stmt.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                for name in _dotted_names(bound):
                    table.setdefault(name, []).append(ImportAssignment(name, None, stmt, 0, bound))
        self.bindings = _bindings(tree)
        self.imported_heads = self.bindings.imported
        self.bound = self.bindings.bound
        numbered = self.bindings.functions
        # libcst's functions -> their numbers in Bindings (None when the two trees disagree: every scope counts)
        self.numbers: dict[cst.CSTNode, int] | None = (
            {f: i for i, f in enumerate(functions, 1)} if numbered == len(functions) else None
        )

    def _answerable(self, node: cst.CSTNode, head: str) -> bool:
        """Do the import tables give libcst's answer for `head` at `node`? Yes unless the module and functions
        around `node` bind `head` other than by imports (a parameter, an assignment), or order matters there
        (a read before its import), or a class body, lambda or comprehension binds it."""
        b = self.bindings
        if head in b.tangled or head in b.class_bound and self._in_class_scope(node):
            return False
        scopes = b.others.get(head, set()) | b.ordered.get(head, set())
        if not scopes:
            return True
        if self.numbers is None:
            return False
        return not any(self.numbers.get(scope, 0) in scopes for scope in self._scopes(node))

    def imported(self, node: cst.CSTNode) -> frozenset[str]:
        """The import-resolved names of `node` (`dist.init_process_group` -> torch.distributed.init_process_group)."""
        if head_name(node) not in self.imported_heads:
            return frozenset()  # most names: no import binds their head (checked before any parent is looked up)
        full = self._full_name(node)
        head = full.partition(".")[0] if full else None
        if head not in self.imported_heads:
            return frozenset()
        if not self._answerable(node, head):
            found = self._in_order(node, full, head)
            if found is None:
                return frozenset(q.name for q in self.fallback(node) if q.source is QualifiedNameSource.IMPORT)
            return frozenset(q.name for a in found[0] for q in a.get_qualified_names_for(full))
        return frozenset(q.name for a in self._assignments(node, full) for q in a.get_qualified_names_for(full))

    def builtin(self, node: cst.CSTNode) -> str | None:
        """`builtins.len` for `len` when it names the builtin (nothing in its scope shadows it)."""
        full = self._full_name(node)
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
        full = self._full_name(node)
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
        full = self._full_name(node)
        head = full.partition(".")[0] if full else None
        if head is None:
            return False
        if head not in self.bound or self._answerable(node, head):
            return bool(self.imported(node)) or self.builtin(node) is not None
        found = self._in_order(node, full, head)
        if found is None:
            return bool(self.fallback(node))
        imports, others = found
        return bool(imports) or others or hasattr(builtins, head)

    def _in_order(self, node: cst.CSTNode, full: str, head: str) -> tuple[list[ImportAssignment], bool] | None:
        """libcst's assignments for `head` at `node` where the scopes around it bind `head` both by imports and
        otherwise: (the imports among them, whether there are others). libcst takes every binding of the innermost
        scope that has one, or, when that is the node's own scope, those before the node (by the statements'
        lines), else the next scope's. None where that order is not certain here: the fallback answers."""
        b = self.bindings
        if self.numbers is None or self.line_of is None or head in b.tangled:
            return None
        scopes = self._scopes(node)
        if full != head and any(
            full.startswith(name + ".") or full == name for s in scopes for name in self._dotted(s)
        ):
            return None  # a dotted import (`import a.b`) decides: not handled here
        parent = self.parents.get(node)
        kind = type(parent)
        if type(node) is cst.Name and kind in _TARGETS and parent.target is node:
            return [], True  # an assignment's own target: libcst names it by that assignment alone
        named = (kind is cst.Param or kind is cst.FunctionDef or kind is cst.ClassDef) and parent.name is node
        if type(node) is not cst.Name or named:
            # not a read (libcst's Access) but an attribute, a call, a definition's name: every binding of the
            # innermost scope that has one, whatever the order
            for scope in scopes:
                number = self.numbers.get(scope, 0)
                imports = self.tables.get(scope, {}).get(head, [])
                if imports or (number, head) in b.sites:
                    return imports, (number, head) in b.sites
            return [], False
        if not _is_read(node, parent):
            return None
        own = self._own_scope(node, scopes[0])
        if own is False:
            return None
        for scope in scopes:
            number = self.numbers.get(scope, 0)
            imports = self.tables.get(scope, {}).get(head, [])
            others = b.sites.get((number, head), [])
            if not imports and not others:
                continue
            if scope is not own:
                return imports, bool(others)
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
                return (imports if before else []), other_before
            if number != 0 and self._in_class(scope):
                return None  # the next scope is a class body's
            own = None  # nothing before the node: the scopes around answer with all their bindings
        return [], False

    def _in_class_scope(self, node: cst.CSTNode) -> bool:
        """May `node` be read in a class body's own scope (where the class's names are seen)? False only where the
        scope around it is certainly a function's, a lambda's or the module's."""
        outside = False  # the walk came up through a parameter's default or annotation
        child, parent = node, self.parents.get(node)
        while parent is not None:
            kind = type(parent)
            if kind is cst.ClassDef and child is parent.body or kind in _COMPREHENSIONS:
                return True  # (a comprehension's first iterable is read in the scope around it)
            if kind is cst.Param and child is not parent.name:
                outside = True
            elif kind is cst.FunctionDef or kind is cst.Lambda:
                if child is parent.body or child is parent.params and not outside:
                    return False
                outside = False
            child, parent = parent, self.parents.get(parent)
        return type(child) is not cst.Module  # a node outside the module's tree: unsure

    def _dotted(self, scope: cst.CSTNode) -> list[str]:
        return [name for name in self.tables.get(scope, {}) if "." in name]

    def _own_scope(self, node: cst.CSTNode, function: cst.CSTNode) -> cst.CSTNode | None | bool:
        """`function` (the innermost function or module around `node`) when libcst puts `node` in that scope
        itself; None when in a lambda's or class's body inside it; False when unsure (a comprehension)."""
        child, parent = node, self.parents.get(node)
        while parent is not None and parent is not function:
            kind = type(parent)
            if kind in _COMPREHENSIONS:
                return False
            if (kind is cst.Lambda or kind is cst.ClassDef) and child is parent.body:
                return None
            child, parent = parent, self.parents.get(parent)
        return function

    def _in_class(self, function: cst.CSTNode) -> bool:
        block = self.parents.get(function)
        return type(self.parents.get(block)) is cst.ClassDef

    def _assignments(self, node: cst.CSTNode, full: str) -> list[ImportAssignment]:
        """The imports that bind the longest dotted prefix of `full` that `node`'s scopes see, innermost first."""
        scopes = [table for scope in self._scopes(node) if (table := self.tables.get(scope))]
        prefix = full
        while prefix:
            for table in scopes:
                if prefix in table:
                    return table[prefix]
            prefix = prefix.rpartition(".")[0]
        return []

    def _scopes(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """The functions whose names `node` sees, innermost first, then the module. A function's decorators,
        return annotation, parameter defaults and annotations belong to the scope around it, as in libcst."""
        scopes: list[cst.CSTNode] = []
        outside = False  # the walk came up through a parameter's default or annotation
        child, parent = node, self.parents.get(node)
        while parent is not None:
            kind = type(parent)
            if kind is cst.Param and child is not parent.name:
                outside = True
            elif kind is cst.FunctionDef or kind is cst.Lambda:
                inside = child is parent.body or child is parent.params and not outside
                if inside and kind is cst.FunctionDef:
                    scopes.append(parent)
                outside = False
            child, parent = parent, self.parents.get(parent)
        scopes.append(child)  # the module
        return scopes

    def _scope_of(self, stmt: cst.CSTNode) -> cst.CSTNode | None:
        """The function (or module) an import statement binds in; None in a class body."""
        parent = self.parents.get(stmt)
        while parent is not None and not isinstance(parent, cst.FunctionDef | cst.ClassDef):
            stmt, parent = parent, self.parents.get(parent)
        return stmt if parent is None else parent if isinstance(parent, cst.FunctionDef) else None

    def _full_name(self, node: cst.CSTNode) -> str | None:
        """The dotted name libcst resolves for `node`; None where libcst's scope analysis gives the node no
        scope (so no names): an attribute's or keyword's own name, names inside import statements."""
        parent = self.parents.get(node)
        kind = type(parent)
        if kind is cst.Attribute and parent.attr is node or kind is cst.Arg and parent.keyword is node:
            return None
        if kind is cst.NameItem:
            return None
        while kind is cst.Attribute or kind is cst.ImportAlias or kind is cst.AsName:
            parent = self.parents.get(parent)
            kind = type(parent)
        if kind is cst.Import or kind is cst.ImportFrom:
            return None
        return full_name(node)
