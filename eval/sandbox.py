"""Runs user code in a child process that cannot outlive, outgrow or see past its run.

User code is never imported into xlaport's process. What holds is checked at run time (`sandbox_status`) and
said with every result; where Linux refuses a mechanism the run goes on with a weaker one and is not called
sandboxed. With all mechanisms (root, cgroup v1, `unshare`):
- every descendant, detached ones included (setsid, double fork), is in the run's memory and pids cgroups and
  in its PID namespace: when the command ends, or on time-out or memory limit, all are killed and the cgroup is
  verified empty (`survivors` lists any that were not);
- memory: the cgroup's limit covers the whole tree (the kernel's OOM killer acts, then the run is ended); the
  peak is the cgroup's high-water mark; tasks (processes + threads) are capped by the pids cgroup;
- no network: a network namespace with only its own loopback;
- user `nobody` with no supplementary groups and no_new_privs; a minimal environment (allowlist, never the
  server's secrets); private /tmp, /var/tmp, /dev/shm, /run/lock; folders nobody cannot traverse (a 0700
  /root) are hidden except the interpreter's; writes are possible only in the folders handed over (`writable`,
  the working directory) and where the machine lets any user write;
- rlimits: file size, CPU time, core dumps off, processes of the sandbox user.
The memory limit is not an address-space rlimit: torch reserves large virtual ranges.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pwd
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MEMORY_MB = 8192
DEFAULT_MAX_TASKS = 1024  # processes + threads of one run (torch_xla alone starts ~100 threads)
DEFAULT_FILE_SIZE_MB = 4096
OUTPUT_LIMIT_BYTES = 8 * 1024 * 1024  # per stream; the tail is kept
POLL_S = 0.1
SANDBOX_USER = "nobody"
INIT = Path(__file__).with_name("sandbox_init.py")
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
ENV_NAMES = {"PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USE_TORCH_XLA", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}
ENV_PREFIXES = ("LC_", "PJRT_", "XLA_", "TPU_", "PT_XLA_", "TF_CPP_", "PYTHON")


@dataclass
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False
    memory_exceeded: bool = False
    peak_rss_mb: float = 0.0  # whole tree, polled every POLL_S; on a memory kill at least the cgroup's high-water mark
    kill_reason: str | None = None  # "timeout", "memory" or None (ended by itself)
    survivors: list[int] = field(default_factory=list)  # host PIDs still alive after the end (should be none)
    guarantees: list[str] = field(default_factory=list)  # what held for this run
    gaps: list[str] = field(default_factory=list)  # what did not, and why

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.memory_exceeded

    @property
    def sandboxed(self) -> bool:
        return not self.gaps

    def describe_failure(self) -> str | None:
        if self.timed_out:
            return f"timed out after {self.wall_s:.1f} s"
        if self.memory_exceeded:
            return f"killed: memory limit exceeded (peak {self.peak_rss_mb:.0f} MB)"
        if self.returncode != 0:
            tail = (self.stderr or self.stdout).strip().splitlines()[-15:]
            return f"exit code {self.returncode}" + ("\n" + "\n".join(tail) if tail else "")
        return None


# --- what this machine allows ---------------------------------------------------------------------


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


def _own_cgroup(controller: str) -> str | None:
    """The folder of this process's cgroup for a v1 controller, where a child group can be made."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                folder = Path("/sys/fs/cgroup", controller) / path.lstrip("/")
                probe = folder / f"xlaport-probe-{os.getpid()}"
                probe.mkdir()
                probe.rmdir()
                return str(folder)
    except OSError:
        pass
    return None


@functools.cache
def sandbox_status() -> Mechanisms:
    """Probes each mechanism once per process."""
    refused = []
    memory, pids = _own_cgroup("memory"), _own_cgroup("pids")
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
        probe = _namespace_argv(user or (os.geteuid(), os.getegid()), [], -1, ["true"])
        run = subprocess.run(probe, capture_output=True, text=True, timeout=30, pass_fds=())
        namespaces = run.returncode == 0
        if not namespaces:
            refused.append(f"`unshare` refused ({run.stderr.strip()[-200:]}): network reachable, no PID namespace")
    return Mechanisms(memory, pids, namespaces, user, tuple(refused))


