"""Reading user files safely and writing them back without losing anything."""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".tox", ".mypy_cache"})
# What xlaport itself writes beside a migrated tree (serve/report.py, xlaport/trace.py): never a user's file to lint,
# migrate or copy again (a second migrate of a migrated tree would carry the first one's report along).
OWN_OUTPUT_FILE = re.compile(r"xlaport-(report|verify)\.(json|md|html)|xlaport-trace\.jsonl")


def is_own_output(name: str) -> bool:
    """Is a file called `name` one of xlaport's reports or traces?"""
    return OWN_OUTPUT_FILE.fullmatch(name) is not None


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
                    if name.endswith(suffixes) and not is_own_output(name):
                        yield Path(root) / name
        elif path.exists():
            yield path
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")


BOM = "\ufeff"


def read_source(path: Path) -> str:
    """The file's text (without a UTF-8 BOM: `atomic_write` puts it back); raises UnreadableSource for
    binary, non-UTF-8 or non-regular files (a FIFO would block the read forever)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO or socket with no writer
            raise UnreadableSource(f"{path}: not a regular file; skipped") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableSource(f"{path}: not a regular file; skipped")
        data = handle.read()
    if b"\0" in data[:8192]:
        raise UnreadableSource(f"{path}: binary file (contains NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableSource(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return text.removeprefix(BOM)


class WriteFailed(OSError):
    """A file could not be written; the old file is unchanged and nothing half-written is left."""


def _has_bom(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(3) == BOM.encode()
    except OSError:
        return False


def atomic_write(path: Path, text: str, like: Path | None = None) -> None:
    """Writes `text` to `path` so that readers see the old or the new file, never half of one.

    A symlink stays a link (its target is rewritten). The file keeps the mode, owner, group and UTF-8 BOM
    of `like` (default: the file being replaced). The data is on disk (fsync) before the rename. Raises
    WriteFailed, with the reason, when the disk is full or the file cannot be replaced.
    """
    path = Path(os.path.realpath(path)) if path.is_symlink() else path
    like = like if like is not None else (path if path.exists() else None)
    if like is not None and _has_bom(like) and not text.startswith(BOM):
        text = BOM + text
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if like is not None:
            info = os.stat(like)
            if (info.st_uid, info.st_gid) != (os.getuid(), os.getgid()):
                try:
                    os.chown(tmp, info.st_uid, info.st_gid)
                except PermissionError:
                    pass  # only root may give a file away: it becomes ours, as with any editor
            os.chmod(tmp, info.st_mode & 0o7777)
        else:  # mkstemp creates 0600; a new file gets the usual permissions
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise WriteFailed(f"cannot write {path}: {exc.strerror or exc}; the file is unchanged") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


TMP_SUFFIX = ".xlaport.tmp"  # atomic_write's temporary files: `.NAME.XXXXXXXX.xlaport.tmp`
# ... and those of older versions, `.NAME.XXXXXXXX.tmp` (mkstemp's eight random characters)
_TEMPORARY = re.compile(r"\..+\.[a-z0-9_]{8}(\.xlaport)?\.tmp")


def is_temporary(path: Path) -> bool:
    """A temporary file left by an interrupted `atomic_write` (never copied, safe to delete)."""
    return _TEMPORARY.fullmatch(path.name) is not None


def remove_stale_temporaries(directory: Path) -> int:
    """Deletes what interrupted writes left in `directory`; how many."""
    removed = 0
    for path in directory.glob(".*.tmp"):
        if is_temporary(path) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _git(directory: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError, NotADirectoryError):
        return None


def _repository_state(paths: list[Path]) -> dict[Path, str]:
    """Each file's state in ITS OWN git repository: "clean", "dirty", "untracked" (also ignored) or "no-git"."""
    by_top: dict[str | None, list[Path]] = {}
    tops: dict[Path, str | None] = {}
    for path in paths:
        directory = path.parent
        if directory not in tops:
            top = _git(directory, "rev-parse", "--show-toplevel")
            tops[directory] = top.strip() if top else None
        by_top.setdefault(tops[directory], []).append(path)
    state: dict[Path, str] = {}
    for top, files in by_top.items():
        if top is None:
            state.update((p, "no-git") for p in files)
            continue
        listed = _git(Path(top), "ls-files", "-z", "--full-name", "--", *(str(p) for p in files)) or ""
        tracked = {(Path(top) / entry).resolve() for entry in filter(None, listed.split("\0"))}
        status = _git(Path(top), "status", "--porcelain", "-z", "--untracked-files=no") or ""
        dirty = {(Path(top) / entry[3:]).resolve() for entry in filter(None, status.split("\0")) if len(entry) > 3}
        for p in files:
            state[p] = "untracked" if p not in tracked else "dirty" if p in dirty else "clean"
    return state


class DirtyTree(RuntimeError):
    """In-place rewriting refused: the files have uncommitted changes."""


def in_place_backups(paths: list[Path], force: bool) -> set[Path]:
    """The files (of `paths`, to be rewritten in place) that need a backup first; raises DirtyTree to refuse.

    Each file is judged in its own git repository: tracked and clean there, git is the way back; untracked,
    ignored or outside git, a backup is kept; with uncommitted changes, refused (with --force: a backup).
    """
    resolved = {p: Path(os.path.realpath(p)) for p in paths}
    state = _repository_state(list(dict.fromkeys(resolved.values())))
    dirty = sorted(str(p) for p in paths if state[resolved[p]] == "dirty")
    if dirty and not force:
        raise DirtyTree(
            "refusing to rewrite files with uncommitted changes (commit or stash them, or pass --force): "
            + ", ".join(dirty[:5])
            + (" ..." if len(dirty) > 5 else "")
        )
    return {p for p in paths if state[resolved[p]] != "clean"}


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".xlaport.bak")


def keep_backup(path: Path) -> Path:
    """Copies `path` (its bytes, mode and times) to a new `.xlaport.bak` beside it; never overwrites one.

    The first backup is `NAME.xlaport.bak`; when that exists (an earlier run's original), `NAME.xlaport.1.bak`, ...
    """
    path = Path(os.path.realpath(path))
    for n in range(10_000):
        target = backup_path(path) if n == 0 else path.with_name(f"{path.name}.xlaport.{n}.bak")
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        except OSError as exc:
            raise WriteFailed(f"cannot back up {path}: {exc.strerror or exc}; nothing was rewritten") from None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(path.read_bytes())
                handle.flush()
                os.fsync(handle.fileno())
            shutil.copystat(path, target)
        except OSError as exc:
            target.unlink(missing_ok=True)
            raise WriteFailed(f"cannot back up {path}: {exc.strerror or exc}; nothing was rewritten") from None
        return target
    raise WriteFailed(f"cannot back up {path}: too many backups already")
