"""Where libcst puts a node, from the tree's parents alone: its dotted name, whether it is read, the functions
(and the module) whose names it sees. names.py answers libcst's qualified names with these, without libcst's
scope analysis of the whole module. `parents` maps each node to its parent (ModuleAnalysis.parents)."""

from __future__ import annotations

import libcst as cst

_COMPREHENSIONS = {cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp}


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


def is_read(name: cst.Name, parent: cst.CSTNode | None) -> bool:
    """Does libcst record an Access (a read) of `name` under `parent`?"""
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


def resolved_name(node: cst.CSTNode, parents: dict) -> str | None:
    """The dotted name libcst resolves for `node`; None where libcst's scope analysis gives the node no
    scope (so no names): an attribute's or keyword's own name, names inside import statements."""
    parent = parents.get(node)
    kind = type(parent)
    if kind is cst.Attribute and parent.attr is node or kind is cst.Arg and parent.keyword is node:
        return None
    if kind is cst.NameItem:
        return None
    while kind is cst.Attribute or kind is cst.ImportAlias or kind is cst.AsName:
        parent = parents.get(parent)
        kind = type(parent)
    if kind is cst.Import or kind is cst.ImportFrom:
        return None
    return full_name(node)


def scopes_around(node: cst.CSTNode, parents: dict) -> list[cst.CSTNode]:
    """The functions whose names `node` sees, innermost first, then the module. A function's decorators,
    return annotation, parameter defaults and annotations belong to the scope around it, as in libcst."""
    scopes: list[cst.CSTNode] = []
    outside = False  # the walk came up through a parameter's default or annotation
    child, parent = node, parents.get(node)
    while parent is not None:
        kind = type(parent)
        if kind is cst.Param and child is not parent.name:
            outside = True
        elif kind is cst.FunctionDef or kind is cst.Lambda:
            inside = child is parent.body or child is parent.params and not outside
            if inside and kind is cst.FunctionDef:
                scopes.append(parent)
            outside = False
        child, parent = parent, parents.get(parent)
    scopes.append(child)  # the module
    return scopes


def import_scope(stmt: cst.CSTNode, parents: dict) -> cst.CSTNode | None:
    """The function (or module) an import statement binds in; None in a class body."""
    parent = parents.get(stmt)
    while parent is not None and not isinstance(parent, cst.FunctionDef | cst.ClassDef):
        stmt, parent = parent, parents.get(parent)
    return stmt if parent is None else parent if isinstance(parent, cst.FunctionDef) else None


def own_scope(node: cst.CSTNode, function: cst.CSTNode, parents: dict) -> cst.CSTNode | None | bool:
    """`function` (the innermost function or module around `node`) when libcst puts `node` in that scope
    itself; None when in a lambda's or class's body inside it; False when unsure (a comprehension)."""
    child, parent = node, parents.get(node)
    while parent is not None and parent is not function:
        kind = type(parent)
        if kind in _COMPREHENSIONS:
            return False
        if (kind is cst.Lambda or kind is cst.ClassDef) and child is parent.body:
            return None
        child, parent = parent, parents.get(parent)
    return function


def in_class_scope(node: cst.CSTNode, parents: dict) -> bool:
    """May `node` be read in a class body's own scope (where the class's names are seen)? False only where the
    scope around it is certainly a function's, a lambda's or the module's."""
    outside = False  # the walk came up through a parameter's default or annotation
    child, parent = node, parents.get(node)
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
        child, parent = parent, parents.get(parent)
    return type(child) is not cst.Module  # a node outside the module's tree: unsure


def is_method(function: cst.CSTNode, parents: dict) -> bool:
    """Is `function` defined directly in a class body?"""
    block = parents.get(function)
    return type(parents.get(block)) is cst.ClassDef
