"""`run_sandboxed`: one command in the sandbox, from the cgroups and the namespaces to the last kill."""

from __future__ import annotations

import ctypes
import functools
import math
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cgroups import CgroupsV1, CgroupsV2
from .files import hand_over, read_child_file, scratch
from .mechanisms import SANDBOX_USER, Mechanisms, host_memory_mb, sandbox_status
from .view import (
    View,
    ViewTooBig,
    copy_view,
    describe,
    inside,
    may,
    namespace_argv,
    needed_paths,
    unreadable,
    view_outputs,
)

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MEMORY_MB = 8192
DEFAULT_MAX_TASKS = max(1024, 8 * (os.cpu_count() or 1))  # processes + threads (13 for torch_xla on 2 cores)
DEFAULT_FILE_SIZE_MB = 4096
OUTPUT_LIMIT_BYTES = 8 * 1024 * 1024  # per stream; the tail is kept
POLL_S = 0.1
READER_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
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
    # the tree's anonymous + shared memory, each page once (the cgroup's figure; without cgroups the sum of the
    # processes' proportional shares), polled every POLL_S; on a memory kill at least the cgroup's high-water mark
    peak_rss_mb: float = 0.0
    kill_reason: str | None = None  # "timeout", "memory" or None (ended by itself)
    memory_limit_mb: int = 0  # the limit applied: the one asked for, at most the host's memory
    survivors: list[int] = field(default_factory=list)  # host PIDs still alive after the end (should be none)
    guarantees: list[str] = field(default_factory=list)  # what held for this run
    gaps: list[str] = field(default_factory=list)  # what did not, and why
    outputs: list[str] = field(default_factory=list)  # files the run wrote in its views, as the program saw them
    outputs_removed: list[str] = field(default_factory=list)  # files it removed there (the user's stay)
    outputs_bytes: int = 0
    views: list[str] = field(default_factory=list)  # the user's folders the run saw through a view
    outputs_kept: str | None = None  # where its outputs were copied (keep_outputs), None: discarded

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


class SandboxRefused(RuntimeError):
    """The run would have been made as root (the sandbox user could not read what it needs, or there is no
    sandbox user): refused, with the reason and the fix, unless the caller allows an unsandboxed run."""


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
    views: list[Path] | tuple[Path, ...] = (),
    reveal: bool = False,
    allow_unsandboxed: bool = False,
    keep_outputs: Path | None = None,
) -> SandboxResult:
    """Runs `argv` in the sandbox. `cwd` defaults to a fresh private folder. `writable` folders (the caller's
    scratch, where the child leaves results) are handed over to the sandbox user, recursively. `views` (the
    user's project) and `cwd`, unless it is handed over, are seen as private writable views (view.py): the run
    writes there as in its own folder, and the folders are never changed; `result.outputs` lists what it wrote,
    copied to `keep_outputs` when given. The child sees the folders of `cwd`, `writable`, `readable`, `views`,
    `env`'s PYTHONPATH and of absolute file paths in `argv`; of /tmp nothing else.
    What the sandbox user could not read is refused (SandboxRefused), unless `reveal` (the caller may read it:
    the view shows it) or `allow_unsandboxed` (the run stays with xlaport's user, root, and says so in `gaps`).
    The environment is the allowlist plus `env`."""
    memory_mb = min(memory_mb, host_memory_mb())  # fronts refuse explicit requests above it; defaults are clamped
    mech = sandbox_status()
    gaps = list(mech.refused)
    python_path = (env or {}).get("PYTHONPATH", "")
    readable = [*map(Path, readable), *(Path(p) for p in python_path.split(os.pathsep) if p and os.path.isdir(p))]
    folders = [os.path.realpath(v) for v in views]
    cwd_real = os.path.realpath(cwd) if cwd is not None else None
    handed_real = [os.path.realpath(w) for w in writable]
    if cwd_real and not any(inside(cwd_real, f) for f in [*folders, *handed_real]):
        folders.append(cwd_real)  # a working folder of the user's: written through a view only
    user = mech.user
    if os.geteuid() == 0 and user is None:
        if not allow_unsandboxed:
            raise SandboxRefused(
                f"there is no user {SANDBOX_USER} to run the command as, and it is never run as root instead. "
                f"Fix: create the user {SANDBOX_USER}, or allow an unsandboxed run (`--allow-unsandboxed`)"
            )
        gaps.insert(0, f"runs as root (unsandboxed run allowed): there is no user {SANDBOX_USER}")
    if user:
        for folder in writable:  # the caller's scratch is the sandbox user's before anything is judged
            hand_over(Path(folder), user)
        blocked, extra = _blocked(cwd_real, argv, readable, folders, user, reveal)
        blocked = blocked or (None if mech.namespaces else _untraversable([argv[0], *argv[1:], cwd_real], user))
        folders += extra
        if blocked and not allow_unsandboxed:
            raise SandboxRefused(
                f"the sandbox user {SANDBOX_USER} cannot read {blocked}, and the run is never made as root "
                "instead. Fix: make it readable to other users (chmod o+r on the file, o+rx on its folders), "
                "or allow an unsandboxed run (`--allow-unsandboxed`: as root, not sandboxed)"
            )
        if blocked:
            gaps.insert(0, f"runs as root (unsandboxed run allowed): {SANDBOX_USER} cannot read {blocked}")
            user = None
    folders = _outermost(folders)
    if any(inside(h, f) for h in handed_real for f in folders):
        raise ValueError("a handed-over folder cannot be inside a view (its writes would stay in the view)")
    with scratch("xlaport-run-", avoid=folders) as own:
        os.chmod(own, 0o711)  # the child reaches its home through it; the views' stores stay out of its reach
        home = Path(own) / "home"
        home.mkdir()
        cwd = Path(cwd) if cwd is not None else home
        handed = [home, *map(Path, writable)]
        run_views, too_big = _make_views(folders, Path(own), mech, user, reveal, cwd_real)
        gaps += too_big
        if user:
            hand_over(home, user)
        moved = _mover(run_views)
        argv, cwd = [moved(a) for a in argv], Path(moved(str(cwd)))
        env = {k: os.pathsep.join(moved(p) for p in v.split(os.pathsep)) for k, v in (env or {}).items()}
        run_as = user or (os.geteuid(), os.getegid())
        status_r, status_w = os.pipe()  # the init writes the command's wait status here
        full_argv, pass_fds = argv, ()
        if mech.namespaces:
            seen = [Path(v.seen_at) for v in run_views]
            needed = needed_paths(cwd, argv, [*handed, *map(Path, readable), *seen])
            full_argv = namespace_argv(run_as, needed, status_w, argv, run_views, reveal, mech.no_userns, str(cwd))
            pass_fds = (status_w,)
        cgroups = _make_cgroups(mech, memory_mb, max_tasks)
        try:
            start = time.perf_counter()
            proc = subprocess.Popen(
                full_argv,
                cwd=cwd if not mech.namespaces else "/",  # the init changes into it once the views are mounted
                env=sandbox_env(env, home, mech.namespaces),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=pass_fds,
                preexec_fn=functools.partial(
                    _child_setup,
                    cgroups,
                    timeout_s,
                    max_tasks,
                    file_size_mb,
                    user if not mech.namespaces else None,  # in the namespaces the init drops to the user
                    bool(user),
                ),
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
            outputs = _outputs(run_views, keep_outputs)
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
        **outputs,
    )


