"""Which functions and nn.Module classes the migration changed: the targets of the differential tests."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass


@dataclass
class Target:
    name: str
    kind: str  # "function", "module" or "other"
    reason: str = ""  # why it is not drivable, when known statically
    precision: str = "float32"  # the least precise float dtype its source (either side) computes in


# words in a target's source that mean it computes in lower precision; the tests loosen tolerances to match
PRECISION_WORDS = [
    ("bfloat16", re.compile(r"\b(bfloat16|bf16)\b")),
    ("float16", re.compile(r"\b(float16|half|fp16)\b")),
]


def source_precision(*sources: str) -> str:
    """The least precise float dtype named in the sources: "bfloat16", "float16" or "float32"."""
    text = " ".join(sources)
    for dtype, words in PRECISION_WORDS:
        if words.search(text):
            return dtype
    return "float32"


def _without_docstring(node: ast.AST) -> str:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        if isinstance(body[0].value.value, str):
            node = type(node)(**{**{f: getattr(node, f) for f in node._fields}, "body": body[1:]})
    return ast.dump(node)


def _module_classes(tree: ast.Module) -> set[str]:
    """Top-level classes that derive from torch.nn.Module (directly, through nn.* bases, or from one another)."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, node in classes.items():
            if name in found:
                continue
            for base in node.bases:
                text = ast.unparse(base)
                if (
                    text in ("Module", "nn.Module", "torch.nn.Module")
                    or text.startswith(("nn.", "torch.nn."))
                    or text in found
                ):
                    found.add(name)
                    changed = True
                    break
    return found


def _is_generator(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(node))


def find_targets(original_source: str, migrated_source: str, all_public: bool = False) -> list[Target]:
    """Top-level functions and classes of the original that the migration changed (or all public ones)."""
    original = ast.parse(original_source)
    migrated = ast.parse(migrated_source)
    migrated_defs = {
        n.name: n for n in migrated.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    modules = _module_classes(original)
    targets = []
    for node in original.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        other = migrated_defs.get(node.name)
        if all_public:
            if node.name.startswith("_"):
                continue
        elif other is not None and _without_docstring(node) == _without_docstring(other):
            continue
        target = _classify(node, modules, other)
        target.precision = source_precision(ast.unparse(node), ast.unparse(other) if other is not None else "")
        targets.append(target)
    return targets


def _classify(node: ast.AST, modules: set[str], migrated_node: ast.AST | None) -> Target:
    name = node.name
    if migrated_node is None:
        return Target(name, "other", "not defined at the top level of the migrated file")
    if isinstance(node, ast.ClassDef):
        if name in modules:
            return Target(name, "module")
        return Target(name, "other", "a class that is not an nn.Module subclass: only functions and modules are driven")
    if isinstance(node, ast.AsyncFunctionDef) or _is_generator(node):
        return Target(name, "other", "generator or async function: only plain functions are driven")
    if name == "main":
        return Target(name, "other", "program entry point: check it by running the program (xlaport verify)")
    return Target(name, "function")
