"""The run's own cgroups, under xlaport's: cgroup v1 (a memory and a pids group) or cgroup v2 (one group).

Either way a group holds every descendant of the command, detached ones included; its limits cover them all
and it is checked empty at the end. Memory is the group's anonymous and shared memory (each page once, however
many processes map it; file pages, the interpreter's libraries and the data read, are the kernel's
reclaimable cache and are not counted), which is what the limit holds in check.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

V2_ROOT = Path("/sys/fs/cgroup")
V2_CONTROLLERS = ("memory", "pids")


def own_v1(controller: str) -> str | None:
    """The folder of this process's cgroup for a v1 controller, if a child group can be made there."""
    folder = v1_path(controller)
    if folder is None:
        return None
    remove_stale(Path(folder))
    return folder if _can_make_child(Path(folder)) else None


def v1_path(controller: str) -> str | None:
    """The folder of this process's cgroup for a v1 controller, or None (no such hierarchy mounted)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            folder = Path("/sys/fs/cgroup", controller) / path.lstrip("/")
            return str(folder) if folder.is_dir() else None
    return None


def v2_path(root: Path = V2_ROOT) -> Path | None:
    """This process's cgroup on a pure v2 machine (`/sys/fs/cgroup/cgroup.controllers` exists), else None."""
    if not (root / "cgroup.controllers").is_file():
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return root / line[3:].lstrip("/")
    return None


def own_v2(root: Path = V2_ROOT) -> tuple[str | None, str | None]:
    """(folder under which v2 run groups are made, None), (that folder, what is missing: a group with the memory
    controller alone, where tasks are not limited by the group) or (None, why not). The controllers must be on for
    the folder's children; v2 allows that only in a group with no process of its own, so when xlaport sits in its
    group alone it moves itself into a leaf below it first (as a container's init does)."""
    folder = v2_path(root)
    if folder is None:
        return None, "no cgroup v2 hierarchy at /sys/fs/cgroup"
    available = (folder / "cgroup.controllers").read_text().split()
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if "memory" in missing:
        return None, f"cgroup v2: controllers {', '.join(missing)} not delegated to {folder}"
    # a host may delegate memory and not pids (seen: a Firecracker VM's command group): the memory limit and the
    # group's hold on every descendant are still the kernel's, tasks are capped by RLIMIT_NPROC as without cgroups
    wanted = [c for c in V2_CONTROLLERS if c in available]
    remove_stale(folder)
    if not _enable(folder, wanted):
        leaf = folder / f"xlaport-{os.getpid()}-main"
        try:
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as error:
            return None, f"cgroup v2: cannot move xlaport into a leaf of {folder}: {error.strerror}"
        if not _enable(folder, wanted):
            (folder / "cgroup.procs").write_text(str(os.getpid()))  # back where it was
            leaf.rmdir()
            return None, f"cgroup v2: {folder} holds other processes, so its children cannot get controllers"
    if not _can_make_child(folder):
        return None, f"cgroup v2: {folder} not writable"
    if missing:
        why = f"cgroup v2: controller pids not delegated to {folder}: tasks are limited by RLIMIT_NPROC only"
        return str(folder), why
    return str(folder), None


def _enable(folder: Path, controllers: list[str]) -> bool:
    enabled = (folder / "cgroup.subtree_control").read_text().split()
    if all(c in enabled for c in controllers):
        return True
    try:
        (folder / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in controllers))
        return True
    except OSError:
        return False


def _can_make_child(folder: Path) -> bool:
    probe = folder / f"xlaport-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def remove_stale(folder: Path) -> None:
    """Empty run cgroups (xlaport-PID-...) of xlaport processes that were killed before they could remove them."""
    for group in folder.glob("xlaport-*-*"):
        try:
            os.kill(int(group.name.split("-")[1]), 0)
        except ProcessLookupError:
            try:
                group.rmdir()
            except OSError:
                pass  # not empty: something still runs in it
        except (ValueError, PermissionError):
            continue


def run_group_name() -> str:
    return f"xlaport-{os.getpid()}-{time.monotonic_ns()}"


