"""What binds each name of a module, from CPython's AST (plain walks, instead of libcst's scope analysis).

Two views of the same module, each computed at most once per module (names.py `ImportNames` holds them):
- `Bindings` (`module_bindings`): what binds each head, per scope (the module and its functions), and where: what
  the import tables need to give libcst's qualified names without its scope analysis (names.py).
- `TopLevelBindings` (`top_level_bindings`): what is bound outside function bodies, at module level, and in each
  function's own scope: which names libcst's qualified names give without `<locals>` (project.py
  `absolute_names`). Built only when a tree's analysis asks for it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..parsing import ast_node_fields


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
    # for `top_level_bindings`, which reads function bodies no further: every function definition in source
    # order, the names declared `global` or `nonlocal` anywhere, and the names in the targets of annotations
    # without a value anywhere (`x: int`, `self.n: int`)
    definitions: list[ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=list)
    declared_global: set[str] = field(default_factory=set)
    declared_nonlocal: set[str] = field(default_factory=set)
    bare_annotated: set[str] = field(default_factory=set)


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


# The node types `module_bindings` looks at (a name, an import, a scope, a parameter, ...); it only walks through others.
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


# Nodes with no child but a Load/Store/Del marker (a Name's `id` is a string, a Constant's `value` never a node):
# half the nodes of a module
_LEAVES = frozenset({ast.Name, ast.Constant})


def _children(node: ast.AST) -> list[ast.AST]:
    """`ast.iter_child_nodes(node)` as a list, without the Load/Store/Del markers (they bind nothing): the walks here
    visit every node of a module, so only the fields that can hold a node are read, and a list is cheaper than
    iter_child_nodes' generator."""
    kind = type(node)
    if kind in _LEAVES:
        return []
    found: list[ast.AST] = []
    for name in ast_node_fields(kind):
        value = getattr(node, name, None)
        if type(value) is list:
            found.extend(item for item in value if isinstance(item, ast.AST))
        elif isinstance(value, ast.AST) and not isinstance(value, _CONTEXTS):
            found.append(value)
    return found


def module_bindings(tree: ast.Module) -> Bindings:
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
            if type(node) is ast.AnnAssign and node.value is None:
                found.bare_annotated.update(n.id for n in ast.walk(node.target) if type(n) is ast.Name)
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
            (found.declared_global if type(node) is ast.Global else found.declared_nonlocal).update(node.names)
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
    found.definitions = sorted(functions, key=lambda f: (f.lineno, f.col_offset))
    index = {id(f): i for i, f in enumerate(found.definitions, 1)}
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


