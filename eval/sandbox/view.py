"""What the child sees: the plan that eval/sandbox/init.py carries out inside the new namespaces.

/tmp, /var/tmp, /dev/shm and /run/lock become empty private tmpfs; a folder the sandbox user could not
traverse (a 0700 /root) is covered the same way. The folders the run needs (the interpreter, the import
path, the command's files, the handed-over folders) are mounted back at their own paths, and nothing else.

The user's own folders (the project the command runs in) are shown as *views*: at their own paths, owned by
the sandbox user, writable, and never changed. An overlay mount sends every write to an upper folder in the
run's scratch (the files the run wrote are found there afterwards); where overlayfs is refused, the view is
a copy in the scratch, mounted at the folder's path (or, without a mount namespace, run at its own path).
A file the sandbox user could not read stays unreadable in the view unless the caller may show it (`reveal`:
the `xlaport check` user, who could read it anyway; never a server's client).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

INIT = Path(__file__).with_name("init.py")
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where `xlaport` is imported from
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt")
# the root of a tree `xlaport migrate` wrote (its report lies there): what the migrated program may reach
MIGRATED_TREE_MARKER = "xlaport-report.json"
# not walked when a view is given to the sandbox user: big, and nothing a run writes (they stay read-only)
NOT_GIVEN = (".git", ".hg", ".svn", ".venv", "venv", "node_modules", ".tox", ".mypy_cache")
COPY_LINK_BYTES = 64 * 2**20  # a copied view links to bigger files instead of copying them
GIVE_LIMIT = 50_000  # entries of a view given to the sandbox user (~0.2 ms each through overlay's metacopy)
OVERLAY_WHITEOUT = 0  # a deleted file is a character device 0:0 in the upper folder
METACOPY_XATTR = "trusted.overlay.metacopy"  # an upper file holding only the new owner, its data still below


@dataclass
class View:
    """One user folder the run sees, writable, at its own path; what it writes lands in `store`."""

    folder: str  # the user's folder (never written)
    kind: str  # "overlay", "bind" (a copy mounted at `folder`) or "copy" (a copy run at its own path)
    store: str  # overlay: the upper folder; bind and copy: the copy
    work: str = ""  # overlay's work folder
    first: str = ""  # walked first when the view is given to the sandbox user (the working folder)
    before: dict | None = None  # bind/copy: {relative path: (size, mtime_ns)} of the copy before the run

    @property
    def seen_at(self) -> str:
        """Where the child finds the folder."""
        return self.store if self.kind == "copy" else self.folder

    def to_plan(self) -> dict:
        return {"folder": self.folder, "kind": self.kind, "store": self.store, "work": self.work, "first": self.first}


def project_root(folder: Path) -> Path:
    """The tree a command run in `folder` may reach with `../`: the nearest enclosing git work tree, else the root
    of the migrated tree it is in, else the nearest folder with a project file (pyproject.toml, setup.py,
    setup.cfg, requirements.txt), else `folder`. Never `/` or the home folder (a dotfiles repository is not a
    project)."""
    folder = Path(folder).resolve()
    too_wide = {Path("/"), Path.home().resolve()}
    for markers in ((".git",), (MIGRATED_TREE_MARKER,), PROJECT_MARKERS):
        for candidate in (folder, *folder.parents):
            if candidate in too_wide:
                break
            if any((candidate / marker).exists() for marker in markers):
                return candidate
    return folder


def namespace_argv(
    user: tuple[int, int],
    needed: list[str],
    status_fd: int,
    argv: list[str],
    views: list[View] = (),
    reveal: bool = False,
    userns: bool = True,
    cwd: str = "/",
) -> list[str]:
    """The command line that runs `argv` through init.py in new namespaces, in `cwd` once the views are there."""
    plan = {
        "uid": user[0],
        "gid": user[1],
        "views": [v.to_plan() for v in views if v.kind != "copy"],
        "reveal": reveal,
        "not_given": NOT_GIVEN,
        "give_limit": GIVE_LIMIT,
        "cover": covers(needed, user, [v.folder for v in views if v.kind != "copy"]),
        "status_fd": status_fd,
        "no_userns": userns and user[0] != 0,  # a root run (allowed unsandboxed) keeps root's powers
        "cwd": cwd,
        "argv": argv,
    }
    init = [sys.executable, "-I", "-S", str(INIT), json.dumps(plan)]
    return ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--net", "--", *init]


def needed_paths(cwd: Path, argv: list[str], handed: list[Path]) -> list[str]:
    """Folders the child must see: the interpreter, the import path, the command's files, the handed-over ones."""
    paths = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)), str(cwd)]
    paths += [p for p in sys.path if p and os.path.isdir(p)] + [str(p) for p in handed]
    paths += [os.path.dirname(a) for a in argv if os.path.isabs(a) and os.path.isfile(a)]
    paths.append(str(PACKAGE_ROOT))
    return sorted({os.path.realpath(p) for p in paths})


def covers(needed: list[str], user: tuple[int, int], given: list[str] = ()) -> list[list]:
    """[folder, mode, kept paths] for each private tmp folder and each folder `user` cannot traverse (a view's
    folder and what is below it are the user's in the namespace: never covered)."""
    modes = {d: 0o1777 for d in PRIVATE_DIRS if os.path.isdir(d) and not os.path.islink(d)}
    for path in needed:
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            folder = str(Path(*parts[:depth]))
            if any(inside(folder, g) for g in given):
                break
            if not any(inside(folder, d) for d in modes) and not may(folder, user, 0o1):
                modes[folder] = 0o755
                break
    plan = []
    for folder in sorted(modes, key=lambda d: d.count("/")):
        kept = [p for p in needed if p.startswith(folder + "/")]
        kept = [p for p in kept if not any(p.startswith(q + "/") for q in kept)]  # the outermost only
        plan.append([folder, modes[folder], kept])
    return plan


