"""Reading user files safely and writing them back without losing anything."""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".tox", ".mypy_cache"})
# What xlaport itself writes beside a migrated tree (serve/report.py, xlaport/trace.py): never a user's file to lint,
# migrate or copy again (a second migrate of a migrated tree would carry the first one's report along).
OWN_OUTPUT_FILE = re.compile(r"xlaport-(report|verify|rules)\.(json|md|html)|xlaport-trace\.jsonl")


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


def each_file_once(files: list[Path]) -> list[Path]:
    """`files` without a second path to the same file (a symlink beside its target, a path given twice): the
    file itself is kept rather than a link to it, in the order of `files`."""
    chosen: dict[str, Path] = {}
    for path in files:
        real = os.path.realpath(path)
        if real not in chosen or (chosen[real].is_symlink() and not path.is_symlink()):
            chosen[real] = path
    keep = set(chosen.values())
    return [path for path in dict.fromkeys(files) if path in keep]


def links_out_of(folders: list[Path], files: list[Path]) -> list[Path]:
    """The `files` found under one of `folders` that are links to a file outside that folder: rewriting a folder
    never writes outside it (a file given by name is followed where its link points, as the user asked)."""
    roots = [(folder, Path(os.path.realpath(folder))) for folder in folders if folder.is_dir()]
    outside = []
    for path in files:
        for folder, real_folder in roots:
            if folder in path.parents and not Path(os.path.realpath(path)).is_relative_to(real_folder):
                outside.append(path)
                break
    return outside


BOM = "\ufeff"


def read_source(path: Path, max_bytes: int | None = None) -> str:
    """The file's text (without a UTF-8 BOM: `atomic_write` puts it back); raises UnreadableSource for
    binary, non-UTF-8 or non-regular files (a FIFO would block the read forever), and for files over `max_bytes`
    before reading them (a multi-gigabyte file would be read whole only to be refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO or socket with no writer
            raise UnreadableSource(f"{path}: not a regular file; skipped") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableSource(f"{path}: not a regular file; skipped")
        if not _opened_inside_roots(fd):  # judged on what was opened: a file swapped for a link is not read
            raise UnreadableSource(f"{path}: outside the allowed folder; not read")
        refuse_larger(fd, path, max_bytes)
        data = handle.read()
    if b"\0" in data[:8192]:
        raise UnreadableSource(f"{path}: binary file (contains NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableSource(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return text.removeprefix(BOM)


def refuse_larger(fd: int, path: Path, max_bytes: int | None) -> None:
    """UnreadableSource when the open file has more than `max_bytes` bytes (None: no bound)."""
    size = os.fstat(fd).st_size
    if max_bytes is not None and size > max_bytes:
        raise UnreadableSource(f"{path}: too large to analyse: {size:,} bytes, the limit is {max_bytes:,}; not read")


class NotInside(ValueError):
    """A file read for a caller that is a link, not a regular file, or not really inside the folder it was checked in."""


def read_bytes_inside(path: Path, folder: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of `path` as it is opened: never through a link at its end (O_NOFOLLOW), only a regular file, and
    only when the file opened really lies inside `folder`. Judged on the open descriptor, so a file (or a folder
    above it) swapped for a link between a caller's check and this read is refused, never followed out. A file
    over `max_bytes` is refused (UnreadableSource) before it is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise NotInside(f"{path}: a link or not a regular file; only regular files are read") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        try:
            real = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # no /proc: the path's real file must be the one opened
            same = os.stat(os.path.realpath(path))
            real = Path(os.path.realpath(path)) if (same.st_dev, same.st_ino) == (info.st_dev, info.st_ino) else None
        if not stat.S_ISREG(info.st_mode) or real is None or not real.is_relative_to(os.path.realpath(folder)):
            raise NotInside(f"{path}: not a regular file inside {folder}; not read")
        refuse_larger(fd, path, max_bytes)
        return handle.read()


def copier_inside(top: Path) -> Callable[[str, str], str]:
    """A `copy_function` for `shutil.copytree(top, ..., symlinks=True)` that copies each file as it is opened: one
    swapped for a link after copytree listed it is copied as that link (as copytree copies links), never followed,
    and one reached through a folder swapped for a link out of `top` is refused (NotInside). Mode and times kept."""
    real_top = Path(os.path.realpath(top))

    def copy(source: str, target: str) -> str:
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            os.symlink(os.readlink(source), target)
            return target
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise shutil.SpecialFileError(f"{source}: not a regular file")
            if not Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(real_top):
                raise NotInside(f"{source}: reached through a link out of {top}; not copied")
            with open(target, "wb") as out:
                shutil.copyfileobj(handle, out, 2**20)
        os.chmod(target, stat.S_IMODE(info.st_mode))
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
        return target

    return copy


T = TypeVar("T")


class Stopped(BaseException):
    """The call was stopped from outside (a cancelled MCP tool call: SIGTERM) between two files. A BaseException,
    as KeyboardInterrupt: no handler of a file's failure may take it for one and go on with the next file."""


