"""Removes the imports that the rewrites left unused, and only those.

`from torch.cuda.amp import GradScaler, autocast` is dead once XLA501/XLA502 rewrote every use. An
import the original already left unused is the user's business and stays, and so do imports inside
`try:` (optional-package probes) and of torch_xla (importing it registers the XLA device). Bound names
are compared by libcst's scope analysis (references in every scope, string annotations included).
"""

from __future__ import annotations

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import ImportAssignment, MetadataWrapper, ParentNodeProvider, ScopeProvider

# (module, name or None, alias or None), as RemoveImportsVisitor takes them:
# `import a.b as c` -> ("a.b", None, "c"); `from m import x as y` -> ("m", "x", "y").
ImportKey = tuple[str, str | None, str | None]


def _key(statement: cst.Import | cst.ImportFrom, bound: str) -> ImportKey | None:
    """The key of the alias of `statement` that binds `bound`; None for relative, star and dotted plain imports."""
    if isinstance(statement, cst.ImportFrom):
        if statement.relative or statement.module is None or isinstance(statement.names, cst.ImportStar):
            return None
        module = get_full_name_for_node(statement.module)
        for alias in statement.names:
            name = get_full_name_for_node(alias.name)
            asname = alias.evaluated_alias
            if (asname or name) == bound:
                return (module, name, asname) if module and name else None
        return None
    for alias in statement.names:
        name = get_full_name_for_node(alias.name)
        asname = alias.evaluated_alias
        if asname == bound or (asname is None and name == bound and "." not in name):
            return (name, None, asname) if name else None
    return None


def import_references(module: cst.Module) -> dict[ImportKey, int]:
    """How often each imported name is referenced in `module` (all scopes together).

    Imports inside `try:` are left out: they probe for an optional package (`try: import apex`)."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    parents = wrapper.resolve(ParentNodeProvider)
    counts: dict[ImportKey, int] = {}
    for scope in {s for s in wrapper.resolve(ScopeProvider).values() if s is not None}:
        for assignment in scope.assignments:
            if not isinstance(assignment, ImportAssignment) or _in_try(assignment.node, parents):
                continue
            key = _key(assignment.node, assignment.name)
            if key is not None and key[0].split(".")[0] != "torch_xla":
                counts[key] = counts.get(key, 0) + len(assignment.references)
    return counts


def _in_try(node: cst.CSTNode, parents) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, cst.Try):
            return True
    return False


def remove_imports_made_unused(original: cst.Module, fixed: cst.Module) -> cst.Module:
    """`fixed` without the imports that `original` referenced and `fixed` no longer does."""
    before = import_references(original)
    after = import_references(fixed)
    dead = [key for key, uses in after.items() if uses == 0 and before.get(key, 0) > 0]
    if not dead:
        return fixed
    context = CodemodContext()
    for module, name, asname in dead:
        RemoveImportsVisitor.remove_unused_import(context, module, name, asname)
    cleaned = RemoveImportsVisitor(context).transform_module(fixed)
    try:
        compile(cleaned.code, "<cleaned>", "exec")
    except SyntaxError:  # e.g. a `try:` whose only statement was the import: keep it
        return fixed
    return cleaned
