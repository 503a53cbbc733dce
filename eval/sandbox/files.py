"""Folders handed to the sandboxed child and files read back from it."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


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
    """A temporary folder for submitted code that the sandbox user may read (0755; in the sandbox /tmp is private)."""
    scratch = tempfile.TemporaryDirectory(prefix=prefix)
    os.chmod(scratch.name, 0o755)
    return scratch