# A call stopped from outside ends between two files, never inside one: the write of one file (its backup, its
# temporary, the rename) is finished first, so no file is half-written and every original stays recoverable.
_writing = 0  # files being written now (nested: a file's backup inside its write)
_stop_asked = False


def stop_between_files(signum: int, frame: object) -> None:
    """A signal handler (SIGTERM in a stoppable call): raises Stopped at once, or, inside the write of a file,
    once that file is written."""
    global _stop_asked
    _stop_asked = True
    if not _writing:
        raise Stopped(f"stopped by signal {signum}")


@contextmanager
def one_file() -> Iterator[None]:
    """The write of one file, which a stop (`stop_between_files`) lets finish; Stopped before or after it."""
    global _writing
    if _stop_asked and not _writing:
        raise Stopped("stopped before the next file")
    _writing += 1
    try:
        yield
    finally:
        _writing -= 1
    if _stop_asked and not _writing:
        raise Stopped("stopped after a file was written")


def _one_file(write: Callable[..., T]) -> Callable[..., T]:
    """A function that writes one file, made a `one_file` block."""

    @functools.wraps(write)
    def whole(*args: object, **kwargs: object) -> T:
        with one_file():
            return write(*args, **kwargs)

    return whole


class WriteFailed(OSError):
    """A file could not be written; the old file is unchanged and nothing half-written is left."""


# A server acting for someone else (the MCP tools) confines every write of the call to an allowed folder: the
# check is here, where files are written, so that no path of a migration (copy, in-place rewrite, backup, report)
# can miss it. A context variable follows the call into the thread that runs it and no further.
_WRITE_ROOTS: ContextVar[tuple[Path, ...] | None] = ContextVar("xlaport_write_roots", default=None)


@contextmanager
def writes_confined_to(root: Path) -> Iterator[None]:
    """Within this block, `atomic_write`, `keep_backup` and `copy_file` refuse (WriteFailed) any file whose real
    path (links resolved) is not inside `root`, and `read_source` (UnreadableSource) any file it opened there."""
    token = _WRITE_ROOTS.set((Path(os.path.realpath(root)),))
    try:
        yield
    finally:
        _WRITE_ROOTS.reset(token)


@contextmanager
def writable_too(folder: Path) -> Iterator[None]:
    """Within confined writes, `folder` (one the caller created for itself, e.g. a staging copy) is allowed too."""
    roots = _WRITE_ROOTS.get()
    token = _WRITE_ROOTS.set(None if roots is None else (*roots, Path(os.path.realpath(folder))))
    try:
        yield
    finally:
        _WRITE_ROOTS.reset(token)


def check_writable(path: Path) -> None:
    """Raises WriteFailed when writes are confined (`writes_confined_to`) and `path`, links resolved, is outside."""
    roots = _WRITE_ROOTS.get()
    if roots is not None:
        real = Path(os.path.realpath(path))
        if not any(real.is_relative_to(root) for root in roots):
            raise WriteFailed(f"refusing to write {path}: it is outside the allowed folder {roots[0]}")