def _blocked(
    cwd: str | None, argv: list[str], readable: list[Path], folders: list[str], user: tuple[int, int], reveal: bool
) -> tuple[str | None, list[str]]:
    """(the first path the sandbox user could not read, folders to show as views so that it can). With `reveal`
    every such folder becomes a view that shows it; without, what it cannot read is refused."""
    files = [a for a in argv if os.path.isabs(a) and os.path.isfile(a)]
    # each is mounted back at its place in the namespace, so its own mode counts, not its parents'; a file's
    # folder is listed too (imports of the modules beside the script)
    paths = [*([cwd] if cwd else []), *(str(p) for p in readable), *map(os.path.dirname, files), *files]
    extra: list[str] = []
    for path in paths:
        real = os.path.realpath(path)
        within = next((f for f in [*folders, *extra] if inside(real, f)), None)
        if within and reveal:
            continue  # the view gives it to the sandbox user
        problem = unreadable(real, user, within)
        if problem is None:
            continue
        if not reveal:
            return problem, extra
        extra.append(real if os.path.isdir(real) else os.path.dirname(real))
    return None, extra


def _untraversable(paths: list[str | None], user: tuple[int, int]) -> str | None:
    """Without a mount namespace nothing is mounted back: every folder above the command's files (the
    interpreter's included) must let the sandbox user through. The first that does not, described."""
    for path in paths:
        found = shutil.which(path) if path and not os.path.isabs(path) and "/" not in path else path
        if not found or not os.path.exists(found):
            continue
        for folder in reversed(Path(os.path.realpath(found)).parents):
            if not may(str(folder), user, 0o1):
                return describe(str(folder))
    return None


def _outermost(folders: list[str]) -> list[str]:
    unique = sorted(set(folders), key=len)
    return [f for i, f in enumerate(unique) if not any(inside(f, g) for g in unique[:i])]


def _make_views(
    folders: list[str], own: Path, mech: Mechanisms, user: tuple[int, int] | None, reveal: bool, first: str | None
) -> tuple[list[View], list[str]]:
    """The views of `folders` (overlay where the machine allows, else copies; view.py), their stores in `own`;
    and a gap for each folder too big to copy (the run then sees it as it is: it may write there)."""
    views, gaps = [], []
    for index, folder in enumerate(folders):
        store = own / "views" / str(index)
        store.mkdir(parents=True)
        working = first if first and inside(first, folder) else ""
        if mech.namespaces and mech.overlay:
            upper, work = store / "upper", store / "work"
            upper.mkdir()
            work.mkdir()
            info = os.stat(folder)  # the view's top shows the upper folder's owner and mode: the folder's own
            os.chown(upper, info.st_uid, info.st_gid)
            os.chmod(upper, stat.S_IMODE(info.st_mode))
            views.append(View(folder, "overlay", str(upper), str(work), working))
        else:
            copy = store / "copy"
            try:
                before = copy_view(folder, copy, user, reveal)
            except ViewTooBig as error:
                gaps.append(f"no view: {error}; the run sees the folder itself and may write where it is allowed")
                continue
            kind = "bind" if mech.namespaces else "copy"
            views.append(View(folder, kind, str(copy), "", working, before))
    return views, gaps


