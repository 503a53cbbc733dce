"""Bulk rewriting: the migrated copy of a whole source tree."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from xlaport.files import SKIP_DIRS, atomic_write
from xlaport.kb.batch import FileResult, fix_file
from xlaport.kb.rule import Rule


class DestinationNotEmpty(FileExistsError):
    pass


@dataclass
class MigrationSummary:
    src: str
    dst: str
    files: list[FileResult] = field(default_factory=list)
    copied: int = 0  # non-Python files copied as they are

    @property
    def changed(self) -> list[FileResult]:
        return [f for f in self.files if f.changed]

    @property
    def errors(self) -> list[FileResult]:
        return [f for f in self.files if f.error]

    def applied_by_code(self) -> Counter:
        return Counter(f.code for r in self.files for f in r.applied)

    def remaining_by_code(self) -> Counter:
        return Counter(f.code for r in self.files for f in r.findings)

    def to_dict(self) -> dict:
        return {
            "src": self.src,
            "dst": self.dst,
            "python_files": len(self.files),
            "files_changed": len(self.changed),
            "other_files_copied": self.copied,
            "fixes_applied": dict(sorted(self.applied_by_code().items())),
            "findings_left": dict(sorted(self.remaining_by_code().items())),
            "errors": [f.error for f in self.errors],
            "left_for_human": [f.to_dict() for r in self.files for f in r.findings],
        }


def plan_tree(src: Path) -> tuple[list[Path], list[Path]]:
    """(python files, other files) under `src`, relative to it, skipping VCS and cache folders."""
    python, other = [], []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part in SKIP_DIRS for part in rel.parts) or not path.is_file():
            continue
        (python if path.suffix == ".py" else other).append(rel)
    return python, other


def migrate_tree(
    src: Path, dst: Path, rules: list[type[Rule]] | None = None, unsafe: bool = False, force: bool = False
) -> MigrationSummary:
    """Writes the migrated copy of `src` into `dst`; `src` is only read."""
    src, dst = src.resolve(), dst.resolve()
    if not src.is_dir():
        raise NotADirectoryError(f"source is not a directory: {src}")
    if dst == src or src in dst.parents:
        raise ValueError("the destination must be outside the source tree")
    if dst.exists() and any(dst.iterdir()) and not force:
        raise DestinationNotEmpty(f"destination exists and is not empty: {dst} (pass --force to write into it)")
    python, other = plan_tree(src)
    summary = MigrationSummary(str(src), str(dst))
    for rel in other:
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, target)
        summary.copied += 1
    for rel in python:
        result = fix_file(src / rel, rules, unsafe=unsafe, display=str(rel))
        summary.files.append(result)
        target = dst / rel
        if result.error:
            # never written as migrated: copy the original byte for byte so the tree stays complete
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, target)
        else:
            atomic_write(target, result.fixed)
            shutil.copystat(src / rel, target)
    return summary