def _opened_inside_roots(fd: int) -> bool:
    """Is the file open as `fd` inside the confined roots (True when reads are not confined)?"""
    roots = _WRITE_ROOTS.get()
    if roots is None:
        return True
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return False  # cannot tell: not read
    return any(real.is_relative_to(root) for root in roots)


@contextmanager
def _folder_for_writes(path: Path) -> Iterator[int]:
    """The folder of `path`, opened once: the writes of the file are made relative to this descriptor (dir_fd),
    never through the folder's name looked up again. When writes are confined, the folder actually opened must
    lie inside the roots, judged on the descriptor: a folder on the way swapped for a link out of the root after
    `check_writable` is refused, never written through."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not _opened_inside_roots(fd):
            raise WriteFailed(f"refusing to write {path}: its folder is no longer inside the allowed folder")
        yield fd
    finally:
        os.close(fd)


def _make_folders(folder: Path) -> None:
    """Creates `folder` and its missing parents. When writes are confined, one level at a time: each made and opened
    relative to its opened parent (never through a link), and only in a parent whose opened descriptor lies inside
    the roots, so a folder on the way swapped for a link after `check_writable` creates nothing outside."""
    if _WRITE_ROOTS.get() is None:
        folder.mkdir(parents=True, exist_ok=True)
        return
    missing: list[str] = []
    existing = folder
    while not os.path.lexists(existing):
        missing.append(existing.name)
        existing = existing.parent
    fd = os.open(existing, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in reversed(missing):
            if not _opened_inside_roots(fd):
                raise WriteFailed(
                    f"refusing to create {folder}: a folder on its way is no longer inside the allowed folder"
                )
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def _new_temporary(folder: int, name: str) -> tuple[int, str]:
    """A new file `.NAME.XXXXXXXX.xlaport.tmp` (0600) in the open folder `folder`: (its descriptor, its name)."""
    for _ in range(100):
        tmp = f".{name}.{os.urandom(4).hex()}{TMP_SUFFIX}"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {name}")


def _has_bom(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(3) == BOM.encode()
    except OSError:
        return False


class ChangedMeanwhile(WriteFailed):
    """The file no longer holds the text the new one was computed from (edited meanwhile): left as it is."""


@_one_file
def atomic_write(
    path: Path, text: str, like: Path | None = None, *, expected: str | None = None, mode: int | None = None
) -> None:
    """Writes `text` to `path` so that readers see the old or the new file, never half of one.

    A symlink stays a link (its target is rewritten). The file keeps the mode, owner, group and UTF-8 BOM
    of `like` (default: the file being replaced); `mode` sets the mode instead. With `expected`, the file must
    still hold that text (as `read_source` reads it) just before it is replaced, else ChangedMeanwhile and the
    file is left as it is: an edit made while the new text was computed is never lost. The data is on disk
    (fsync) before the rename. Raises WriteFailed, with the reason, when the disk is full or the file cannot be
    replaced, or when writes are confined elsewhere (`writes_confined_to`).
    """
    path = Path(os.path.realpath(path)) if path.is_symlink() else path
    check_writable(path)
    like = like if like is not None else (path if path.exists() else None)
    if like is not None and _has_bom(like) and not text.startswith(BOM):
        text = BOM + text
    tmp = None
    try:
        _make_folders(path.parent)
        with _folder_for_writes(path) as folder:
            fd, tmp = _new_temporary(folder, path.name)
            try:
                with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
                    handle.write(text)
                    handle.flush()
                    os.fsync(handle.fileno())
                if like is not None:
                    info = os.stat(like)
                    if (info.st_uid, info.st_gid) != (os.getuid(), os.getgid()):
                        try:
                            os.chown(tmp, info.st_uid, info.st_gid, dir_fd=folder, follow_symlinks=False)
                        except PermissionError:
                            pass  # only root may give a file away: it becomes ours, as with any editor
                    os.chmod(tmp, info.st_mode & 0o7777 if mode is None else mode, dir_fd=folder)
                else:  # the temporary is 0600; a new file gets the usual permissions
                    umask = os.umask(0)
                    os.umask(umask)
                    os.chmod(tmp, 0o666 & ~umask if mode is None else mode, dir_fd=folder)
                if expected is not None and not _holds(path, expected):  # checked last: the window is the rename
                    raise ChangedMeanwhile(
                        f"{path}: changed while it was analysed; left as it is (run again to fix it)"
                    )
                os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
                tmp = None
            finally:
                if tmp is not None:  # only the temporary this call created is ever deleted
                    os.unlink(tmp, dir_fd=folder)
    except WriteFailed:
        raise
    except OSError as exc:
        raise WriteFailed(f"cannot write {path}: {exc.strerror or exc}; the file is unchanged") from None


REPORT_MODE = 0o644  # a report is for sharing, unless what it quotes is not


def quoting_mode(sources: Iterable[Path], default: int = REPORT_MODE) -> int:
    """The mode of a file that quotes `sources` (a report, a trace): `default` less each permission of group or
    others that one of them withholds. A report quoting a 0600 file is 0600; its owner keeps read and write."""
    mode = default
    for path in sources:
        try:
            mode &= os.stat(path).st_mode | 0o600
        except OSError:
            mode &= 0o600  # unknown: the most restrictive
    return mode & 0o777


def restrict_mode(path: Path, mode: int) -> None:
    """Takes away from `path` the permissions `mode` lacks (never adds any): for a file appended to, not replaced."""
    try:
        current = os.stat(path).st_mode & 0o7777
        if current & ~mode:
            os.chmod(path, current & mode)
    except OSError:
        pass  # a file that cannot be read back was not written either (append_records says so)


def _holds(path: Path, text: str) -> bool:
    try:
        return read_source(path) == text.removeprefix(BOM)
    except (OSError, UnreadableSource):
        return False


# atomic_write's temporary files, `.NAME.XXXXXXXX.xlaport.tmp`. Each call deletes its own; one left by a killed
# run stays where it is: a file that merely looks like a temporary may be the user's, and is never deleted or
# skipped.
TMP_SUFFIX = ".xlaport.tmp"


@_one_file
def copy_file(source: Path, target: Path) -> None:
    """A byte copy with mode and times (a symlink stays a link); WriteFailed when the disk is full, or when writes
    are confined elsewhere (`writes_confined_to`)."""
    check_writable(target)
    try:
        _make_folders(target.parent)
        with _folder_for_writes(target) as folder:
            if os.path.islink(source):
                if os.path.lexists(target):
                    os.unlink(target.name, dir_fd=folder)
                os.symlink(os.readlink(source), target.name, dir_fd=folder)
                return
            if os.path.islink(target):  # the copy is a file of its own, never written through a link
                os.unlink(target.name, dir_fd=folder)
            info = os.stat(source)
            out = os.open(target.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=folder)
            with open(source, "rb") as handle, os.fdopen(out, "wb") as written:
                shutil.copyfileobj(handle, written, 2**20)
                os.fchmod(out, stat.S_IMODE(info.st_mode))
                os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
    except WriteFailed:
        raise
    except OSError as exc:
        raise WriteFailed(f"cannot write {target}: {exc.strerror or exc}") from None


def _git(directory: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError, NotADirectoryError):
        return None


def _repository_state(paths: list[Path]) -> dict[Path, str]:
    """Each file's state in ITS OWN git repository: "clean", "dirty", "untracked" (also ignored), "hidden"
    (skip-worktree or assume-unchanged: git does not say whether it was edited) or "no-git"."""
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
        # -v tags each entry: "H" tracked, "S" skip-worktree, a lower-case tag assume-unchanged. git status hides
        # local edits of the last two, so such a file is never taken as clean: it gets a backup
        listed = _git(Path(top), "ls-files", "-v", "-z", "--full-name", "--", *(str(p) for p in files)) or ""
        tags = {(Path(top) / entry[2:]).resolve(): entry[0] for entry in filter(None, listed.split("\0"))}
        status = _git(Path(top), "status", "--porcelain", "-z", "--untracked-files=no") or ""
        # "XY path": Y is the work tree against the index. A change that is all staged (Y blank: as pre-commit leaves
        # the files it hands a hook) is in the index, and `git restore FILE` brings it back: git is the way back
        dirty = {
            (Path(top) / entry[3:]).resolve()
            for entry in filter(None, status.split("\0"))
            if len(entry) > 3 and entry[1] != " "
        }
        for p in files:
            tag = tags.get(p)
            if tag is None:
                state[p] = "untracked"
            elif tag == "S" or tag.islower():
                state[p] = "hidden"
            else:
                state[p] = "dirty" if p in dirty else "clean"
    return state


class DirtyTree(RuntimeError):
    """In-place rewriting refused: the files have uncommitted changes."""


def in_place_backups(paths: list[Path], force: bool) -> set[Path]:
    """The files (of `paths`, to be rewritten in place) that need a backup first; raises DirtyTree to refuse.

    Each file is judged in its own git repository: tracked and clean there, git is the way back; untracked,
    ignored, outside git, or marked skip-worktree / assume-unchanged (git hides their edits), a backup is kept;
    with uncommitted changes, refused (with --force: a backup).
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


