"""Running the kb's fix step in a child process that can be killed: a request that times out stops its work
(a thread cannot be stopped), and a native crash of the parser takes down only the child.

The children are warm workers, reused from request to request: each imported libcst and the kb once (forked
from a forkserver that preloaded them, so a child starts in milliseconds and inherits no threads from the
service) and keeps the kb's result cache (the same text again costs a look-up). A worker is killed and
replaced when a request runs past its time limit, when it dies, or when its memory grew past
`$XLAPORT_WORKER_RECYCLE_MB`; its address space is capped at `$XLAPORT_WORKER_MEMORY_MB` (a file too big to
analyse in it is refused with that reason, not swapped through).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import resource
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TypeVar

from xlaport.kb import FixResult, SourceError, fix_source, get_rule
from xlaport.kb.parsing import RECURSION_LIMIT_HIT
from xlaport.kb.rule import Rule

from xlaport.files import Stopped, stop_between_files, writes_confined_to

# Every worker process of the service and of `migrate` forks from one forkserver, which imported the modules a
# worker needs once: a new worker is a fork of it, not an import, and inherits no threads from its parent.
# serve.tree is where migrate's tasks live: unpickling the first task imported it (and the report models, with
# numpy: ~0.4 s) in every worker of every run. serve.warm_up runs one fix in the forkserver: the first fix's
# set-up (~0.1 s CPU) is paid once, not in every worker.
WORKER_CONTEXT = multiprocessing.get_context("forkserver")
WORKER_CONTEXT.set_forkserver_preload(
    ["xlaport.kb.engine", "xlaport.kb.configs", __name__, "xlaport.serve.tree", "xlaport.serve.warm_up"]
)

T = TypeVar("T")
MEMORY_MB_ENV = "XLAPORT_WORKER_MEMORY_MB"
RECYCLE_MB_ENV = "XLAPORT_WORKER_RECYCLE_MB"
DEFAULT_MEMORY_MB = 2048  # issue 12: any input is analysed within 2 GB or refused
DEFAULT_RECYCLE_MB = 512  # a worker whose peak grew past this (one huge file) is replaced after answering
STOP_GRACE_S = 10.0  # a stopped call's time to finish the file it writes (fsyncs: well under a second)
MAX_IDLE_WORKERS = 4  # more concurrent requests start more workers; extra ones stop when done


# a small training script that most rules look at: their first-call set-up (visitor tables, patterns) is done
WARM_UP_SOURCE = """import torch
import torch.distributed as dist


class Net(torch.nn.Module):
    def forward(self, x):
        return x.cuda()