class CgroupsV1:
    """The run's memory and pids cgroups (v1), children of xlaport's own."""

    version = 1
    limits_tasks = True

    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders

    @classmethod
    def make(cls, memory_parent: str, pids_parent: str, memory_mb: int, max_tasks: int) -> CgroupsV1:
        name = run_group_name()
        memory, pids = Path(memory_parent, name), Path(pids_parent, name)
        memory.mkdir()
        pids.mkdir()
        (memory / "memory.limit_in_bytes").write_text(str(memory_mb * 2**20))
        swap = memory / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(memory_mb * 2**20))
        (pids / "pids.max").write_text(str(max_tasks))
        return cls([memory, pids])

    def join(self) -> None:
        """Moves the calling process in (from the forked child: plain system calls, no Python-level locks)."""
        for folder in self.folders:
            _write_pid(folder)

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in self.folders:
            found.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        return sorted(found)

    def oom_kills(self) -> int:
        return _stat(self.folders[0] / "memory.oom_control").get("oom_kill", 0)

    def memory_mb(self) -> float:
        """Anonymous + shared memory of the group now (each page once)."""
        stats = _stat(self.folders[0] / "memory.stat")
        return (stats.get("total_rss", 0) + stats.get("total_shmem", 0)) / 2**20

    def peak_mb(self) -> float:
        """The group's high-water mark (page cache included: meaningful when the limit was hit)."""
        return int((self.folders[0] / "memory.max_usage_in_bytes").read_text()) / 2**20

    def kill(self) -> None:
        """v1 has no kill switch: the caller signals each PID."""

    def remove(self) -> None:
        for folder in self.folders:
            try:
                folder.rmdir()
            except OSError:
                pass  # a survivor still in it: it was reported


class CgroupsV2:
    """The run's cgroup (v2), a child of xlaport's own: memory.max, memory.swap.max, pids.max, cgroup.kill."""

    version = 2

    def __init__(self, folder: Path, limits_tasks: bool = True) -> None:
        self.folder = folder
        self.folders = [folder]
        self.limits_tasks = limits_tasks

    @classmethod
    def make(cls, parent: str, memory_mb: int, max_tasks: int | None) -> CgroupsV2:
        """The run's group; `max_tasks` None where the pids controller is not delegated (no pids.max)."""
        folder = Path(parent, run_group_name())
        folder.mkdir()
        (folder / "memory.max").write_text(str(memory_mb * 2**20))
        swap = folder / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")  # as v1's memsw limit: the limit is not stretched by swapping out
        if max_tasks is not None:
            (folder / "pids.max").write_text(str(max_tasks))
        return cls(folder, max_tasks is not None)

    def join(self) -> None:
        _write_pid(self.folder)

    def pids(self) -> list[int]:
        return sorted(int(p) for p in (self.folder / "cgroup.procs").read_text().split())

    def oom_kills(self) -> int:
        return _stat(self.folder / "memory.events").get("oom_kill", 0)

    def memory_mb(self) -> float:
        stats = _stat(self.folder / "memory.stat")
        return (stats.get("anon", 0) + stats.get("shmem", 0)) / 2**20

    def peak_mb(self) -> float:
        for name in ("memory.peak", "memory.current"):  # memory.peak since Linux 5.19
            try:
                return int((self.folder / name).read_text()) / 2**20
            except (OSError, ValueError):
                continue
        return 0.0

    def kill(self) -> None:
        """SIGKILL to every process in the group at once (cgroup.kill, Linux 5.14); the caller still sweeps."""
        try:
            (self.folder / "cgroup.kill").write_text("1")
        except OSError:
            pass

    def remove(self) -> None:
        try:
            self.folder.rmdir()
        except OSError:
            pass


def _write_pid(folder: Path) -> None:
    fd = os.open(folder / "cgroup.procs", os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def _stat(path: Path) -> dict[str, int]:
    """`key value` lines (memory.stat, memory.events, memory.oom_control); {} when the file is missing."""
    found = {}
    try:
        text = path.read_text()
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENODEV):
            return {}
        raise
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            found[key] = int(value)
    return found