@_one_file
def keep_backup(path: Path) -> Path:
    """Copies `path` (its bytes, mode, owner, group and times) to a new `.xlaport.bak` beside it; never overwrites one.

    The first backup is `NAME.xlaport.bak`; when that exists (an earlier run's original), `NAME.xlaport.1.bak`, ...
    The backup belongs to the file's owner with the file's mode: whoever could read the file can read its backup,
    and nobody else.
    """
    path = Path(os.path.realpath(path))
    for n in range(10_000):
        target = backup_path(path) if n == 0 else path.with_name(f"{path.name}.xlaport.{n}.bak")
        check_writable(target)
        try:
            with _folder_for_writes(target) as folder:
                try:
                    fd = os.open(
                        target.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder
                    )
                except FileExistsError:
                    continue
                try:
                    with os.fdopen(fd, "wb") as handle:
                        handle.write(path.read_bytes())
                        handle.flush()
                        os.fsync(handle.fileno())
                        info = os.stat(path)
                        if (info.st_uid, info.st_gid) != (os.getuid(), os.getgid()):
                            try:
                                os.fchown(fd, info.st_uid, info.st_gid)  # before the mode: chown clears set-id bits
                            except PermissionError:
                                pass  # only root may give a file away
                        os.fchmod(fd, stat.S_IMODE(info.st_mode))
                        os.utime(fd, ns=(info.st_atime_ns, info.st_mtime_ns))
                except OSError:
                    os.unlink(target.name, dir_fd=folder)
                    raise
        except WriteFailed:
            raise
        except OSError as exc:
            raise WriteFailed(f"cannot back up {path}: {exc.strerror or exc}; nothing was rewritten") from None
        return target
    raise WriteFailed(f"cannot back up {path}: too many backups already")


@_one_file
def write_with_backup(path: Path, text: str, backup: bool, expected: str | None = None) -> Path | None:
    """`atomic_write` of a file rewritten in place, after a `keep_backup` when `backup`; the backup (None without
    one). A write that fails (ChangedMeanwhile included) leaves the file as it was and removes the backup it made:
    nothing stray is left beside the file."""
    kept = keep_backup(path) if backup else None
    try:
        atomic_write(path, text, expected=expected)
    except WriteFailed:
        if kept is not None:
            kept.unlink(missing_ok=True)
        raise
    return kept


def module_file(root: Path, module: str) -> Path:
    """The file `python -m MODULE` runs when started in `root`: `pkg/mod.py`, or `pkg/mod/__main__.py`."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        raise ValueError(f"not a module name: {module!r} (e.g. tools.train)")
    base = Path(root).resolve().joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no module {module} in {root}: `python -m {module}` run there would not find it")
