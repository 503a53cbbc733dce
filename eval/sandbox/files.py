"""Folders handed to the sandboxed child and files read back from it."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .mechanisms import SANDBOX_USER

# xlaport-KIND-PID.START-random: the process that made it and its start time (PIDs are reused)
SCRATCH_NAME = re.compile(r"^xlaport-[a-z]+(?:-[a-z]+)*-(\d+)\.(\d+)-")


def hand_over(folder: Path, user: tuple[int, int]) -> None:
    """Gives the caller's scratch folder, recursively, to the sandbox user (links are not followed)."""
    for root, dirs, files in os.walk(folder):
        os.chown(root, *user, follow_symlinks=False)
        for name in dirs + files:
            os.chown(os.path.join(root, name), *user, follow_symlinks=False)


def read_child_file(path: Path, limit_bytes: int | None = 64 * 2**20) -> bytes | None:
    """A file the sandboxed child wrote, read after the run (nothing of it is left alive then): None unless it is a
    regular file, since the child owns its folders and could have left a link (to a file only root may read) or
    a FIFO (the read would never end) there. Only the last `limit_bytes` are read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        if limit_bytes is not None and size > limit_bytes:
            handle.seek(size - limit_bytes)
        return handle.read()


def readable_scratch(prefix: str) -> tempfile.TemporaryDirectory:
    """A temporary folder for submitted code that the sandbox user may read and nobody else may: 0700, owned by
    the sandbox user when this process is root (root writes into it all the same; other local users must not read
    the copies of projects sent over HTTP or MCP while they run), else by this user, who is then the child too."""
    folder = scratch(prefix)
    os.chmod(folder.name, 0o700)
    user = _sandbox_user()
    if user is not None:
        os.chown(folder.name, *user)
    return folder


def _sandbox_user() -> tuple[int, int] | None:
    """The sandbox user's uid and gid when this process is root and the user exists."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SANDBOX_USER)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def scratch(prefix: str, avoid: Sequence[Path | str] = ()) -> tempfile.TemporaryDirectory:
    """A temporary folder named after this process (`prefix` is `xlaport-KIND-`), outside every folder of `avoid`
    (a view's own folder cannot hold its scratch). Folders left by xlaport processes that were killed before
    they could remove theirs are removed first."""
    bases = [tempfile.gettempdir(), "/var/tmp", "/dev/shm", os.path.expanduser("~/.cache")]
    base = next(
        (b for b in bases if os.path.isdir(b) and not any(_inside(os.path.realpath(b), str(a)) for a in avoid)), None
    )
    if base is None:
        raise OSError(f"no folder for the run's scratch outside {', '.join(map(str, avoid))}")
    remove_stale_scratch(Path(base))
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}.{_start_time(os.getpid())}-", dir=base)


def remove_stale_scratch(base: Path) -> list[Path]:
    """Removes xlaport scratch folders in `base` whose process is gone (killed: SIGKILL runs no clean-up)."""
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = SCRATCH_NAME.match(entry.name)
        if not match or not entry.is_dir(follow_symlinks=False):
            continue
        pid, started = int(match.group(1)), int(match.group(2))
        if _start_time(pid) == started:
            continue  # its process still runs
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), None when there is no such process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