def train(model, loader, optimizer):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    scaler = torch.cuda.amp.GradScaler()
    for step, (x, y) in enumerate(loader):
        x, y = x.cuda(non_blocking=True), y.to(device)
        with torch.cuda.amp.autocast():
            loss = model(x, y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(loss.item())
    dist.init_process_group(backend="nccl")
    torch.save(model.state_dict(), "model.pt")
"""


class AnalysisTimeout(TimeoutError):
    """The fix step ran past its time limit; its worker process was killed."""


def _env_mb(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else default


def _fix_in_worker(source: str, path: str, codes: list[str], unsafe: bool, memory_mb: int) -> object:
    """fix_source's result, or the exception to raise in the parent (always picklable)."""
    try:
        return fix_source(source, path, [get_rule(c) for c in codes], unsafe=unsafe)
    except RecursionError:
        return SourceError(RECURSION_LIMIT_HIT)
    except MemoryError:
        return SourceError(
            f"too large to analyse within the worker's memory limit ({memory_mb} MB; set {MEMORY_MB_ENV} to raise it)"
        )
    except Exception as exc:  # sent back and raised in the parent
        return exc if isinstance(exc, ValueError) else RuntimeError(f"{type(exc).__name__}: {exc}")


def _serve(conn: Connection, memory_mb: int, recycle_mb: int) -> None:
    """A worker's loop: one (source, path, codes, unsafe) task at a time, answered with (result, retire)."""
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    fix_source(WARM_UP_SOURCE, "warm_up.py")  # first-call costs (every rule's set-up), paid before a request waits
    # Python's cyclic garbage collector ran in the middle of requests, walking the request's whole working set (a
    # 200-line fix: ~7 ms of young collections, and a full one of ~80 ms every two or three requests). The modules
    # and tables loaded so far live as long as the worker: frozen, no collection walks them. A request runs without
    # collections and its cyclic garbage is collected after its answer is sent; what it can leave behind is bounded
    # by the input size limit (kb/parsing.py: a text of the largest size peaks at ~440 MB instead of ~320 MB).
    gc.collect()
    gc.freeze()
    gc.disable()
    while True:
        try:
            source, path, codes, unsafe = conn.recv()
        except EOFError:  # the service closed its end: stop
            return
        result = _fix_in_worker(source, path, codes, unsafe, memory_mb)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
        retire = isinstance(result, SourceError) and "memory limit" in str(result) or peak_mb > recycle_mb
        conn.send((result, retire))
        if retire:
            return
        # What the request left alive (the kb keeps its last few modules' walks for a next pass over the same
        # module) is frozen as well, so that the next collection walks only that request's objects (a collection
        # walking the kept modules again grew to ~10 ms). Frozen objects are still freed by reference counting; a
        # reference cycle among them would stay until the worker is replaced (the recycle line bounds it), and the
        # kb's analyses hold none (kb/analysis/module.py)
        gc.collect()
        gc.freeze()


class _Worker:
    def __init__(self, memory_mb: int, recycle_mb: int) -> None:
        self.memory_mb = memory_mb
        self.conn, child_end = WORKER_CONTEXT.Pipe()
        self.process: BaseProcess = WORKER_CONTEXT.Process(
            target=_serve, args=(child_end, memory_mb, recycle_mb), daemon=True, name="xlaport-fix-worker"
        )
        self.process.start()
        child_end.close()

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class FixWorkers:
    """Warm worker processes for `fix_source`: thread-safe; one task per worker at a time."""

    def __init__(self, max_idle: int = MAX_IDLE_WORKERS) -> None:
        self.max_idle = max_idle
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def warm(self, count: int = 1) -> None:
        """Starts workers now, so that the first requests find them ready."""
        started = [self._start() for _ in range(count)]
        for worker in started:
            self._release(worker)

    def fix(self, source: str, path: str, rules: list[type[Rule]], unsafe: bool, timeout_s: float) -> FixResult:
        """`fix_source` in a worker, killed after `timeout_s` (AnalysisTimeout). Raises what fix_source raises."""
        worker = self._acquire()
        keep = False
        try:
            try:
                worker.conn.send((source, path, [r.code for r in rules], unsafe))
                if not worker.conn.poll(timeout_s):
                    raise AnalysisTimeout(f"the analysis took longer than {timeout_s:.0f} s and was stopped")
                result, retire = worker.conn.recv()
            except (EOFError, BrokenPipeError, ConnectionResetError):
                worker.process.join(5)
                raise SourceError(
                    f"cannot parse: the analysis process died (exit code {worker.process.exitcode}: a parser crash, "
                    f"or past the worker's memory limit of {worker.memory_mb} MB, {MEMORY_MB_ENV}); the input is refused"
                ) from None
            keep = not retire
        finally:
            if keep:
                self._release(worker)
            else:  # replaced now, so the next request finds a warm worker
                worker.stop()
                self._release(self._start())
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()

    def _start(self) -> _Worker:
        return _Worker(_env_mb(MEMORY_MB_ENV, DEFAULT_MEMORY_MB), _env_mb(RECYCLE_MB_ENV, DEFAULT_RECYCLE_MB))

    def _acquire(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.is_alive():
                    return worker
                worker.stop()
            return self._start()  # under the lock: the forkserver is started once

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(worker)
                return
        worker.stop()


FIX_WORKERS = FixWorkers()


def fix_source_killable(source: str, path: str, rules: list[type[Rule]], unsafe: bool, timeout_s: float) -> FixResult:
    """`fix_source` in a warm worker process, killed after `timeout_s` (AnalysisTimeout)."""
    return FIX_WORKERS.fix(source, path, rules, unsafe, timeout_s)


def _call(conn: Connection, function: Callable[..., object], args: tuple, write_root: str | None) -> None:
    """A stoppable call's child side: sends back ("ok", result) or ("error", the exception)."""
    signal.signal(signal.SIGTERM, stop_between_files)  # `stop`: the file being written is finished first
    try:
        if write_root is None:
            result = function(*args)
        else:
            with writes_confined_to(Path(write_root)):
                result = function(*args)
        conn.send(("ok", result))
    except Stopped:
        pass  # nobody waits for the result any more
    except Exception as exc:  # raised again in the parent; a type that does not pickle goes as its text
        try:
            conn.send(("error", exc))
        except Exception:
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()


class StoppableCall:
    """`function(*args)` in its own process, started at once: `stop` kills it, and with it what it started (the
    sandbox's runs die with their parent), which no thread can do. `function` must be importable by name and its
    result picklable. Not daemonic: a migration in it may start its own worker processes."""

    def __init__(self, function: Callable[..., T], args: tuple, write_root: Path | None = None) -> None:
        self.conn, child_end = WORKER_CONTEXT.Pipe(duplex=False)
        root = None if write_root is None else str(write_root)
        self.process: BaseProcess = WORKER_CONTEXT.Process(
            target=_call, args=(child_end, function, args, root), name="xlaport-tool-call"
        )
        self.process.start()
        child_end.close()

    def done(self) -> bool:
        return self.conn.poll() or not self.process.is_alive()

    def result(self) -> object:
        """The call's result, or its exception raised here (RuntimeError when the process died without one)."""
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"the call's process died (exit code {self.process.exitcode})") from None
        finally:
            self.conn.close()
        self.process.join(5)
        if status == "error":
            raise value
        return value

    def stop(self) -> None:
        """Asks the call to stop (SIGTERM: a migration finishes the file it is writing, then ends), and kills it
        when it has not within STOP_GRACE_S."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(STOP_GRACE_S)
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()