def _mover(views: list[View]):
    """Maps a path (or a command-line word) under a copied view's folder to the copy, where the run sees it."""
    copies = [v for v in views if v.kind == "copy"]

    def moved(text: str) -> str:
        for view in copies:
            if inside(text, view.folder):
                return view.store + text[len(view.folder) :]
        return text

    return moved


def _outputs(views: list[View], keep: Path | None) -> dict:
    """What the run wrote in its views (paths as the program saw them), and where it went."""
    written, removed, views_said, total = [], [], [], 0
    how = {"overlay": "an overlay view", "bind": "a copy mounted at its path", "copy": "a copy"}
    for view in views:
        files, gone = view_outputs(view)
        written += [os.path.join(view.folder, rel) for rel, _ in files]
        removed += [os.path.join(view.folder, rel) for rel in gone]
        total += sum(size for _, size in files)
        where = f" at {view.store}" if view.kind == "copy" else ""
        views_said.append(f"{view.folder} (through {how[view.kind]}{where}; left unchanged)")
        if keep is not None:
            for rel, _ in files:
                target = Path(keep, view.folder.lstrip("/") if len(views) > 1 else "", rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                data = read_child_file(Path(view.store, rel), limit_bytes=None)
                if data is not None:
                    target.write_bytes(data)
    return {
        "outputs": written,
        "outputs_removed": removed,
        "outputs_bytes": total,
        "views": views_said,
        "outputs_kept": str(keep) if keep is not None and written else None,
    }


def _make_cgroups(mech: Mechanisms, memory_mb: int, max_tasks: int) -> CgroupsV1 | CgroupsV2 | None:
    if mech.cgroup_version == 2 and mech.memory_cgroup:  # without the pids controller: no pids.max
        return CgroupsV2.make(mech.memory_cgroup, memory_mb, max_tasks if mech.pids_cgroup else None)
    if not (mech.memory_cgroup and mech.pids_cgroup):
        return None
    return CgroupsV1.make(mech.memory_cgroup, mech.pids_cgroup, memory_mb, max_tasks)


def _child_setup(
    cgroups: CgroupsV1 | CgroupsV2 | None,
    timeout_s: float,
    max_tasks: int,
    file_size_mb: int,
    switch_to: tuple[int, int] | None,
    dropped: bool,
) -> None:
    """In the forked child before exec: die with the thread that started the run (then `unshare --kill-child`
    takes the whole namespace along), join the cgroups, set the rlimits (inherited by every descendant), and
    without namespaces (where the init would) become `switch_to` with no_new_privs."""
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
        resource.setrlimit(
            resource.RLIMIT_NPROC, (4 * max_tasks if cgroups and cgroups.limits_tasks else max_tasks,) * 2
        )
    if switch_to:
        os.setgroups([])
        os.setgid(switch_to[1])
        os.setuid(switch_to[0])
        LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


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
    proc: subprocess.Popen, cgroups: CgroupsV1 | CgroupsV2 | None, timeout_s: float, memory_mb: int
) -> tuple[str | None, float]:
    """Waits for the command; (why it was ended early, peak memory of the tree in MB)."""
    deadline = time.monotonic() + timeout_s
    peak = 0.0
    while proc.poll() is None:
        used = cgroups.memory_mb() if cgroups else tree_memory_mb(_tree(proc.pid))
        peak = max(peak, used)
        if (cgroups.oom_kills() if cgroups else used > memory_mb) > 0:
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


def tree_memory_mb(pids: list[int]) -> float:
    """Anonymous + shared memory of these processes, each page once: the sum of their proportional shares
    (Pss_Anon + Pss_Shmem of smaps_rollup: a page mapped by k processes counts 1/k in each). Plain RSS would
    count a page shared by k forked workers k times, and the interpreter's libraries in every one of them."""
    total = 0
    for pid in pids:
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
            if "Pss_Anon" in fields:
                total += sum(int(fields[k].split()[0]) for k in ("Pss_Anon", "Pss_Shmem") if k in fields)
            else:  # before Linux 5.9: the whole proportional share, file pages included
                total += int(fields["Pss"].split()[0])
        except (OSError, ValueError, KeyError):
            continue
    return total / 1024


def _kill_all(proc: subprocess.Popen, cgroups: CgroupsV1 | CgroupsV2 | None) -> list[int]:
    """SIGKILLs the command and every tracked descendant until none is left; the PIDs that would not go."""
    if cgroups:
        cgroups.kill()
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
