"""Runs user code in a child process that cannot outlive, outgrow or see past its run.

User code is never imported into xlaport's process. What holds is checked at run time (`sandbox_status`) and
said with every result; where Linux refuses a mechanism the run goes on with a weaker one and is not called
sandboxed. With all mechanisms (root, cgroup v1, `unshare`):
- every descendant, detached ones included (setsid, double fork), is in the run's memory and pids cgroups and
  in its PID namespace: when the command ends, or on time-out or memory limit, all are killed and the cgroup is
  verified empty (`survivors` lists any that were not);
- memory: the cgroup's limit (v1, or v2 where /sys/fs/cgroup is v2) covers the whole tree (the kernel's OOM
  killer acts, then the run is ended); the peak is the tree's anonymous + shared memory with each page once,
  polled, at least the cgroup's high-water mark on a memory kill; tasks (processes + threads) are capped by
  the pids cgroup;
- no network: a network namespace with only its own loopback;
- user `nobody` with no supplementary groups and no_new_privs, in a user namespace of its own that may make no
  other (N16); a minimal environment (allowlist, never the server's secrets); private /tmp, /var/tmp, /dev/shm,
  /run/lock; folders nobody cannot traverse (a 0700 /root) are hidden except what the run needs; writes are
  possible only in the folders handed over (`writable`), in *views* of the user's folders (`views`, the working
  directory: overlays whose writes land in the run's scratch, so the user's files never change) and where the
  machine lets any user write;
- never root by surprise: what nobody cannot read is shown through a view when the caller may (`reveal`), else
  refused (`SandboxRefused`) unless `allow_unsandboxed`;
- rlimits: file size, CPU time, core dumps off, processes of the sandbox user.
The memory limit is not an address-space rlimit: torch reserves large virtual ranges.

Parts: mechanisms.py (what this machine allows), cgroups.py (v1 and v2 groups), view.py (what the child sees),
init.py (PID 1 inside the namespaces), files.py (scratch folders, folders handed over, files read back), run.py
(`run_sandboxed`).
"""

from pathlib import Path

from .files import read_child_file, readable_scratch, scratch
from .mechanisms import SANDBOX_USER, Mechanisms, host_memory_mb, sandbox_status
from .run import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, SandboxRefused, SandboxResult, python_argv, run_sandboxed
from .view import project_root, unreadable, unreadable_in_tree


def hidden_from_sandbox(folder: Path) -> str | None:
    """What of `folder` the sandbox user could not read on its own (None when it runs as the caller's user).
    A run for a server's client must refuse such a tree: copied into a run's scratch it would be readable."""
    user = sandbox_status().user
    return unreadable_in_tree(folder, user) if user else None


def file_hidden_from_sandbox(path: Path, within: Path) -> str | None:
    """`path`, or a folder between `within` and it, when the sandbox user could not read it on its own (None when
    runs are the caller's user): a server's client is shown no more than that user could read."""
    user = sandbox_status().user
    return unreadable(str(path), user, str(within)) if user else None


__all__ = [
    "DEFAULT_MEMORY_MB",
    "DEFAULT_TIMEOUT_S",
    "SANDBOX_USER",
    "Mechanisms",
    "SandboxRefused",
    "SandboxResult",
    "file_hidden_from_sandbox",
    "hidden_from_sandbox",
    "host_memory_mb",
    "project_root",
    "python_argv",
    "read_child_file",
    "readable_scratch",
    "run_sandboxed",
    "sandbox_status",
    "scratch",
]
