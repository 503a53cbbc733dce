"""The imports of a fix: adds those the rewrites need, removes those they left unused, and only those.

`from torch.cuda.amp import GradScaler, autocast` is dead once XLA501/XLA502 rewrote every use. An
import the original already left unused is the user's business and stays, and so do imports inside
`try:` (optional-package probes) and of torch_xla (importing it registers the XLA device).

Uses are counted on CPython's AST, not by libcst's scope analysis (a second analysis of the whole module
for each text): every name spelled like the imported one counts, in any scope, and so does every string that
parses to an expression naming it (string annotations, `__all__`). That counts too many uses, never too few:
an import is removed only when nothing in the module can refer to it. libcst's RemoveImportsVisitor then edits
just the import lines concerned, without walking the rest of the module; imports are added where libcst's
AddImportsVisitor adds them, decided here from the module's top lines.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import libcst as cst
from libcst.helpers import get_full_name_for_node

from .edits import replace_nodes

# (module, name or None, alias or None), as RemoveImportsVisitor takes them:
# `import a.b as c` -> ("a.b", None, "c"); `from m import x as y` -> ("m", "x", "y").
ImportKey = tuple[str, str | None, str | None]


def _keys(statement: ast.Import | ast.ImportFrom) -> Iterator[tuple[ImportKey, str]]:
    """(key, bound name) of each alias of `statement`; relative, star and dotted plain imports have none."""
    if isinstance(statement, ast.ImportFrom):
        if statement.level or statement.module is None:
            return
        for alias in statement.names:
            if alias.name != "*":
                yield (statement.module, alias.name, alias.asname), alias.asname or alias.name
        return
    for alias in statement.names:
        if alias.asname is not None or "." not in alias.name:
            yield (alias.name, None, alias.asname), alias.asname or alias.name


def import_references(tree: ast.Module) -> dict[ImportKey, int]:
    """How often each imported name may be referenced in `tree` (all scopes together; an over-count, see
    the module's doc). Imports inside `try:` are left out: they probe for an optional package.

    As in libcst's scope analysis, `a.b.c` refers to an `import a.b` (or `import a.b.d`: it binds `a.b` too)
    in the function or module around it, not to `import a`."""
    imports: list[tuple[ImportKey, str]] = []
    dotted: dict[int, set[str]] = {}  # scope -> the dotted names its `import a.b.c` bind: a.b, a.b.c
    uses: Counter[str] = Counter()
    chains: list[tuple[list[str], tuple[int, ...]]] = []  # `a.b.c` -> ["a", "b", "c"], and its scopes
    strings: list[str] = []
    # (node, inside try, the functions around it and the module: their ids)
    stack: list[tuple[ast.AST, bool, tuple[int, ...]]] = [(tree, False, (0,))]
    while stack:
        node, in_try, scopes = stack.pop()
        kind = type(node)
        if kind is ast.Name:
            if type(node.ctx) is not ast.Store:
                uses[node.id] += 1
            continue
        if kind is ast.Attribute:
            chain = _chain(node)
            if chain is not None:
                chains.append((chain, scopes))
                continue
        elif kind is ast.Import or kind is ast.ImportFrom:
            if kind is ast.Import:
                for alias in node.names:
                    parts = alias.name.split(".") if alias.asname is None else []
                    dotted.setdefault(scopes[-1], set()).update(
                        ".".join(parts[:end]) for end in range(2, len(parts) + 1)
                    )
            if not in_try:
                imports.extend(k for k in _keys(node) if k[0][0].split(".")[0] != "torch_xla")
            continue
        elif kind is ast.Constant:
            if type(node.value) is str:
                strings.append(node.value)
            continue
        elif kind is ast.Expr and type(node.value) is ast.Constant:
            continue  # a docstring or a bare string statement names nothing
        elif kind is ast.AugAssign and type(node.target) is ast.Name:
            uses[node.target.id] += 1  # `x += 1` reads x
        inner_try = in_try or kind is ast.Try or kind is ast.TryStar
        inner = (*scopes, id(node)) if kind in _FUNCTIONS else scopes
        stack.extend((child, inner_try, inner) for child in ast.iter_child_nodes(node))
    for chain, scopes in chains:
        seen = set().union(*(dotted.get(scope, ()) for scope in scopes))
        if not any(".".join(chain[:end]) in seen for end in range(2, len(chain) + 1)):
            uses[chain[0]] += 1
    bound = {name for _, name in imports}
    for text in strings:
        if any(name in text for name in bound):
            uses.update(_names_in_string(text))
    counts: dict[ImportKey, int] = {}
    for key, name in imports:
        counts[key] = counts.get(key, 0) + uses[name]
    return counts


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _chain(node: ast.Attribute) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None when the chain does not start at a name (`f().b`)."""
    parts = []
    while type(node) is ast.Attribute:
        parts.append(node.attr)
        node = node.value
    if type(node) is not ast.Name:
        return None
    parts.append(node.id)
    return parts[::-1]


def _names_in_string(text: str) -> list[str]:
    try:
        expression = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return []
    return [n.id for n in ast.walk(expression) if isinstance(n, ast.Name)]


def remove_imports_made_unused(
    original: ast.Module,
    fixed: cst.Module,
    fixed_tree: ast.Module,
    code_of: Callable[[cst.Module], str] = lambda module: module.code,
) -> cst.Module:
    """`fixed` (CPython's AST `fixed_tree`) without the imports that `original` referenced and `fixed`
    no longer does. `code_of`: a module's code (kb/codegen.py's, which reuses what the caller generated before)."""
    before = import_references(original)
    dead = [key for key, uses in import_references(fixed_tree).items() if uses == 0 and before.get(key, 0) > 0]
    if not dead:
        return fixed
    lines, on_path = _import_lines(fixed, set(dead))
    if any(type(line) is not cst.SimpleStatementLine for line in lines):
        # imported here: libcst.codemod brings libcst.matchers, ~0.4 s of every command's start-up
        from libcst.codemod import CodemodContext
        from libcst.codemod.visitors import RemoveImportsVisitor

        context = CodemodContext()
        for module, name, asname in dead:
            RemoveImportsVisitor.remove_unused_import(context, module, name, asname)
        cleaned = RemoveImportsVisitor(context).transform_module(fixed)  # `if x: import y`: rare, the slow way
    else:
        cleaned = replace_nodes(fixed, {line: without_imports(line, dead) for line in lines}, on_path)
    try:
        compile(code_of(cleaned), "<cleaned>", "exec")
    except SyntaxError:  # e.g. a `try:` whose only statement was the import: keep it
        return fixed
    return cleaned


def without_imports(
    line: cst.SimpleStatementLine, keys: list[ImportKey]
) -> cst.SimpleStatementLine | cst.RemovalSentinel:
    """`line` without the imports of `keys`: what libcst's RemoveImportsVisitor makes of the line alone, where
    nothing uses any of its imports (a `from __future__` import stays). Written out rather than calling the
    visitor: its set-up (matcher visitors inspecting their methods) and scope analysis were ~15 ms a line.
    tests/kb/test_kb_imports.py compares the two on many import lines."""
    # as the visitor reads its list: one alias per plain module (the last given), a set of names per module
    modules = {module: alias for module, name, alias in keys if name is None}
    names: dict[str, set[tuple[str, str | None]]] = {}
    for module, name, alias in keys:
        if name is not None:
            names.setdefault(module, set()).add((name, alias))
    body = []
    for statement in line.body:
        if type(statement) is cst.Import:
            statement = _without_modules(statement, modules)
        elif type(statement) is cst.ImportFrom:
            statement = _without_names(statement, names)
        if statement is not None:
            body.append(statement)
    return line.with_changes(body=body) if body else cst.RemoveFromParent()


def _without_modules(statement: cst.Import, modules: dict[str, str | None]) -> cst.Import | None:
    keep = [
        a for a in statement.names if a.evaluated_name not in modules or a.evaluated_alias != modules[a.evaluated_name]
    ]
    return _with_names(statement, keep)


def _without_names(statement: cst.ImportFrom, names: dict[str, set[tuple[str, str | None]]]) -> cst.ImportFrom | None:
    module = None if type(statement.names) is cst.ImportStar else _from_module(statement)
    if module is None or module == "__future__" or module not in names:
        return statement
    keep: list[cst.ImportAlias] = []
    lpar = statement.lpar
    for a in statement.names:
        if (a.evaluated_name, a.evaluated_alias) not in names[module]:
            keep.append(a)
            continue
        # a comment after a removed name's comma moves to the name before it (or after the opening parenthesis)
        comma = a.comma
        if type(comma) is not cst.Comma:
            continue
        if keep:
            before = keep[-1]
            if type(before.comma) is cst.Comma:
                merged = _merge_whitespace_after(before.comma.whitespace_after, comma.whitespace_after)
                keep[-1] = before.with_deep_changes(before.comma, whitespace_after=merged)
            else:
                keep[-1] = before.with_changes(comma=comma)
        elif type(statement.lpar) is cst.LeftParen:
            merged = _merge_whitespace_after(statement.lpar.whitespace_after, comma.whitespace_after)
            lpar = statement.lpar.with_changes(whitespace_after=merged)
    kept = _with_names(statement, keep)
    return kept if kept is None or kept is statement else kept.with_changes(lpar=lpar)


def _with_names(statement, keep: list[cst.ImportAlias]):
    """`statement` importing only `keep` (None when that is nothing); the last name loses its comma."""
    if len(keep) == len(statement.names):
        return statement
    if not keep:
        return None
    if keep[-1] is not statement.names[-1]:
        keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return statement.with_changes(names=keep)


def _merge_whitespace_after(
    left: cst.BaseParenthesizableWhitespace, right: cst.BaseParenthesizableWhitespace
) -> cst.BaseParenthesizableWhitespace:
    """libcst's: the comment lines of `right` kept after `left`."""
    if type(right) is not cst.ParenthesizedWhitespace:
        return left
    if type(left) is not cst.ParenthesizedWhitespace:
        return right
    return left.with_changes(empty_lines=tuple(line for line in right.empty_lines if line.comment is not None))


_BLOCKS = (
    cst.SimpleStatementLine,
    cst.BaseCompoundStatement,
    cst.BaseSuite,
    cst.Else,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Finally,
)


def _import_lines(
    module: cst.Module, keys: set[ImportKey]
) -> tuple[list[cst.SimpleStatementLine | cst.SimpleStatementSuite], set[cst.CSTNode]]:
    """The statement lines (in any block) that import one of `keys`, and the nodes above them."""
    found: list = []
    on_path: set[cst.CSTNode] = set()
    stack: list[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = [(module, ())]
    while stack:
        node, above = stack.pop()
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            if any(_imports_one_of(stmt, keys) for stmt in node.body):
                found.append(node)
                on_path.update(above)
            continue
        for child in node.children:
            if isinstance(child, _BLOCKS) or isinstance(child, cst.MatchCase):
                stack.append((child, (*above, node)))
    return found, on_path


def _imports_one_of(stmt: cst.BaseSmallStatement, keys: set[ImportKey]) -> bool:
    if isinstance(stmt, cst.Import):
        return any((a.evaluated_name, None, a.evaluated_alias) in keys for a in stmt.names)
    if isinstance(stmt, cst.ImportFrom) and not stmt.relative and not isinstance(stmt.names, cst.ImportStar):
        module = get_full_name_for_node(stmt.module) if stmt.module is not None else None
        return any((module, a.evaluated_name, a.evaluated_alias) in keys for a in stmt.names)
    return False


def add_imports(module: cst.Module, imports: list[ImportKey]) -> cst.Module:
    """`module` with `imports` ((module, name or None, alias or None)) added where missing, exactly as libcst's
    AddImportsVisitor adds them: a name missing from a `from m import ...` of the top import block joins it, the
    rest go after that block (a docstring first), one line each, and an empty line separates them from the code.

    Written out rather than calling the visitor: its set-up (two matcher visitors that inspect their own
    methods) and walk over the module were ~20 ms of a 200-line file's fix, for a decision made on a few top
    lines. tests/kb/test_kb_imports.py compares the two on many module heads."""
    needed = list(dict.fromkeys(imports))
    plain = {m for m, name, alias in needed if name is None and alias is None}  # import m
    aliased = {m: alias for m, name, alias in needed if name is None and alias is not None}  # import m as a
    names: dict[str, set[str]] = {}  # from m import name
    renamed: dict[str, list[tuple[str, str]]] = {}  # from m import name as a
    for m, name, alias in needed:
        if name is not None and alias is None:
            names.setdefault(m, set()).add(name)
        elif name is not None:
            renamed.setdefault(m, []).append((name, alias))
    names = {m: names[m] for m in sorted(names)}
    renamed = {m: renamed[m] for m in sorted(renamed)}

    first = 1 if _docstring_first(module.body) else 0
    block = first
    while block < len(module.body) and _single_import(module.body[block]) is not None:
        block += 1
    top = [_single_import(s) for s in module.body[first:block]]
    have_plain, have_aliased, have_names, have_renamed = _gather(top)  # what the top block imports already
    plain -= have_plain
    for m, alias in have_aliased.items():
        if aliased.get(m) == alias:
            del aliased[m]
    for m, pairs in have_renamed.items():
        for pair in pairs:
            if pair in renamed.get(m, ()):
                renamed[m].remove(pair)
                if not renamed[m]:
                    del renamed[m]
    for m, objects in have_names.items():
        if m in names:
            names[m] = set() if "*" in objects else names[m] - objects
            if not names[m]:
                del names[m]

    body = list(module.body)
    for index in range(first, block):  # a missing name joins the first `from m import` of its module
        statement = top[index - first]
        m = _from_module(statement) if type(statement) is cst.ImportFrom else None
        if m is None or type(statement.names) is cst.ImportStar or (m not in names and m not in renamed):
            continue
        added = [cst.ImportAlias(name=cst.Name(n)) for n in sorted(names.pop(m, ()))]
        added += [
            cst.ImportAlias(name=cst.Name(n), asname=cst.AsName(name=cst.Name(a)))
            for n, a in sorted(renamed.pop(m, ()))
        ]
        body[index] = body[index].with_changes(body=[statement.with_changes(names=[*added, *statement.names])])
    if not (plain or names or aliased or renamed):
        return module.with_changes(body=body)

    config = module.config_for_parsing
    froms: dict[str, list[tuple[str, str | None]]] = {}
    for m, pairs in renamed.items():
        froms.setdefault(m, []).extend(pairs)
    for m, objects in names.items():
        froms.setdefault(m, []).extend((n, None) for n in objects)

    def from_line(m: str) -> cst.BaseStatement:
        listed = ", ".join(n if a is None else f"{n} as {a}" for n, a in sorted(froms[m]))
        return cst.parse_statement(f"from {m} import {listed}", config=config)

    added = [
        *(cst.parse_statement(f"import {m}", config=config) for m in sorted(plain)),
        *(cst.parse_statement(f"import {m} as {a}", config=config) for m, a in aliased.items()),
        *(from_line(m) for m in froms if m != "__future__"),
    ]
    rest = body[block:]
    if rest and (not rest[0].leading_lines or rest[0].leading_lines[0].comment is not None):
        rest[0] = rest[0].with_changes(leading_lines=(cst.EmptyLine(), *rest[0].leading_lines))
    future = [from_line("__future__")] if "__future__" in froms else []
    return module.with_changes(body=[*body[:first], *future, *body[first:block], *added, *rest])


def _docstring_first(body: Sequence[cst.BaseStatement]) -> bool:
    """A docstring (or a `__strict__ = ...` flag) opens the module: imports go after it."""
    if not body or type(body[0]) is not cst.SimpleStatementLine or len(body[0].body) != 1:
        return False
    statement = body[0].body[0]
    if type(statement) is cst.Expr:
        return type(statement.value) is cst.SimpleString
    return (
        type(statement) is cst.Assign
        and len(statement.targets) == 1
        and type(statement.targets[0].target) is cst.Name
        and statement.targets[0].target.value == "__strict__"
    )


def _single_import(node: cst.CSTNode) -> cst.Import | cst.ImportFrom | None:
    """The import of a line that holds one import and nothing else (what the top import block is made of)."""
    if (
        type(node) is cst.SimpleStatementLine
        and len(node.body) == 1
        and type(node.body[0]) in (cst.Import, cst.ImportFrom)
    ):
        return node.body[0]
    return None


def _from_module(statement: cst.ImportFrom) -> str | None:
    """The module of an absolute `from m import ...`; None for a relative one."""
    if statement.relative or statement.module is None:
        return None
    return get_full_name_for_node(statement.module)


def _gather(
    top: list[cst.Import | cst.ImportFrom],
) -> tuple[set[str], dict[str, str], dict[str, set[str]], dict[str, list[tuple[str, str]]]]:
    """What the top import block imports, as libcst's gatherer records it: plain modules, aliased modules (the
    last alias wins), names per module ({"*"} for a star import) and renamed names per module."""
    plain: set[str] = set()
    aliased: dict[str, str] = {}
    names: dict[str, set[str]] = {}
    renamed: dict[str, list[tuple[str, str]]] = {}
    for statement in top:
        if type(statement) is cst.Import:
            for a in statement.names:
                if a.evaluated_alias is None:
                    plain.add(a.evaluated_name)
                else:
                    aliased[a.evaluated_name] = a.evaluated_alias
            continue
        m = _from_module(statement)
        if m is None:
            continue
        if type(statement.names) is cst.ImportStar:
            names[m] = {"*"}
            continue
        renamed.setdefault(m, []).extend(
            (a.evaluated_name, a.evaluated_alias) for a in statement.names if a.asname is not None
        )
        objects = {a.evaluated_name for a in statement.names if a.asname is None}
        if objects:
            names[m] = {"*"} if "*" in names.get(m, ()) else names.get(m, set()) | objects
    return plain, aliased, names, renamed


NOQA_UNUSED = "# noqa: F401"


def mark_device_imports(original: ast.Module, fixed: cst.Module, fixed_tree: ast.Module) -> cst.Module:
    """`fixed` with `# noqa: F401` on the `import torch_xla` a fix added when nothing in the module names
    `torch_xla`: the import is there for its side effect (it registers the XLA device that the `"xla"` strings
    name), and `ruff --fix` would delete it as unused."""
    if _imports_torch_xla(original) or not _imports_torch_xla(fixed_tree):
        return fixed
    if any(type(n) is ast.Name and n.id == "torch_xla" for n in ast.walk(fixed_tree)):
        return fixed
    body = list(fixed.body)
    for index, line in enumerate(body):
        statement = _single_import(line)
        if (
            type(statement) is cst.Import
            and [(a.evaluated_name, a.asname) for a in statement.names] == [("torch_xla", None)]
            and line.trailing_whitespace.comment is None
        ):
            trailing = line.trailing_whitespace.with_changes(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(NOQA_UNUSED)
            )
            body[index] = line.with_changes(trailing_whitespace=trailing)
            return fixed.with_changes(body=body)
    return fixed


def _imports_torch_xla(tree: ast.Module) -> bool:
    """A module-level `import torch_xla` (plain: it binds the name `torch_xla`)."""
    return any(
        type(s) is ast.Import and any(a.name == "torch_xla" and a.asname is None for a in s.names) for s in tree.body
    )