def host_memory_mb() -> int:
    """RAM of this machine, or the memory limit of the cgroup xlaport runs in when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    folder = _cgroup_path("memory")
    if folder:
        try:
            total = min(total, int(Path(folder, "memory.limit_in_bytes").read_text()))
        except (OSError, ValueError):
            pass
    return total // 2**20


def _cgroup_path(controller: str) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return str(Path("/sys/fs/cgroup", controller) / path.lstrip("/"))
    return None


# --- the run --------------------------------------------------------------------------------------


def sandbox_env(extra: dict[str, str] | None, home: Path, private_tmp: bool) -> dict[str, str]:
    """The allowlisted part of this process's environment, HOME in the run's private folder, then `extra`."""
    env = {k: v for k, v in os.environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    env.update({"HOME": str(home), "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"})
    if not private_tmp:
        env["TMPDIR"] = str(home)
    env.update(extra or {})
    return env


def run_sandboxed(
    argv: list[str],
    cwd: Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    writable: list[Path] | tuple[Path, ...] = (),
    readable: list[Path] | tuple[Path, ...] = (),
    max_tasks: int = DEFAULT_MAX_TASKS,
    file_size_mb: int = DEFAULT_FILE_SIZE_MB,
) -> SandboxResult:
    """Runs `argv` in the sandbox. `cwd` defaults to a fresh private folder. `writable` folders (the caller's
    scratch, where the child leaves results) are handed over to the sandbox user, recursively. The child sees
    the folders of `cwd`, `writable`, `readable`, `env`'s PYTHONPATH and of absolute file paths in `argv`; of
    /tmp nothing else.
    Where the sandbox user could not use one of them the run stays with xlaport's user, and says so in `gaps`.
    The environment is the allowlist plus `env`."""
    if memory_mb > host_memory_mb():
        raise ValueError(f"memory_mb={memory_mb} is more than this machine has ({host_memory_mb()} MB)")
    mech = sandbox_status()
    gaps = list(mech.refused)
    python_path = (env or {}).get("PYTHONPATH", "")
    readable = [*map(Path, readable), *(Path(p) for p in python_path.split(os.pathsep) if p and os.path.isdir(p))]
    with tempfile.TemporaryDirectory(prefix="xlaport-run-") as own:
        home = Path(own) / "work"
        home.mkdir()
        cwd = Path(cwd) if cwd is not None else home
        handed = [Path(own), *map(Path, writable)]
        user = mech.user
        if user:
            for folder in handed:
                _hand_over(folder, user)
            blocked = _unreachable(cwd, argv, readable, user)
            if blocked:
                gaps.append(f"runs as root: {SANDBOX_USER} cannot reach {blocked}")
                user = None
        run_as = user or (os.geteuid(), os.getegid())
        cgroups = _Cgroups.make(mech, memory_mb, max_tasks)
        status_r, status_w = os.pipe()
        full_argv = argv
        if mech.namespaces:
            full_argv = _namespace_argv(
                run_as, _needed_paths(cwd, argv, [*handed, *map(Path, readable)]), status_w, argv
            )
        start = time.perf_counter()
        proc = subprocess.Popen(
            full_argv,
            cwd=cwd,
            env=sandbox_env(env, home, mech.namespaces),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(status_w,),
            preexec_fn=functools.partial(_child_setup, cgroups, timeout_s, max_tasks, file_size_mb, user is not None),
        )
        os.close(status_w)
        readers = [_Tail(proc.stdout), _Tail(proc.stderr)]
        if stdin is not None:
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
        kill_reason, peak = _watch(proc, cgroups, timeout_s, memory_mb)
        survivors = _kill_all(proc, cgroups)
        for reader in readers:
            reader.join()
        wall_s = time.perf_counter() - start
        returncode = _returncode(proc, status_r, mech.namespaces)
        if kill_reason == "memory" and cgroups:  # a spike between two polls: the cgroup saw it
            peak = max(peak, cgroups.peak_mb())
        if cgroups:
            cgroups.remove()
    if survivors:
        gaps.append(f"processes survived the end of the run: {survivors}")
    return SandboxResult(
        returncode=returncode,
        stdout=readers[0].text(),
        stderr=readers[1].text(),
        wall_s=wall_s,
        timed_out=kill_reason == "timeout",
        memory_exceeded=kill_reason == "memory",
        peak_rss_mb=peak,
        kill_reason=kill_reason,
        survivors=survivors,
        guarantees=mech.guarantees(dropped=user is not None),
        gaps=gaps,
    )


def _namespace_argv(user: tuple[int, int], needed: list[str], status_fd: int, argv: list[str]) -> list[str]:
    plan = {"uid": user[0], "gid": user[1], "cover": _covers(needed, user), "status_fd": status_fd, "argv": argv}
    init = [sys.executable, "-I", "-S", str(INIT), json.dumps(plan)]
    return ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--", *init]


def _needed_paths(cwd: Path, argv: list[str], handed: list[Path]) -> list[str]:
    """Folders the child must see: the interpreter, the import path, the command's files, the handed-over ones."""
    paths = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)), str(cwd)]
    paths += [p for p in sys.path if p and os.path.isdir(p)] + [str(p) for p in handed]
    paths += [os.path.dirname(a) for a in argv if os.path.isabs(a) and os.path.isfile(a)]
    paths.append(str(Path(__file__).resolve().parents[1]))
    return sorted({os.path.realpath(p) for p in paths})