def inside(path: str | Path, folder: str | Path) -> bool:
    path, folder = str(path), str(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def may(path: str, user: tuple[int, int], bits: int) -> bool:
    """Whether `user` has permission `bits` (0o4 read, 0o2 write, 0o1 search) on `path` by its mode."""
    return may_stat(os.stat(path), user, bits)


def may_stat(info: os.stat_result, user: tuple[int, int], bits: int) -> bool:
    shift = 6 if info.st_uid == user[0] else 3 if info.st_gid == user[1] else 0
    return user[0] == 0 or (info.st_mode >> shift) & bits == bits


def describe(path: str) -> str:
    info = os.stat(path)
    return f"{path} ({stat.filemode(info.st_mode)} uid {info.st_uid})"


def unreadable(path: str, user: tuple[int, int], within: str | None = None) -> str | None:
    """`path` (or, inside the view folder `within`, one of its folders there) that `user` could not read."""
    folders = []
    if within is not None:
        folders = [str(p) for p in Path(path).parents if inside(p, within)]
    for folder in reversed(folders):
        if not may(folder, user, 0o5):
            return describe(folder)
    bits = 0o5 if os.path.isdir(path) else 0o4
    return None if may(path, user, bits) else describe(path)


def unreadable_in_tree(folder: str | Path, user: tuple[int, int], limit: int = GIVE_LIMIT) -> str | None:
    """The first entry of `folder` that `user` could not read on its own (a folder it cannot list, a file it
    cannot read), described with its mode; None when all of it is readable. The folders above do not count (a
    run mounts its folders back at their own paths, as `_blocked` judges a check). Links are not followed (a
    copy keeps them as links). Stops after `limit` entries."""
    real = os.path.realpath(folder)
    seen = 0
    for top, dirs, files in os.walk(real):
        if not may(top, user, 0o5):
            return describe(top)
        dirs[:] = [d for d in dirs if d not in NOT_GIVEN and not os.path.islink(os.path.join(top, d))]
        for name in files:
            path = os.path.join(top, name)
            seen += 1
            if seen > limit:
                return None
            if not os.path.islink(path) and not may(path, user, 0o4):
                return describe(path)
    return None


# --- views made by copying (no overlayfs, or no mount namespace) ------------------------------------------


class ViewTooBig(OSError):
    """A folder too big to copy for a view (the overlay needs no copy; this is the fallback's limit)."""


def copy_view(folder: str, copy: Path, user: tuple[int, int] | None, reveal: bool) -> dict:
    """Copies `folder` into `copy` (links kept as links; a file over COPY_LINK_BYTES, a dataset, becomes a link
    to itself, readable, not writable by the sandbox user) and gives it to `user` (what it may read, or all of it
    when `reveal`); what it holds, to find the run's writes afterwards. ViewTooBig past GIVE_LIMIT entries."""
    entries = 0

    def ignore(directory: str, names: list[str]) -> list[str]:
        nonlocal entries
        entries += len(names)
        if entries > GIVE_LIMIT:
            raise ViewTooBig(f"{folder} has more than {GIVE_LIMIT} entries: too many to copy for a view")
        return [name for name in names if name in NOT_GIVEN]

    def copy_file(source: str, target: str) -> None:
        if os.path.getsize(source) > COPY_LINK_BYTES:
            os.symlink(os.path.abspath(source), target)
        else:
            shutil.copy2(source, target)

    try:
        shutil.copytree(folder, copy, symlinks=True, ignore=ignore, copy_function=copy_file)
    except ViewTooBig:
        shutil.rmtree(copy, ignore_errors=True)
        raise
    if user is not None:
        give(copy, user, reveal)
    return snapshot(copy)


def give(folder: Path, user: tuple[int, int], reveal: bool) -> None:
    """Makes the sandbox user own `folder`'s entries: those it could read, or every one when `reveal`."""
    for root, dirs, files in os.walk(folder):
        info = os.lstat(root)
        if not (reveal or may_stat(info, user, 0o5)):
            dirs[:] = []
            continue
        os.chown(root, *user, follow_symlinks=False)
        for name in files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and (reveal or may_stat(info, user, 0o4)):
                os.chown(path, *user, follow_symlinks=False)


def snapshot(folder: Path) -> dict:
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            found[os.path.relpath(path, folder)] = (info.st_size, info.st_mtime_ns)
    return found


def view_outputs(view: View) -> tuple[list[tuple[str, int]], list[str]]:
    """(files the run wrote: path relative to the view's folder and size, paths it removed)."""
    written, removed = [], []
    if view.kind == "overlay":
        for root, _, files in os.walk(view.store):
            for name in files:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, view.store)
                info = os.lstat(path)
                if stat.S_ISCHR(info.st_mode) and info.st_rdev == OVERLAY_WHITEOUT:
                    removed.append(rel)
                elif stat.S_ISREG(info.st_mode) and not _metacopy(path):
                    written.append((rel, info.st_size))
        return sorted(written), sorted(removed)
    after = snapshot(Path(view.store))
    written = [(rel, size) for rel, (size, mtime) in after.items() if (view.before or {}).get(rel) != (size, mtime)]
    removed = [rel for rel in (view.before or {}) if rel not in after]
    return sorted(written), sorted(removed)


def _metacopy(path: str) -> bool:
    try:
        os.getxattr(path, METACOPY_XATTR, follow_symlinks=False)
        return True
    except OSError:
        return False
