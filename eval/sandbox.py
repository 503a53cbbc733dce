"""Runs user code in a child process with a time limit, a memory limit and its own working directory.

User code is never imported into xlaport's process. The memory limit is enforced by watching the
resident memory of the whole process group (an address-space rlimit would break torch, which
reserves large virtual ranges), and the time limit kills the group.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MEMORY_MB = 8192
POLL_S = 0.2


@dataclass
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False
    memory_exceeded: bool = False
    peak_rss_mb: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.memory_exceeded

    def describe_failure(self) -> str | None:
        if self.timed_out:
            return f"timed out after {self.wall_s:.1f} s"
        if self.memory_exceeded:
            return f"killed: memory limit exceeded (peak {self.peak_rss_mb:.0f} MB)"
        if self.returncode != 0:
            tail = (self.stderr or self.stdout).strip().splitlines()[-15:]
            return f"exit code {self.returncode}" + ("\n" + "\n".join(tail) if tail else "")
        return None


def _group_rss_mb(pgid: int) -> float:
    total_kb = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            with open(f"/proc/{pid}/statm") as handle:
                total_kb += int(handle.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
        except (OSError, ValueError, ProcessLookupError):
            continue
    return total_kb / 1024


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_sandboxed(
    argv: list[str],
    cwd: Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> SandboxResult:
    """Runs `argv` in a new process group. `cwd` defaults to a fresh temporary directory."""
    own_tmp = None
    if cwd is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="xlaport-run-")
        cwd = Path(own_tmp.name)
    child_env = {**os.environ, **(env or {})}
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=child_env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_limits,
    )
    state = {"peak": 0.0, "memory": False}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            rss = _group_rss_mb(proc.pid)
            state["peak"] = max(state["peak"], rss)
            if rss > memory_mb:
                state["memory"] = True
                _kill_group(proc.pid)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    timed_out = False
    try:
        stdout, stderr = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()
    finally:
        done.set()
        watcher.join()
        _kill_group(proc.pid)  # leftovers the script started
        if own_tmp is not None:
            own_tmp.cleanup()
    return SandboxResult(
        returncode=proc.returncode,
        stdout=stdout,
        stderr=stderr,
        wall_s=time.perf_counter() - start,
        timed_out=timed_out,
        memory_exceeded=state["memory"],
        peak_rss_mb=state["peak"],
    )


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def python_argv(script: Path, args: list[str] | tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, str(script), *args]
