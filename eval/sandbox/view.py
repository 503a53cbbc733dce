"""What the child sees: the plan that eval/sandbox/init.py carries out inside the new namespaces.

/tmp, /var/tmp, /dev/shm and /run/lock become empty private tmpfs; a folder the sandbox user could not
traverse (a 0700 /root) is covered the same way. The folders the run needs (the interpreter, the import
path, the command's files, the handed-over folders) are mounted back at their own paths, and nothing else.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

INIT = Path(__file__).with_name("init.py")
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where `xlaport` is imported from


def namespace_argv(user: tuple[int, int], needed: list[str], status_fd: int, argv: list[str]) -> list[str]:
    plan = {"uid": user[0], "gid": user[1], "cover": covers(needed, user), "status_fd": status_fd, "argv": argv}
    init = [sys.executable, "-I", "-S", str(INIT), json.dumps(plan)]
    return ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--", *init]


def needed_paths(cwd: Path, argv: list[str], handed: list[Path]) -> list[str]:
    """Folders the child must see: the interpreter, the import path, the command's files, the handed-over ones."""
    paths = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)), str(cwd)]
    paths += [p for p in sys.path if p and os.path.isdir(p)] + [str(p) for p in handed]
    paths += [os.path.dirname(a) for a in argv if os.path.isabs(a) and os.path.isfile(a)]
    paths.append(str(PACKAGE_ROOT))
    return sorted({os.path.realpath(p) for p in paths})


def covers(needed: list[str], user: tuple[int, int]) -> list[list]:
    """[folder, mode, kept paths] for each private tmp folder and each folder `user` cannot traverse."""
    modes = {d: 0o1777 for d in PRIVATE_DIRS if os.path.isdir(d) and not os.path.islink(d)}
    for path in needed:
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            folder = str(Path(*parts[:depth]))
            if not any(folder == d or folder.startswith(d + "/") for d in modes) and not may(folder, user, 0o1):
                modes[folder] = 0o755
                break
    plan = []
    for folder in sorted(modes, key=lambda d: d.count("/")):
        kept = [p for p in needed if p.startswith(folder + "/")]
        kept = [p for p in kept if not any(p.startswith(q + "/") for q in kept)]  # the outermost only
        plan.append([folder, modes[folder], kept])
    return plan


def may(path: str, user: tuple[int, int], bits: int) -> bool:
    """Whether `user` has permission `bits` (0o4 read, 0o2 write, 0o1 search) on `path` by its mode."""
    info = os.stat(path)
    shift = 6 if info.st_uid == user[0] else 3 if info.st_gid == user[1] else 0
    return user[0] == 0 or (info.st_mode >> shift) & bits == bits


def unreachable(cwd: Path, argv: list[str], readable, user: tuple[int, int]) -> str | None:
    """The first of the command's own files and folders that `user` could not use (ancestors are made reachable)."""
    checks = [(str(cwd), 0o7)] + [(str(p), 0o5 if os.path.isdir(p) else 0o4) for p in readable]
    checks += [(a, 0o4) for a in argv if os.path.isabs(a) and os.path.isfile(a)]
    checks += [(os.path.dirname(a), 0o5) for a in argv if os.path.isabs(a) and os.path.isfile(a)]
    for path, bits in checks:
        if not may(path, user, bits):
            mode = stat.filemode(os.stat(path).st_mode)
            return f"{path} ({mode} uid {os.stat(path).st_uid})"
    return None