def _covers(needed: list[str], user: tuple[int, int]) -> list[list]:
    """[folder, mode, kept paths] for each private tmp folder and each folder `user` cannot traverse."""
    covers = {d: 0o1777 for d in PRIVATE_DIRS if os.path.isdir(d) and not os.path.islink(d)}
    for path in needed:
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            folder = str(Path(*parts[:depth]))
            if not any(folder.startswith(d + "/") or folder == d for d in covers) and not _may(folder, user, 0o1):
                covers[folder] = 0o755
                break
    plan = []
    for folder in sorted(covers, key=lambda d: d.count("/")):
        kept = [p for p in needed if p.startswith(folder + "/")]
        kept = [p for p in kept if not any(p.startswith(q + "/") for q in kept)]  # the outermost only
        plan.append([folder, covers[folder], kept])
    return plan


def _may(path: str, user: tuple[int, int], bits: int) -> bool:
    """Whether `user` has permission `bits` (0o4 read, 0o2 write, 0o1 search) on `path` by its mode."""
    info = os.stat(path)
    shift = 6 if info.st_uid == user[0] else 3 if info.st_gid == user[1] else 0
    return user[0] == 0 or (info.st_mode >> shift) & bits == bits


def _unreachable(cwd: Path, argv: list[str], readable, user: tuple[int, int]) -> str | None:
    """The first of the command's own files and folders that `user` could not use (ancestors are made reachable)."""
    checks = [(str(cwd), 0o7)] + [(str(p), 0o5 if os.path.isdir(p) else 0o4) for p in readable]
    checks += [(a, 0o4) for a in argv if os.path.isabs(a) and os.path.isfile(a)]
    checks += [(os.path.dirname(a), 0o5) for a in argv if os.path.isabs(a) and os.path.isfile(a)]
    for path, bits in checks:
        if not _may(path, user, bits):
            mode = stat.filemode(os.stat(path).st_mode)
            return f"{path} ({mode} uid {os.stat(path).st_uid})"
    return None


def _hand_over(folder: Path, user: tuple[int, int]) -> None:
    """Gives the caller's scratch folder, recursively, to the sandbox user (links are not followed)."""
    for root, dirs, files in os.walk(folder):
        os.chown(root, *user, follow_symlinks=False)
        for name in dirs + files:
            os.chown(os.path.join(root, name), *user, follow_symlinks=False)


