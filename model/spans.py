"""Where each function of a module is, its text, and the imports it uses.

The pipeline locates findings in functions and records per-function traces with these; the code
model rewrites one function at a time; training cuts the corpus into functions the same way.
"""

from __future__ import annotations

import ast
import textwrap

from xlaport.trace import MODULE_LEVEL

Span = tuple[str, int, int]  # (qualified name, first line incl. decorators, last line)


def function_spans(source: str) -> list[Span]:
    """(qualified name, first line incl. decorators, last line) of every function and method."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    spans: list[Span] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    spans.append((name, first, child.end_lineno or child.lineno))
                walk(child, name + ".")
            elif not isinstance(child, ast.expr):  # no def inside an expression: its subtree is skipped
                walk(child, prefix)

    walk(tree, "")
    return spans


def enclosing_function(spans: list[Span], line: int) -> str:
    """The innermost function holding `line`, or MODULE_LEVEL."""
    inside = [(end - start, name) for name, start, end in spans if start <= line <= end]
    return min(inside)[1] if inside else MODULE_LEVEL


def function_sources(source: str) -> dict[str, str]:
    """{qualified name: text} of every function and method."""
    lines = source.splitlines(keepends=True)
    return {name: "".join(lines[start - 1 : end]) for name, start, end in function_spans(source)}


def module_level(source: str) -> str:
    """The file's top-level code: every line outside functions and methods."""
    inside = set()
    for _, start, end in function_spans(source):
        inside.update(range(start, end + 1))
    return "".join(line for number, line in enumerate(source.splitlines(keepends=True), 1) if number not in inside)


def imports_used(module_source: str, function_source: str) -> str:
    """The unindented imports of `module_source` that bind names `function_source` uses (prompt context)."""
    try:
        tree = ast.parse(module_source)
        used = used_names(ast.parse(function_source))
    except (SyntaxError, ValueError):
        return ""
    lines = module_source.splitlines(keepends=True)
    return "".join(stmt for names, stmt in module_imports(tree, lines) if names & used)


def module_imports(tree: ast.Module, lines: list[str]) -> list[tuple[set[str], str]]:
    """(bound names, statement text) of every unindented import (not those under `if`/`try`)."""
    found = []
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.ImportFrom) and (
            node.level or node.module == "__future__" or any(a.name == "*" for a in node.names)
        ):
            continue  # relative imports do not resolve outside their package; __future__ must come first
        bound = {(a.asname or a.name).split(".")[0] for a in node.names}
        text = "".join(lines[node.lineno - 1 : (node.end_lineno or node.lineno)])
        found.append((bound, textwrap.dedent(text)))
    return found


def used_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
