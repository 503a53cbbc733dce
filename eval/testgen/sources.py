"""The pairs of ORIGINAL and MIGRATED files to test, and the importable module name of each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xlaport.files import iter_python_files

from .results import TestgenError, Undrivable


@dataclass
class SourcePair:
    rel: str  # the original file relative to its root
    original_file: Path
    migrated_file: Path
    original_root: Path
    migrated_root: Path
    original_module: str
    migrated_module: str


def module_name(rel: Path) -> str | None:
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def _is_test_file(path: Path) -> bool:
    return path.name == "conftest.py" or path.name.startswith("test_") or path.name.endswith("_test.py")


def source_pairs(original: Path, migrated: Path, out: Path) -> tuple[list[SourcePair], list[Undrivable]]:
    """Matches each original file to its migrated counterpart (a migrated tree mirrors the original)."""
    original, migrated = original.resolve(), migrated.resolve()
    if not original.exists():
        raise TestgenError(f"no such file or directory: {original}")
    if not migrated.exists():
        raise TestgenError(f"no such file or directory: {migrated}")
    if original.is_file():
        if original.suffix != ".py":
            raise TestgenError(f"not a Python file: {original}")
        migrated_file = migrated / original.name if migrated.is_dir() else migrated
        if not migrated_file.is_file():
            raise TestgenError(f"no migrated counterpart of {original.name} at {migrated_file}")
        pair = SourcePair(
            original.name,
            original,
            migrated_file,
            original.parent,
            migrated_file.parent,
            original.stem,
            migrated_file.stem,
        )
        for name in (pair.original_module, pair.migrated_module):
            if not name.isidentifier():
                raise TestgenError(f"{name}.py cannot be imported as a module (rename it to a valid identifier)")
        return [pair], []
    if not migrated.is_dir():
        raise TestgenError(f"ORIGINAL is a directory, so MIGRATED must be one too: {migrated}")
    pairs, skipped = [], []
    out = out.resolve()
    for path in iter_python_files([original]):
        if _is_test_file(path) or any(d == path.parent or d in path.parents for d in (out, migrated)):
            continue  # generated tests, or a migrated tree kept inside the original one
        rel = path.relative_to(original)
        module = module_name(rel)
        if module is None:
            skipped.append(Undrivable(str(rel), "*", "file path is not importable as a module"))
            continue
        migrated_file = migrated / rel
        if not migrated_file.is_file():
            skipped.append(Undrivable(str(rel), "*", f"no migrated counterpart at {migrated_file}"))
            continue
        pairs.append(SourcePair(str(rel), path, migrated_file, original, migrated, module, module))
    return pairs, skipped
