"""`run_sandboxed`: one command in the sandbox, from the cgroups and the namespaces to the last kill."""

from __future__ import annotations

import ctypes
import functools
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .files import hand_over
from .mechanisms import SANDBOX_USER, Mechanisms, host_memory_mb, sandbox_status
from .view import namespace_argv, needed_paths, unreachable

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MEMORY_MB = 8192
DEFAULT_MAX_TASKS = max(1024, 8 * (os.cpu_count() or 1))  # processes + threads (13 for torch_xla on 2 cores)
DEFAULT_FILE_SIZE_MB = 4096
OUTPUT_LIMIT_BYTES = 8 * 1024 * 1024  # per stream; the tail is kept
POLL_S = 0.1
READER_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1
LIBC = ctypes.CDLL(None, use_errno=True)
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
    memory_limit_mb: int = 0  # the limit applied: the one asked for, at most the host's memory
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
    memory_mb = min(memory_mb, host_memory_mb())  # fronts refuse explicit requests above it; defaults are clamped
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
                hand_over(folder, user)
            blocked = unreachable(cwd, argv, readable, user)
            if blocked:
                gaps.append(f"runs as root: {SANDBOX_USER} cannot reach {blocked}")
                user = None
        run_as = user or (os.geteuid(), os.getegid())
        status_r, status_w = os.pipe()  # the init writes the command's wait status here
        full_argv, pass_fds = argv, ()
        if mech.namespaces:
            needed = needed_paths(cwd, argv, [*handed, *map(Path, readable)])
            full_argv, pass_fds = namespace_argv(run_as, needed, status_w, argv), (status_w,)
        cgroups = _Cgroups.make(mech, memory_mb, max_tasks)
        try:
            start = time.perf_counter()
            proc = subprocess.Popen(
                full_argv,
                cwd=cwd,
                env=sandbox_env(env, home, mech.namespaces),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=pass_fds,
                preexec_fn=functools.partial(_child_setup, cgroups, timeout_s, max_tasks, file_size_mb, bool(user)),
            )
            os.close(status_w)
            status_w = -1  # closed: never close a number another thread may have reused since
            readers = [_Tail(proc.stdout), _Tail(proc.stderr)]
            if stdin is not None:
                threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
            kill_reason, peak = _watch(proc, cgroups, timeout_s, memory_mb)
            survivors = _kill_all(proc, cgroups)
            for reader in readers:
                reader.join(READER_GRACE_S)  # only an untracked process could still hold the pipes
            if any(reader.is_alive() for reader in readers):
                gaps.append("a process outside the run's tracking still holds its output pipes")
            wall_s = time.perf_counter() - start
            returncode = _returncode(proc, status_r, mech.namespaces)
            if kill_reason == "memory" and cgroups:  # a spike between two polls: the cgroup saw it
                peak = max(peak, cgroups.peak_mb())
        finally:
            os.close(status_r)
            if status_w >= 0:
                os.close(status_w)
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
        memory_limit_mb=memory_mb,
        survivors=survivors,
        guarantees=mech.guarantees(dropped=user is not None),
        gaps=gaps,
    )


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
    """In the forked child before exec: die with the thread that started the run (then `unshare --kill-child`
    takes the whole namespace along), join the cgroups, set the rlimits (inherited by every descendant)."""
    parent = os.getppid()
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # xlaport died before the line above
        os._exit(1)
    if cgroups:
        cgroups.join()
    cpu_s = math.ceil(timeout_s * (os.cpu_count() or 1)) + 10
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    if cpu_hard != resource.RLIM_INFINITY:  # a run inside a run cannot raise the limit it inherited
        cpu_s = min(cpu_s, cpu_hard - 5)
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
    text = os.read(status_r, 64).decode().strip() if namespaces else ""
    if not namespaces or not text:
        return proc.returncode
    return os.waitstatus_to_exitcode(int(text))


def python_argv(script: Path, args: list[str] | tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, str(script), *args]