class _Cgroups:
    """The run's memory and pids cgroups (v1), children of xlaport's own."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders

    @classmethod
    def make(cls, mech: Mechanisms, memory_mb: int, max_tasks: int) -> _Cgroups | None:
        if not (mech.memory_cgroup and mech.pids_cgroup):
            return None
        name = f"xlaport-{os.getpid()}-{time.monotonic_ns()}"
        memory, pids = Path(mech.memory_cgroup, name), Path(mech.pids_cgroup, name)
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
            fd = os.open(folder / "cgroup.procs", os.O_WRONLY)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in self.folders:
            found.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        return sorted(found)

    def oom_kills(self) -> int:
        for line in (self.folders[0] / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def peak_mb(self) -> float:
        return int((self.folders[0] / "memory.max_usage_in_bytes").read_text()) / 2**20

    def remove(self) -> None:
        for folder in self.folders:
            try:
                folder.rmdir()
            except OSError:
                pass  # a survivor still in it: it was reported


def _child_setup(cgroups: _Cgroups | None, timeout_s: float, max_tasks: int, file_size_mb: int, dropped: bool) -> None:
    """In the forked child before exec: join the cgroups, set the rlimits (all inherited by every descendant)."""
    if cgroups:
        cgroups.join()
    cpu_s = math.ceil(timeout_s * (os.cpu_count() or 1)) + 10
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_mb * 2**20,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if dropped:  # counts every process of the user on the machine: the pids cgroup is the per-run limit
        resource.setrlimit(resource.RLIMIT_NPROC, (max_tasks if not cgroups else 4 * max_tasks,) * 2)


class _Tail(threading.Thread):
    """Reads a pipe to its end, keeping the last OUTPUT_LIMIT_BYTES."""

    def __init__(self, pipe) -> None:
        super().__init__(daemon=True)
        self.pipe, self.data, self.dropped = pipe, bytearray(), 0
        self.start()

    def run(self) -> None:
        while chunk := self.pipe.read1(65536):
            self.data += chunk
            if len(self.data) > OUTPUT_LIMIT_BYTES:
                cut = len(self.data) - OUTPUT_LIMIT_BYTES
                del self.data[:cut]
                self.dropped += cut

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        return f"[xlaport: {self.dropped} bytes of output cut]\n{text}" if self.dropped else text


def _feed(pipe, text: str) -> None:
    try:
        pipe.write(text.encode())
        pipe.close()
    except OSError:
        pass


def _watch(
    proc: subprocess.Popen, cgroups: _Cgroups | None, timeout_s: float, memory_mb: int
) -> tuple[str | None, float]:
    """Waits for the command; (why it was ended early, peak RSS of the tree in MB)."""
    deadline = time.monotonic() + timeout_s
    peak = 0.0
    while proc.poll() is None:
        pids = cgroups.pids() if cgroups else _tree(proc.pid)
        rss = _rss_mb(pids)
        peak = max(peak, rss)
        if (cgroups.oom_kills() if cgroups else rss > memory_mb) > 0:
            return "memory", peak
        if time.monotonic() > deadline:
            return "timeout", peak
        try:
            proc.wait(POLL_S)
        except subprocess.TimeoutExpired:
            pass
    if cgroups and cgroups.oom_kills():
        return "memory", peak
    return None, peak


def _tree(root: int) -> list[int]:
    """`root`, its process group and its descendants (without cgroups: detached grandchildren may be missed)."""
    parents: dict[int, int] = {}
    groups: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z":  # a zombie is dead already, only not yet reaped
                    parents[int(entry)], groups[int(entry)] = int(fields[1]), int(fields[2])
            except (OSError, IndexError):
                continue
    found = {root} | {pid for pid, group in groups.items() if group == root}
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return sorted(found)


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total * os.sysconf("SC_PAGE_SIZE") / 2**20


def _kill_all(proc: subprocess.Popen, cgroups: _Cgroups | None) -> list[int]:
    """SIGKILLs the command and every tracked descendant until none is left; the PIDs that would not go."""
    for _ in range(100):
        pids = cgroups.pids() if cgroups else _tree(proc.pid)
        pids = [p for p in pids if p != proc.pid or proc.poll() is None]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.poll()
        time.sleep(0.02)
    proc.wait()
    left = cgroups.pids() if cgroups else [p for p in _tree(proc.pid) if p != proc.pid]
    return left


def _returncode(proc: subprocess.Popen, status_r: int, namespaces: bool) -> int:
    """The command's exit code (negative: killed by that signal); through the init's status pipe in a namespace."""
    with os.fdopen(status_r) as pipe:
        text = pipe.read().strip()
    if not namespaces or not text:
        return proc.returncode
    return os.waitstatus_to_exitcode(int(text))


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


def python_argv(script: Path, args: list[str] | tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, str(script), *args]
