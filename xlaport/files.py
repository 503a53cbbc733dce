"""Reading user files safely and writing them back without losing anything."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".tox", ".mypy_cache"})


class UnreadableSource(ValueError):
    """A file that is not UTF-8 Python text."""


@dataclass(frozen=True)
class SourceFile:
    path: Path
    text: str


def iter_python_files(paths: Iterable[Path], suffixes: tuple[str, ...] = (".py",)) -> Iterator[Path]:
    """Every .py file (or file ending in one of `suffixes`) under `paths`, in a stable order; files given
    directly are always included."""
    for path in paths:
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
                for name in sorted(files):
                    if name.endswith(suffixes):
                        yield Path(root) / name
        elif path.exists():
            yield path
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")


def read_source(path: Path) -> str:
    """The file's text; raises UnreadableSource for binary or non-UTF-8 content."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        raise UnreadableSource(f"{path}: binary file (contains NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableSource(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def atomic_write(path: Path, text: str) -> None:
    """Writes `text` to `path` so that readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:  # mkstemp creates 0600; a new file gets the usual permissions
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def git_dirty_files(path: Path) -> set[Path] | None:
    """Files with uncommitted changes in the git work tree holding `path`; None when not in git."""
    directory = path if path.is_dir() else path.parent
    try:
        top = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "--show-toplevel"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", top, "status", "--porcelain", "-z", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    dirty = set()
    for entry in filter(None, status.split("\0")):
        dirty.add((Path(top) / entry[3:]).resolve())
    return dirty


class DirtyTree(RuntimeError):
    """In-place rewriting refused: the files have uncommitted changes."""


def check_in_place_allowed(paths: list[Path], force: bool) -> bool:
    """Raises DirtyTree if a file to rewrite has uncommitted git changes; True if backups are needed.

    A clean git tree is its own way back. Outside git (or with --force) the caller keeps a backup.
    """
    if not paths:
        return False
    dirty = git_dirty_files(paths[0])
    if dirty is None:
        return True
    touched = sorted(str(p) for p in paths if p.resolve() in dirty)
    if touched and not force:
        raise DirtyTree(
            "refusing to rewrite files with uncommitted changes (commit or stash them, or pass --force): "
            + ", ".join(touched[:5])
            + (" ..." if len(touched) > 5 else "")
        )
    return bool(touched)


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".xlaport.bak")
