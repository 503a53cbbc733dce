"""Which sandbox mechanisms this machine allows: probed once per process, stated with every run."""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .cgroups import own_v1, own_v2, v1_path, v2_path
from .view import View, namespace_argv

SANDBOX_USER = "nobody"


@dataclass(frozen=True)
class Mechanisms:
    memory_cgroup: str | None  # folder under which a run's memory cgroup is made (v2: its one cgroup)
    pids_cgroup: str | None
    namespaces: bool  # PID, mount and network namespaces through `unshare`
    user: tuple[int, int] | None  # uid, gid to run as
    refused: tuple[str, ...]  # one line per mechanism that is not available, with the reason
    cgroup_version: int = 1
    overlay: bool = False  # views of the user's folders through overlayfs (else copies)
    no_userns: bool = False  # the command cannot make user namespaces

    @property
    def sandboxed(self) -> bool:
        return not self.refused

    def to_dict(self) -> dict:
        return {"sandboxed": self.sandboxed, "guarantees": list(self.guarantees()), "refused": list(self.refused)}

    def guarantees(self, dropped: bool = True) -> list[str]:
        held = ["minimal environment (allowlist; the server's secrets never reach the child)"]
        if self.memory_cgroup and (self.pids_cgroup or self.cgroup_version == 2):
            held.append("every descendant, detached ones included, is tracked by cgroup and killed at the end")
            limits = "memory and task limits cover" if self.pids_cgroup else "the memory limit covers"
            held.append(f"{limits} the whole process tree (cgroup v{self.cgroup_version})")
        if self.namespaces:
            held.append("PID namespace: all descendants die with the command")
            held.append("no network (own network namespace, own loopback only)")
            held.append("private /tmp, /var/tmp, /dev/shm; folders the sandbox user cannot traverse stay hidden")
        if self.no_userns:
            held.append("no user namespaces inside (limit 0 in the command's own user namespace)")
        if self.user and dropped:
            held.append(
                f"runs as {SANDBOX_USER} (uid {self.user[0]}), no_new_privs; the user's folders are private "
                f"{'overlay views' if self.overlay else 'copies'}: the run never writes them"
            )
        held.append("rlimits: file size, CPU time, processes, no core dumps")
        return held


@functools.cache
def sandbox_status() -> Mechanisms:
    """Probes each mechanism once per process."""
    refused = []
    version = 1
    memory, pids = own_v1("memory"), own_v1("pids")
    if v2_path() is not None:
        version = 2
        memory, why = own_v2()
        pids = memory if why is None else None  # a group with memory alone: tasks by RLIMIT_NPROC
        if why:
            refused.append(why if memory else f"{why}: memory is limited by polling, descendants may escape it")
    else:
        if not memory:
            refused.append("memory cgroup (v1) not writable: memory is limited by polling, descendants may escape it")
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
            refused.append(f"no user {SANDBOX_USER}: the child would run as root")
    namespaces = overlay = no_userns = False
    if shutil.which("unshare") is None:
        refused.append(
            "no `unshare`: no PID or network namespace (network reachable, detached children tracked by cgroup only)"
        )
    else:
        namespaces, no_userns, overlay, why = _probe_namespaces(user or (os.geteuid(), os.getegid()))
        refused += why
    return Mechanisms(memory, pids, namespaces, user, tuple(refused), version, overlay, no_userns)


def _probe_namespaces(user: tuple[int, int]) -> tuple[bool, bool, bool, list[str]]:
    """(namespaces, no user namespaces inside, overlay views, refusals): the init runs `true` with each."""

    def attempt(no_userns: bool, with_view: bool) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="xlaport-probe-") as tmp:
            views = []
            if with_view:
                folder, upper, work = (Path(tmp, name) for name in ("folder", "upper", "work"))
                for path in (folder, upper, work):
                    path.mkdir()
                views = [View(str(folder), "overlay", str(upper), str(work))]
            argv = namespace_argv(user, [], -1, ["true"], views, userns=no_userns)
            return subprocess.run(argv, capture_output=True, text=True, timeout=30, pass_fds=())

    full = attempt(True, True)
    if full.returncode == 0:
        return True, True, True, []
    bare = attempt(False, False)
    if bare.returncode != 0:
        why = f"`unshare` refused ({bare.stderr.strip()[-200:]}): network reachable, no PID namespace"
        return False, False, False, [why]
    refused = []
    no_userns = attempt(True, False).returncode == 0
    if not no_userns:
        refused.append("user namespaces stay available to the command (cannot limit them in its own)")
    overlay = attempt(False, True).returncode == 0
    if not overlay:  # not a gap: the views are copies then
        pass
    return True, no_userns, overlay, refused


def host_memory_mb() -> int:
    """RAM of this machine, or the memory limit of the cgroup xlaport runs in when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    v2 = v2_path()
    v1 = v1_path("memory")
    limit = (v2 / "memory.max") if v2 else Path(v1, "memory.limit_in_bytes") if v1 else None
    if limit is not None:
        try:
            total = min(total, int(limit.read_text()))
        except (OSError, ValueError):
            pass  # "max" (v2) or no such file
    return total // 2**20
