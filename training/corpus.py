"""The corpus: functions of real PyTorch code found on this machine.

By default the `.py` files of installed packages (torch, transformers, peft, accelerate) are read;
any folders can be given instead. Every function (methods included, dedented) becomes a
`Function` that keeps the module-level imports it uses, so that rules resolving qualified names
(`torch.cuda.synchronize`) see the same names the function saw in its file.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from xlaport.model.spans import module_imports, used_names

from xlaport.files import SKIP_DIRS

DEFAULT_PACKAGES = ("torch", "transformers", "peft", "accelerate")
MIN_FUNCTION_LINES = 3
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Function:
    file: str  # path relative to its corpus root, e.g. "torch/nn/functional.py"; the split key
    name: str  # Class.method or function name
    source: str  # dedented source, decorators included, ending with a newline
    imports: str  # module-level import statements that bind names the function uses

    def to_dict(self) -> dict:
        return asdict(self)


def package_roots(packages: Iterable[str] = DEFAULT_PACKAGES) -> list[Path]:
    """Folders of installed packages (found without importing them); missing packages are skipped."""
    roots = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec and spec.submodule_search_locations:
            roots.append(Path(next(iter(spec.submodule_search_locations))))
    return roots


def corpus_files(roots: Iterable[Path], max_files: int | None = None) -> list[tuple[Path, str]]:
    """(path, name relative to the root's parent) of the .py files under `roots`, in a stable order.

    With `max_files`, a deterministic sample of that many files per root (by hash of the name).
    """
    chosen: list[tuple[Path, str]] = []
    for root in roots:
        root = root.resolve()
        files = [
            p
            for p in root.rglob("*.py")
            if not any(part in SKIP_DIRS for part in p.relative_to(root).parts) and p.is_file()
        ]
        named = sorted((str(p.relative_to(root.parent)), p) for p in files)
        if max_files is not None:
            named = sorted(named, key=lambda item: _digest(item[0]))[:max_files]
            named.sort()
        chosen.extend((p, name) for name, p in named)
    return chosen


def split_of(file: str) -> str:
    """train / val / test (80/10/10), fixed by the source file's name, so a file never straddles splits."""
    bucket = int(_digest(file)[:8], 16) % 100
    return "train" if bucket < 80 else "val" if bucket < 90 else "test"


def normalized_key(source: str) -> str:
    """Identity of a piece of code for deduplication: whitespace-insensitive hash."""
    return _digest(re.sub(r"\s+", " ", source).strip())


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def extract_functions(source: str, file: str, max_chars: int = 3000) -> list[Function]:
    """Every function and method of `source` between MIN_FUNCTION_LINES lines and `max_chars` characters."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines(keepends=True)
    imports = module_imports(tree, lines)
    found: list[Function] = []
    for node, qualname in _functions(tree):
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        end = node.end_lineno or node.lineno
        if end - start + 1 < MIN_FUNCTION_LINES:
            continue
        text = "".join(lines[start - 1 : end])
        if len(text) > max_chars:
            continue
        text = textwrap.dedent(text)
        if not text.endswith("\n"):
            text += "\n"
        try:
            compile(text, file, "exec", flags=ast.PyCF_ONLY_AST)
        except SyntaxError:  # e.g. a method whose continuation lines were indented oddly
            continue
        used = used_names(node)
        header = "".join(stmt for names, stmt in imports if names & used)
        found.append(Function(file=file, name=qualname, source=text, imports=header))
    return found


def iter_functions(roots: Iterable[Path], max_files: int | None = None, max_chars: int = 3000) -> Iterator[Function]:
    for path, name in corpus_files(roots, max_files):
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield from extract_functions(source, name, max_chars)


def _functions(tree: ast.Module) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """Top-level functions and methods of top-level classes (nested functions stay inside their parent)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, node.name
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield item, f"{node.name}.{item.name}"
