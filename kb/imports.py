"""The imports of a fix: adds those the rewrites need, removes those they left unused, and only those.

`from torch.cuda.amp import GradScaler, autocast` is dead once XLA501/XLA502 rewrote every use. An
import the original already left unused is the user's business and stays, and so do imports inside
`try:` (optional-package probes) and of torch_xla (importing it registers the XLA device).

Uses are counted on CPython's AST, not by libcst's scope analysis (a second analysis of the whole module
for each text): every name spelled like the imported one counts, in any scope, and so does every string that
parses to an expression naming it (string annotations, `__all__`). That counts too many uses, never too few:
an import is removed only when nothing in the module can refer to it. libcst's own visitors then edit just
the import lines concerned (and add imports at the top) without walking the rest of the module.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator, Sequence

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
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


def remove_imports_made_unused(original: ast.Module, fixed: cst.Module, fixed_tree: ast.Module) -> cst.Module:
    """`fixed` (CPython's AST `fixed_tree`) without the imports that `original` referenced and `fixed`
    no longer does."""
    before = import_references(original)
    dead = [key for key, uses in import_references(fixed_tree).items() if uses == 0 and before.get(key, 0) > 0]
    if not dead:
        return fixed
    context = CodemodContext()
    for module, name, asname in dead:
        RemoveImportsVisitor.remove_unused_import(context, module, name, asname)
    lines, on_path = _import_lines(fixed, set(dead))
    if any(type(line) is not cst.SimpleStatementLine for line in lines):
        cleaned = RemoveImportsVisitor(context).transform_module(fixed)  # `if x: import y`: rare, the slow way
    else:
        # each line alone: RemoveImportsVisitor's own scope analysis then sees one line, not the module
        replacements: dict[cst.CSTNode, cst.CSTNode | cst.RemovalSentinel] = {}
        for line in lines:
            alone = RemoveImportsVisitor(context).transform_module(cst.Module(body=[line]))
            replacements[line] = alone.body[0] if alone.body else cst.RemoveFromParent()
        cleaned = replace_nodes(fixed, replacements, on_path)
    try:
        compile(cleaned.code, "<cleaned>", "exec")
    except SyntaxError:  # e.g. a `try:` whose only statement was the import: keep it
        return fixed
    return cleaned


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


def add_imports(module: cst.Module, imports: list[tuple[str, str | None, str | None]]) -> cst.Module:
    """`module` with `imports` ((module, name or None, alias or None)) added where missing, as libcst's
    AddImportsVisitor adds them (to the import block at the top)."""
    context = CodemodContext()
    for module_name, obj, alias in dict.fromkeys(imports):
        AddImportsVisitor.add_needed_import(context, module_name, obj, alias)
    return module.visit(_TopImportsAdder(context))


_PLACEHOLDER = cst.SimpleStatementLine(body=[cst.Pass()])


class _TopImportsAdder(AddImportsVisitor):
    """AddImportsVisitor reads and changes only the import lines at the top of the module (and looks at
    its first statement for a docstring): this one does not walk the rest of the module, which libcst
    would rebuild node by node."""

    def visit_Module(self, node: cst.Module) -> None:
        # AddImportsVisitor gathers the top import block from a walk of the module it is given: give it the
        # module's head and its other top-level import lines (the rest cannot change where imports go)
        head = _head_length(node.body)
        shell = [
            s if _is_import_line(s) or (i == 0 and type(s) is cst.SimpleStatementLine) else _PLACEHOLDER
            for i, s in enumerate(node.body[:head])
        ]
        super().visit_Module(node.with_changes(body=[*shell, *filter(_is_import_line, node.body[head:])]))

    def on_visit(self, node: cst.CSTNode) -> bool:
        return super().on_visit(node) and (type(node) is cst.Module or _is_import_line(node))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        # libcst matches the module's body with a pattern that recurses once per statement (RecursionError past
        # ~1,000 top-level statements after a docstring): it only needs the head, where the imports go
        head = _head_length(original_node.body)
        done = super().leave_Module(
            original_node.with_changes(body=original_node.body[:head]),
            updated_node.with_changes(body=updated_node.body[:head]),
        )
        return done.with_changes(body=[*done.body, *updated_node.body[head:]])


def _head_length(body: Sequence[cst.BaseStatement]) -> int:
    """How many top-level statements AddImportsVisitor looks at: a first line (a docstring), the import lines
    after it, and the statement that ends them."""
    end = 1 if body and type(body[0]) is cst.SimpleStatementLine else 0
    while end < len(body) and _is_import_line(body[end]):
        end += 1
    return min(len(body), end + 1)


def _is_import_line(node: cst.CSTNode) -> bool:
    return type(node) is cst.SimpleStatementLine and any(
        type(s) is cst.ImportFrom or type(s) is cst.Import for s in node.body
    )
