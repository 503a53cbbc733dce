"""PID 1 of a sandboxed run: prepares the new namespaces as root, then runs the command as the sandbox user.

run.py starts it as `unshare -p -f --kill-child --mount-proc -n -- python -I -S init.py PLAN` (PLAN from view.py),
so this process is the init of a fresh PID, mount and network namespace. PLAN is JSON:
{"uid", "gid", "cover": [[folder, mode, [kept paths]]], "status_fd", "argv"}. It then
- brings up the namespace's own loopback (the host's, and the server on it, stay out of reach);
- covers each `cover` folder with an empty tmpfs (private /tmp, /var/tmp, /dev/shm; folders the sandbox user
  could not traverse, like a 0700 /root) and mounts the kept paths back at the same place, so the child sees
  what it needs and nothing else there;
- forks the command as uid/gid with no supplementary groups and no_new_privs (setuid binaries cannot regain
  root), reaps every orphan, and when the command ends writes its wait status to `status_fd` and exits.
  The kernel then kills whatever is left in the namespace.
Only the standard library: it runs before anything of the user's.
"""

import ctypes
import fcntl
import json
import os
import socket
import struct
import sys

AT_FDCWD = -100
SYS_OPEN_TREE = 428  # the same number on x86_64 and arm64
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
PR_SET_NO_NEW_PRIVS = 38
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
TMPFS_SIZE = "size=50%"  # of RAM at most; what is written there is charged to the run's memory cgroup

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request + b"\0" * 22)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP) + b"\0" * 22)


def cover(folder: str, mode: int, kept: list[str]) -> None:
    """An empty tmpfs over `folder`, with each kept path (a folder below it) mounted back at its place."""
    clones = []
    for path in kept:
        flags = OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC
        clones.append((path, _check(libc.syscall(SYS_OPEN_TREE, AT_FDCWD, path.encode(), flags), f"clone {path}")))
    options = f"mode={mode:o},{TMPFS_SIZE}".encode()
    _check(libc.mount(b"tmpfs", folder.encode(), b"tmpfs", 0, options), f"tmpfs on {folder}")
    for path, tree in clones:
        os.makedirs(path, mode=0o755, exist_ok=True)
        move = libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, path.encode(), MOVE_MOUNT_F_EMPTY_PATH)
        _check(move, f"mount back {path}")
        os.close(tree)


def main() -> None:
    plan = json.loads(sys.argv[1])
    status_fd = plan["status_fd"]  # -1 when nobody reads the status (the start-up probe)
    if status_fd >= 0:
        os.set_inheritable(status_fd, False)
    loopback_up()
    for folder, mode, kept in plan["cover"]:
        cover(folder, mode, kept)
    child = os.fork()
    if child == 0:
        try:
            os.setgroups([])
            os.setgid(plan["gid"])
            os.setuid(plan["uid"])
            _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            os.execvp(plan["argv"][0], plan["argv"])
        except OSError as error:
            print(f"xlaport sandbox: cannot start {plan['argv'][0]}: {error}", file=sys.stderr, flush=True)
        os._exit(127)
    while True:  # PID 1 adopts every orphan: reap them all until the command itself ends
        pid, status = os.wait()
        if pid == child:
            if status_fd >= 0:
                os.write(status_fd, f"{status}\n".encode())
            os._exit(0)


if __name__ == "__main__":
    main()
