"""Which sandbox mechanisms this machine allows: probed once per process, stated with every run."""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .view import namespace_argv

SANDBOX_USER = "nobody"


@dataclass(frozen=True)
class Mechanisms:
    memory_cgroup: str | None  # folder under which a run's memory cgroup is made
    pids_cgroup: str | None
    namespaces: bool  # PID, mount and network namespaces through `unshare`
    user: tuple[int, int] | None  # uid, gid to run as
    refused: tuple[str, ...]  # one line per mechanism that is not available, with the reason

    @property
    def sandboxed(self) -> bool:
        return not self.refused

    def to_dict(self) -> dict:
        return {"sandboxed": self.sandboxed, "guarantees": list(self.guarantees()), "refused": list(self.refused)}

    def guarantees(self, dropped: bool = True) -> list[str]:
        held = ["minimal environment (allowlist; the server's secrets never reach the child)"]
        if self.memory_cgroup and self.pids_cgroup:
            held.append("every descendant, detached ones included, is tracked by cgroup and killed at the end")
            held.append("memory and task limits cover the whole process tree (cgroup v1)")
        if self.namespaces:
            held.append("PID namespace: all descendants die with the command")
            held.append("no network (own network namespace, own loopback only)")
            held.append("private /tmp, /var/tmp, /dev/shm; folders the sandbox user cannot traverse stay hidden")
        if self.user and dropped:
            held.append(f"runs as {SANDBOX_USER} (uid {self.user[0]}), no_new_privs: writes only where handed over")
        held.append("rlimits: file size, CPU time, processes, no core dumps")
        return held


def own_cgroup(controller: str) -> str | None:
    """The folder of this process's cgroup for a v1 controller, where a child group can be made."""
    folder = cgroup_path(controller)
    if folder is None:
        return None
    _remove_stale(Path(folder))
    probe = Path(folder, f"xlaport-probe-{os.getpid()}")
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return folder


def _remove_stale(folder: Path) -> None:
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


@functools.cache
def sandbox_status() -> Mechanisms:
    """Probes each mechanism once per process."""
    refused = []
    memory, pids = own_cgroup("memory"), own_cgroup("pids")
    if not memory:
        refused.append("memory cgroup (v1) not writable: memory is limited by polling RSS, descendants may escape it")
    if not pids:
        refused.append("pids cgroup (v1) not writable: tasks are limited by RLIMIT_NPROC only")
    user = None
    if os.geteuid() != 0:
        refused.append(f"not root: the child runs as this user (uid {os.geteuid()}), not as {SANDBOX_USER}")
    else:
        try:
            entry = pwd.getpwnam(SANDBOX_USER)
            user = (entry.pw_uid, entry.pw_gid)
        except KeyError:
            refused.append(f"no user {SANDBOX_USER}: the child runs as root")
    namespaces = False
    if shutil.which("unshare") is None:
        refused.append(
            "no `unshare`: no PID or network namespace (network reachable, detached children tracked by cgroup only)"
        )
    else:
        probe = namespace_argv(user or (os.geteuid(), os.getegid()), [], -1, ["true"])
        run = subprocess.run(probe, capture_output=True, text=True, timeout=30, pass_fds=())
        namespaces = run.returncode == 0
        if not namespaces:
            refused.append(f"`unshare` refused ({run.stderr.strip()[-200:]}): network reachable, no PID namespace")
    return Mechanisms(memory, pids, namespaces, user, tuple(refused))


def host_memory_mb() -> int:
    """RAM of this machine, or the memory limit of the cgroup xlaport runs in when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    folder = cgroup_path("memory")
    if folder:
        try:
            total = min(total, int(Path(folder, "memory.limit_in_bytes").read_text()))
        except (OSError, ValueError):
            pass
    return total // 2**20


def cgroup_path(controller: str) -> str | None:
    """The folder of this process's cgroup for a v1 controller, or None (no such hierarchy mounted)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            folder = Path("/sys/fs/cgroup", controller) / path.lstrip("/")
            return str(folder) if folder.is_dir() else None
    return None