@dataclass(frozen=True)
class TopLevelBindings:
    """What is bound outside function bodies and in each function's own scope (see the module's docstring)."""

    # bound other than by an import outside function bodies (module level, class bodies, comprehensions there,
    # `global`/`nonlocal`): the only bindings libcst's qualified names give without `<locals>`; more names
    # than that only cost the slow path
    outside_functions: frozenset[str]
    # bound other than by an import (or a bare annotation) in the module's own scope, or declared `global`
    module_level: frozenset[str]
    # only deleted or annotated without a value in the module's own scope: the slow path
    module_unsure: frozenset[str]
    # each function definition, in source order (`own_bindings` tells what each binds: asked of few functions)
    functions: tuple[ast.FunctionDef | ast.AsyncFunctionDef, ...]


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_INNER_SCOPES = (ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def top_level_bindings(tree: ast.Module, bindings: Bindings) -> TopLevelBindings:
    """The TopLevelBindings of a module whose Bindings (`module_bindings`) are `bindings`. Function bodies are
    not walked: all they add here is in `bindings` (what they declare `global` or `nonlocal`, their annotations
    without a value, their nested definitions), and most of a module's code is in them."""
    outside: set[str] = bindings.declared_global | bindings.declared_nonlocal | bindings.bare_annotated
    top: set[str] = set(bindings.declared_global)
    top_unsure: set[str] = set()
    stack: list[tuple[ast.AST, bool]] = [(tree, True)]  # (node outside function bodies, in module scope)
    while stack:
        node, at_top = stack.pop()
        kind = type(node)
        bound: str | None = None
        if kind is ast.Global or kind is ast.Nonlocal:
            outside.update(node.names)
            if kind is ast.Global:
                top.update(node.names)
        elif kind is ast.Name and type(node.ctx) is not ast.Load:
            bound = node.id
        elif kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
            bound = node.name
        elif kind in (ast.ExceptHandler, ast.MatchAs, ast.MatchStar) and node.name:
            bound = node.name
        elif kind is ast.MatchMapping and node.rest:
            bound = node.rest
        if bound is not None:
            outside.add(bound)
            if at_top:
                (top_unsure if kind is ast.Name and type(node.ctx) is ast.Del else top).add(bound)
        if kind is ast.AnnAssign and node.value is None:
            stack.append((node.annotation, at_top))  # `x: int` alone: not an assignment for libcst
            targets = [n.id for n in ast.walk(node.target) if type(n) is ast.Name]
            outside.update(targets)
            if at_top:
                top_unsure.update(targets)
            continue
        if kind in _FUNCTIONS:
            # decorators, defaults and annotations run where the function is defined; the body is not walked
            body = {id(b) for b in (node.body if kind is not ast.Lambda else [node.body])}
            stack.extend((child, at_top) for child in _children(node) if id(child) not in body)
        elif kind in _INNER_SCOPES:
            stack.extend((child, False) for child in _children(node))
        else:
            stack.extend((child, at_top) for child in _children(node))
    return TopLevelBindings(frozenset(outside), frozenset(top), frozenset(top_unsure), tuple(bindings.definitions))


def own_bindings(
    func: ast.FunctionDef | ast.AsyncFunctionDef,
) -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    """(what `func` binds in its own scope: parameters, assignments, nested definitions, imports; names whose
    binding there libcst may see otherwise: declared `global` or `nonlocal`, bound in a comprehension, only
    deleted, augmented or annotated; names declared `global`: bound in the module's scope, whatever the function
    does with them; names declared `nonlocal`: an enclosing function's)."""
    args = func.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
    unsure: set[str] = set()
    declared_global: set[str] = set()
    declared_nonlocal: set[str] = set()
    stack: list[tuple[ast.AST, bool]] = [(stmt, False) for stmt in func.body]  # (node, inside a comprehension)
    while stack:
        node, in_comprehension = stack.pop()
        kind = type(node)
        children: list[ast.AST] | None = None
        if kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
            names.add(node.name)
            body = {id(b) for b in node.body}  # another scope; decorators, defaults, bases run in this one
            children = [c for c in _children(node) if id(c) not in body]
        elif kind is ast.Lambda:
            children = [node.args]
        elif kind is ast.Name and type(node.ctx) is ast.Store:
            (unsure if in_comprehension else names).add(node.id)
        elif kind is ast.Name and type(node.ctx) is ast.Del:
            unsure.add(node.id)
        elif kind is ast.AugAssign or kind is ast.AnnAssign and node.value is None:
            # `x += 1` binds x; `self.n += 1` and `a[i] += 1` bind nothing (their names are read)
            if type(node.target) is ast.Name:
                unsure.add(node.target.id)
            children = [c for c in _children(node) if c is not node.target or type(c) is not ast.Name]
        elif kind is ast.Global or kind is ast.Nonlocal:
            unsure.update(node.names)
            (declared_global if kind is ast.Global else declared_nonlocal).update(node.names)
        elif kind is ast.Import or kind is ast.ImportFrom:
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif kind in (ast.ExceptHandler, ast.MatchAs, ast.MatchStar) and node.name:
            names.add(node.name)
        elif kind is ast.MatchMapping and node.rest:
            names.add(node.rest)
        inner = in_comprehension or kind in (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
        stack.extend((child, inner) for child in (children if children is not None else _children(node)))
    return frozenset(names), frozenset(unsure), frozenset(declared_global), frozenset(declared_nonlocal)
