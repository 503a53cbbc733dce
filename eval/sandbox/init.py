"""PID 1 of a sandboxed run: prepares the new namespaces as root, then runs the command as the sandbox user.

run.py starts it as `unshare -p -f --kill-child --mount-proc -n -- python -I -S init.py PLAN` (PLAN from view.py),
so this process is the init of a fresh PID, mount and network namespace. PLAN is JSON:
{"uid", "gid", "views": [{folder, kind, store, work, first}], "reveal", "not_given", "give_limit",
"cover": [[folder, mode, [kept paths]]], "status_fd", "no_userns", "cwd", "argv"}. It then
- brings up the namespace's own loopback (the host's, and the server on it, stay out of reach);
- mounts each view over its folder (an overlay whose writes land in `store`, or the copy in `store`) and gives
  the overlay's entries to uid/gid (see `give`): the user's folder itself is never written;
- covers each `cover` folder with an empty tmpfs (private /tmp, /var/tmp, /dev/shm; folders the sandbox user
  could not traverse, like a 0700 /root) and mounts the kept paths back at the same place, so the child sees
  what it needs and nothing else there;
- forks the command as uid/gid with no supplementary groups and no_new_privs (setuid binaries cannot regain
  root), in a user namespace of its own whose limit of user namespaces is 0 (`no_userns`: the command cannot
  make one, so no namespace tricks inside the sandbox; see `confine_user_namespaces`), reaps every orphan,
  and when the command ends writes its wait status to `status_fd` and exits.
  The kernel then kills whatever is left in the namespace.
Only the standard library: it runs before anything of the user's.
"""

import ctypes
import fcntl
import json
import os
import socket
import stat
import struct
import sys

AT_FDCWD = -100
SYS_OPEN_TREE = 428  # the same number on x86_64 and arm64
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
PR_SET_NO_NEW_PRIVS = 38
MS_BIND, MS_REC = 0x1000, 0x4000
CLONE_NEWUSER = 0x10000000
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


def overlay_option(path: str) -> str:
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def mount_view(view: dict) -> None:
    folder = view["folder"].encode()
    if view["kind"] == "overlay":
        options = ",".join(
            [
                "lowerdir=" + overlay_option(view["folder"]),
                "upperdir=" + overlay_option(view["store"]),
                "workdir=" + overlay_option(view["work"]),
                "metacopy=on",  # giving a file to the sandbox user copies its owner up, not its data
            ]
        )
        _check(libc.mount(b"overlay", folder, b"overlay", 0, options.encode()), f"overlay on {view['folder']}")
    else:
        _check(libc.mount(view["store"].encode(), folder, None, MS_BIND | MS_REC, None), f"copy on {view['folder']}")


def may(info: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    shift = 6 if info.st_uid == uid else 3 if info.st_gid == gid else 0
    return (info.st_mode >> shift) & bits == bits


def give(view: dict, uid: int, gid: int, reveal: bool, not_given: list[str], budget: int) -> int:
    """Makes uid/gid own the overlay's folders and files (their working folder first), so the command can write
    there as it would in its own project; with `reveal` also what it could not read before. Returns what is
    left of `budget`: a huge tree is given only in part (the rest stays readable where its modes allow)."""
    first = view["first"] or view["folder"]
    for top in dict.fromkeys([first, view["folder"]]):
        for root, dirs, files in os.walk(top):
            if top != first and (root == first or root.startswith(first + "/")):
                dirs[:] = []
                continue
            info = os.lstat(root)
            if not (reveal or may(info, uid, gid, 0o5)):
                dirs[:] = []
                continue
            dirs[:] = [d for d in dirs if d not in not_given]
            if budget <= 0:
                return 0
            os.chown(root, uid, gid, follow_symlinks=False)
            budget -= 1
            for name in files:
                path = os.path.join(root, name)
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode) and (reveal or may(info, uid, gid, 0o4)) and budget > 0:
                    os.chown(path, uid, gid, follow_symlinks=False)
                    budget -= 1
    return budget


def confine_user_namespaces(uid: int, gid: int, ready_r: int, mapped_w: int) -> None:
    """In the forked command, still root: a user namespace of its own in which the limit of user namespaces is
    0, so neither the command nor its descendants can make one (a user namespace would give them the
    capabilities the sandbox takes away). The init, outside it, maps root and uid/gid into it (ids keep their
    host values); then the limit is written from inside, where this process is still its root."""
    _check(libc.unshare(CLONE_NEWUSER), "user namespace")
    os.write(mapped_w, b"u")
    if os.read(ready_r, 1) != b"m":
        raise OSError(0, "the init could not map the ids into the user namespace")
    with open("/proc/sys/user/max_user_namespaces", "w") as limit:
        limit.write("0")


def map_ids(child: int, uid: int, gid: int) -> None:
    for name, other in (("uid_map", uid), ("gid_map", gid)):
        with open(f"/proc/{child}/{name}", "w") as ids:
            ids.write(f"0 0 1\n{other} {other} 1\n" if other != 0 else "0 0 1\n")


def main() -> None:
    plan = json.loads(sys.argv[1])
    status_fd = plan["status_fd"]  # -1 when nobody reads the status (the start-up probe)
    if status_fd >= 0:
        os.set_inheritable(status_fd, False)
    loopback_up()
    budget = plan["give_limit"]
    for view in plan["views"]:
        mount_view(view)
        if view["kind"] == "overlay" and plan["uid"] != 0:
            budget = give(view, plan["uid"], plan["gid"], plan["reveal"], plan["not_given"], budget)
    if budget <= 0:
        print("xlaport sandbox: the views are too big to give whole to the sandbox user", file=sys.stderr)
    for folder, mode, kept in plan["cover"]:
        cover(folder, mode, kept)
    os.chdir(plan["cwd"])  # after the mounts: a working folder inside a view must be the view's, not below it
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(to_child_w)
            os.close(from_child_r)
            if plan["no_userns"]:
                confine_user_namespaces(plan["uid"], plan["gid"], to_child_r, from_child_w)
            os.close(to_child_r)
            os.close(from_child_w)
            os.setgroups([])
            os.setgid(plan["gid"])
            os.setuid(plan["uid"])
            _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            os.execvp(plan["argv"][0], plan["argv"])
        except OSError as error:
            print(f"xlaport sandbox: cannot start {plan['argv'][0]}: {error}", file=sys.stderr, flush=True)
        os._exit(127)
    os.close(to_child_r)
    os.close(from_child_w)
    if plan["no_userns"] and os.read(from_child_r, 1) == b"u":
        try:
            map_ids(child, plan["uid"], plan["gid"])
            os.write(to_child_w, b"m")
        except OSError as error:
            print(f"xlaport sandbox: cannot map ids: {error}", file=sys.stderr, flush=True)
    os.close(to_child_w)
    os.close(from_child_r)
    while True:  # PID 1 adopts every orphan: reap them all until the command itself ends
        pid, status = os.wait()
        if pid == child:
            if status_fd >= 0:
                os.write(status_fd, f"{status}\n".encode())
            os._exit(0)


if __name__ == "__main__":
    main()
