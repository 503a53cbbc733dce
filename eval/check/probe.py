"""The probe the runner (eval/check/runner.py) installs once the script imports torch_xla: per-step counters,
the patched torch/torch_xla entry points, the placement checks, the fail-fast watchdog and the exit checks.
How it measures without changing what the script computes: see runner.py. Standard library, torch and
torch_xla only (torch is imported when the probe is made)."""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import sys
import threading
import time
import weakref

from xlaport.eval.check.events import CHILD_FILES, GRAD_SCALER_READ
from xlaport.eval.tied_weights import lost_groups, lost_ties_message, shared_groups

MAX_LISTED = 10
# Fail fast: optimizer steps (or growing compilations) with no step barrier in between mean the graph
# grows without end; a few are proof enough. Legit loops end one step per optimizer step.
STALL_STEPS = 5
OFF_XLA_STEPS = 10  # optimizer steps on the CPU with no XLA step yet (a CPU warm-up model may take a few)
STALL_COMPILES = 6  # compilations of ever-larger graphs with no barrier (host reads, no optimizer)
WATCH_S = 0.2
HEARTBEAT_S = 1.0
GRAD_SCALER_FILE = os.path.join("amp", "grad_scaler.py")
# The Tensor methods through which a script reads an XLA tensor's value on the host, and the kind of read each
# is (the report names the kind and its kb fix). `to` counts only when it returns a CPU tensor; nested reads
# (print -> __format__ -> item) count once, as the outermost.
READ_METHODS = {
    "item": "item",
    "__bool__": "bool",
    "__float__": "float",
    "__int__": "int",
    "__index__": "int",
    "tolist": "tolist",
    "numpy": "numpy",
    "cpu": "cpu",
    "to": "cpu",
    "__format__": "print",
    "__repr__": "print",
}


class Recorder:
    """Appends one JSON object per line, flushed at once, so a killed run still leaves its steps."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()  # the watchdog thread writes too: whole lines only

    def emit(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def _in_stack(file_suffix: str, depth: int = 2) -> bool:
    frame = sys._getframe(depth)
    while frame is not None:
        if frame.f_code.co_filename.endswith(file_suffix):
            return True
        frame = frame.f_back
    return False


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def _user_site(depth: int = 2) -> str | None:
    """`file:line` of the nearest caller outside torch_xla, torch and the check's child side."""
    return _first_user_frame(sys._getframe(depth))


def _in_grad_scaler(frame) -> bool:
    """Is a frame of torch's GradScaler on the stack (the found_inf read of `scaler.step`)?"""
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("torch", "amp", "grad_scaler.py")):
            return True
        frame = frame.f_back
    return False


def _first_user_frame(frame) -> str | None:
    """`file:line` of `frame` or the nearest frame below it that is user code (not site-packages, not the runner or the probe)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name in CHILD_FILES or "site-packages" in name or name.startswith("<frozen")):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


class StepLimitReached(BaseException):
    """Raised out of the step barrier once `XLAPORT_CHECK_MAX_STEPS` steps ran: the check asked for no more.
    A BaseException, so a script's `except Exception` does not swallow it."""


class Probe:
    """Holds the patches and the running totals of one checked process."""

    def __init__(self, recorder: Recorder) -> None:
        import torch
        import torch_xla.debug.metrics as met

        self.torch = torch
        self.met = met
        self.recorder = recorder
        self.steps = 0
        self.in_sync = False
        self.boundary = self.snapshot()  # counters at the end of the last counted step
        self.closure_reads = {"transfers": 0, "host_reads": 0}  # running totals of step-closure reads
        self.closure_reads_at_boundary = dict(self.closure_reads)
        self.closure_start = None
        self.optimizers: list = []  # strong refs: their parameters are checked for NaN at exit
        self.modules: list = []  # modules moved onto the XLA device by Module.to
        self.off_xla_moves: list[str | None] = []  # where Module.to left a module off the XLA device
        self.replaced: dict[int, weakref.ref] = {}  # parameters that a Module.to call replaced by new ones
        self.placement_findings: dict[str, list[str]] = {"stale": [], "off_device": [], "untied": []}
        self.untied_by_moves: list[tuple[weakref.ref, str, list[list[str]]]] = []  # (module, its name, lost groups)
        self.nonfinite_reads: list[dict] = []
        self.item_sites: dict[str | None, int] = {}  # where the script reads XLA tensors on the host
        self.last_read_site: str | None = None  # the latest of them
        self.reading = threading.local()  # .active: this thread is inside a counted read, whose own reads are its
        self.step_reads: dict[tuple[str | None, str], list] = {}  # (site, kind) -> [reads, wait s] this step
        self.host_wait_s = 0.0  # running total of main-thread time blocked in host reads (compiles excluded)
        self.host_wait_at_boundary = 0.0
        self.last_loss_ref = None
        self.last_loss = None
        self.finished = False
        # the loop as the optimizer sees it, for fail-fast and for "did it run on XLA at all"
        self.optimizer_steps = 0
        self.optimizer_steps_at_boundary = 0
        self.off_xla_optimizer_steps = 0
        self.optimizer_site: str | None = None
        self.through_grad_scaler = False
        self.graphs_at_boundary = 0  # TensorsGraphSize samples (graph executions) at the last step
        self.started = time.time()
        # 0: as many as the script runs. Only the checked script's own process stops early: a worker started
        # by a launcher ends with its parent.
        main_pid = os.environ.get("XLAPORT_CHECK_MAIN_PID")
        in_main = main_pid is None or main_pid == str(os.getpid())
        self.max_steps = int(os.environ.get("XLAPORT_CHECK_MAX_STEPS") or 0) if in_main else 0

    # --- counters -------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        met = self.met
        compile_time = met.metric_data("CompileTime")
        transfer_time = met.metric_data("TransferFromDeviceTime")
        execute_time = met.metric_data("ExecuteTime")
        return {
            "compiles": met.counter_value("UncachedCompile") or 0,
            "cache_lookups": (met.counter_value("UncachedCompile") or 0) + (met.counter_value("CachedCompile") or 0),
            "compile_ns": compile_time[1] if compile_time else 0,
            "execute_ns": execute_time[1] if execute_time else 0,
            "transfers": transfer_time[0] if transfer_time else 0,
            "graphs": (met.metric_data("TensorsGraphSize") or (0,))[0],
            "aten": {name: met.counter_value(name) for name in met.counter_names() if name.startswith("aten::")},
        }

    @staticmethod
    def delta(now: dict, before: dict) -> dict:
        aten = {op: n - before["aten"].get(op, 0) for op, n in now["aten"].items()}
        host_reads = aten.pop("aten::_local_scalar_dense", 0)
        return {
            "compiles": now["compiles"] - before["compiles"],
            "compile_s": (now["compile_ns"] - before["compile_ns"]) / 1e9,
            "execute_s": (now["execute_ns"] - before.get("execute_ns", 0)) / 1e9,
            "transfers": now["transfers"] - before["transfers"],
            "host_reads": host_reads,
            "fallbacks": {op: n for op, n in sorted(aten.items()) if n},
        }

    # --- wrappers -------------------------------------------------------------------------------

    def wrap_sync(self, original):
        @functools.wraps(original)
        def sync(*args, **kwargs):
            if self.in_sync:  # a sync called from a step closure: part of the outer step
                return original(*args, **kwargs)
            self.in_sync = True
            self.closure_start = None
            try:
                return original(*args, **kwargs)
            finally:
                self.in_sync = False
                # a step needs a graph: one run by this sync or earlier (by .item() ...) since the last step
                after_marker = self.closure_start or self.snapshot()
                if after_marker["cache_lookups"] > self.boundary["cache_lookups"]:
                    self.end_step()

        return sync

    def wrap_run_step_closures(self, original):
        @functools.wraps(original)
        def run_step_closures(*args, **kwargs):
            if not self.in_sync:
                return original(*args, **kwargs)
            self.closure_start = start = self.snapshot()
            try:
                return original(*args, **kwargs)
            finally:
                end = self.snapshot()
                self.closure_reads["transfers"] += end["transfers"] - start["transfers"]
                self.closure_reads["host_reads"] += end["aten"].get("aten::_local_scalar_dense", 0) - start["aten"].get(
                    "aten::_local_scalar_dense", 0
                )

        return run_step_closures

    def end_step(self) -> None:
        now = self.snapshot()
        step = self.delta(now, self.boundary)
        closure_transfers = self.closure_reads["transfers"] - self.closure_reads_at_boundary["transfers"]
        closure_host_reads = self.closure_reads["host_reads"] - self.closure_reads_at_boundary["host_reads"]
        step["transfers"] -= closure_transfers
        step["host_reads"] -= closure_host_reads
        step["closure_transfers"] = closure_transfers
        step["host_wait_s"] = self.host_wait_s - self.host_wait_at_boundary
        step["reads"] = self.take_reads()
        if step["compiles"]:
            step["sync_site"] = _user_site(3)
        self.recorder.emit("step", index=self.steps, **step)
        self.boundary = now
        self.host_wait_at_boundary = self.host_wait_s
        self.optimizer_steps_at_boundary = self.optimizer_steps
        self.closure_reads_at_boundary = dict(self.closure_reads)
        if self.steps == 0:
            self.check_placement()
        self.steps += 1
        # the loss of this step is computed now: keeping it alive no longer adds a graph output
        loss = self.last_loss_ref() if self.last_loss_ref is not None else None
        if loss is not None:
            self.last_loss = loss
        if self.max_steps and self.steps >= self.max_steps:
            raise StepLimitReached(self.steps)

    def wrap_module_to(self, original):
        probe = self

        @functools.wraps(original)
        def to(module, *args, **kwargs):
            before = {id(p): p for p in module.parameters()}
            shared = shared_groups(module)
            result = original(module, *args, **kwargs)
            after = {id(p) for p in module.parameters()}
            lost = lost_groups(shared, module)
            if lost:  # judged at the next placement check: the program may tie them again right after the move
                probe.untied_by_moves.append((weakref.ref(module), type(module).__name__, lost))
            for key, param in before.items():
                if key not in after:
                    probe.replaced[key] = weakref.ref(param)
            devices = {p.device.type for p in module.parameters()}
            if "xla" in devices and all(m is not module for m in probe.modules):
                probe.modules.append(module)
            elif devices and "xla" not in devices and len(probe.off_xla_moves) < MAX_LISTED:
                probe.off_xla_moves.append(_user_site())
                probe.recorder.emit(
                    "off_xla_move", module=type(module).__name__, device=sorted(devices)[0], site=_user_site()
                )
            return result

        return to

    def take_reads(self) -> list[dict]:
        """The host reads since the last step, one entry per (site, kind), and starts counting afresh."""
        reads = [
            {"site": site, "kind": kind, "count": n, "wait_s": round(wait, 6)}
            for (site, kind), (n, wait) in self.step_reads.items()
        ]
        self.step_reads = {}
        return reads

    def compile_ns(self) -> float:
        data = self.met.metric_data("CompileTime")
        return data[1] if data else 0

    def wrap_read(self, original, kind: str):
        """Counts, times and locates a host read of an XLA tensor made through `original` (a Tensor method)."""
        probe = self

        @functools.wraps(original)
        def read(tensor, *args, **kwargs):
            device = getattr(tensor, "device", None)
            if getattr(probe.reading, "active", False) or device is None or device.type != "xla":
                return original(tensor, *args, **kwargs)
            probe.reading.active = True
            start, compile_start = time.perf_counter(), probe.compile_ns()
            try:
                value = original(tensor, *args, **kwargs)
            finally:
                probe.reading.active = False
            if kind == "cpu" and getattr(value, "device", None) is not None and value.device.type == "xla":
                return value  # `.to(...)` that stays on the device: not a read
            # the compile a read triggers is compilation, not waiting: only the rest counts as the host's wait
            wait = max(time.perf_counter() - start - (probe.compile_ns() - compile_start) / 1e9, 0.0)
            probe.host_wait_s += wait
            if not probe.in_sync:  # step closures run inside the sync on finished values: not the script's reads
                site = _user_site()
                if site is not None and _in_grad_scaler(sys._getframe(1)):
                    site += GRAD_SCALER_READ
                entry = probe.step_reads.setdefault((site, kind), [0, 0.0])
                entry[0] += 1
                entry[1] += wait
                probe.item_sites[site] = probe.item_sites.get(site, 0) + 1
                probe.last_read_site = site
            if (
                kind in ("item", "float")
                and isinstance(value, float)
                and not math.isfinite(value)
                and len(probe.nonfinite_reads) < MAX_LISTED
            ):
                probe.nonfinite_reads.append({"step": probe.steps, "value": repr(value), "site": _user_site()})
            return value

        return read

    def wrap_backward(self, original):
        probe = self

        @functools.wraps(original)
        def backward(tensor, *args, **kwargs):
            if tensor.device.type == "xla" and tensor.numel() == 1:
                probe.last_loss_ref = weakref.ref(tensor)  # weak: holding it before the sync would change the graph
            return original(tensor, *args, **kwargs)

        return backward

    def on_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.optimizer_steps += 1
        if not any(p.device.type == "xla" for group in optimizer.param_groups for p in group["params"]):
            self.off_xla_optimizer_steps += 1
        self.optimizer_site = _user_site()
        self.through_grad_scaler = _in_stack(GRAD_SCALER_FILE)
        if any(o is optimizer for o in self.optimizers):
            return
        self.optimizers.append(optimizer)
        self.check_placement()

    # --- checks (no device reads) ----------------------------------------------------------------

    def is_replaced(self, param) -> bool:
        ref = self.replaced.get(id(param))
        return ref is not None and ref() is param

    def check_placement(self) -> None:
        """Finds optimizer groups holding replaced parameters, parameters off the XLA device, and ties a move
        lost that the program has not restored since (`model.tie_weights()` right after the move is fine)."""
        for module_ref, name, lost in self.untied_by_moves:
            module = module_ref()
            still_lost = [group for group in lost if module is not None and lost_groups([group], module)]
            if still_lost:
                self._note("untied", lost_ties_message(name, still_lost))
        for number, optimizer in enumerate(self.optimizers):
            for group_index, group in enumerate(optimizer.param_groups):
                params = list(group["params"])
                stale = sum(self.is_replaced(p) for p in params)
                off = sum(p.device.type != "xla" and not self.is_replaced(p) for p in params)
                name = f"optimizer {number} ({type(optimizer).__name__}) param group {group_index}"
                if stale:
                    self._note(
                        "stale",
                        f"{name}: {stale} of {len(params)} parameters are not the model's parameters "
                        f"(the old copies that model.to(device) replaced; those never get gradients)",
                    )
                if off:
                    devices = sorted({str(p.device) for p in params if p.device.type != "xla"})
                    self._note("off_device", f"{name}: {off} of {len(params)} parameters on {', '.join(devices)}")
        for module in self.modules:
            named = list(module.named_parameters())
            off_names = [n for n, p in named if p.device.type != "xla"]
            if off_names:
                shown = ", ".join(off_names[:5]) + (", ..." if len(off_names) > 5 else "")
                self._note(
                    "off_device",
                    f"{type(module).__name__}: {len(off_names)} of {len(named)} parameters not on the XLA device ({shown})",
                )

    def _note(self, kind: str, message: str) -> None:
        if message not in self.placement_findings[kind]:
            self.placement_findings[kind].append(message)
            self.recorder.emit("placement", kind=kind, message=message)

    # --- fail fast ----------------------------------------------------------------------------

    def graph_sizes_since_boundary(self) -> list[int]:
        """Node counts of the XLA graphs run since the last step (the newest samples of TensorsGraphSize)."""
        data = self.met.metric_data("TensorsGraphSize")
        if not data:
            return []
        new = data[0] - self.boundary["graphs"]
        return [int(value) for _, value in data[2][-new:]] if new > 0 else []

    def stalled_loop(self) -> tuple[str, str] | None:
        """(kind, reason) when the loop already shows it will never end a step on the XLA device."""
        since = self.optimizer_steps - self.optimizer_steps_at_boundary
        sizes = self.graph_sizes_since_boundary()
        compiles = (self.met.counter_value("UncachedCompile") or 0) - self.boundary["compiles"]
        site = self.optimizer_site or "?"
        if self.steps == 0 and self.off_xla_optimizer_steps >= OFF_XLA_STEPS:
            if self.off_xla_optimizer_steps == self.optimizer_steps:
                return "off_xla", (
                    f"ran on the CPU, not on the XLA device: {self.optimizer_steps} optimizer steps (at {site}) "
                    "updated parameters that are not on the XLA device, and no XLA graph ran"
                )
        growing = len(sizes) >= 2 and sizes[-1] > sizes[0]
        if since >= STALL_STEPS and since > self.off_xla_optimizer_steps:
            how = (
                "goes through GradScaler.step, so no barrier was placed after it"
                if self.through_grad_scaler
                else "is not followed by one"
            )
            graphs = (
                f"; {compiles} compilation(s) since the last step, of graphs growing from {sizes[0]} to {sizes[-1]} nodes"
                if growing
                else f"; {compiles} compilation(s) since the last step"
            )
            return "no_barrier", (
                f"no step barrier: {since} optimizer steps ran without a torch_xla.sync() (the optimizer step at "
                f"{site} {how}), so every step adds to one ever-growing XLA graph{graphs}. Call torch_xla.sync() "
                "(xm.mark_step()) after the optimizer step, or use xm.optimizer_step(optimizer, barrier=True)"
            )
        recent = sizes[-STALL_COMPILES:]
        if (
            compiles >= STALL_COMPILES
            and len(recent) == STALL_COMPILES
            and all(a < b for a, b in zip(recent, recent[1:], strict=False))
        ):
            return "no_barrier", (
                f"no step barrier: {compiles} compilations since the last step, each of a bigger graph "
                f"({recent[0]} to {recent[-1]} nodes): host reads (.item(), print of a tensor) run a graph that holds "
                f"every iteration so far, last at {self.last_read_site or _main_thread_site() or '?'}. Call "
                "torch_xla.sync() once per iteration of the loop"
            )
        return None

    def watch(self) -> None:
        """Runs beside the script: stops the whole run (process group) as soon as the loop is known to be
        stalled, and leaves a heartbeat so a killed run still says how far it got."""
        last_beat = 0.0
        while not self.finished:
            time.sleep(WATCH_S)
            try:
                problem = self.stalled_loop()
            except Exception as exc:  # never let the watchdog break the script
                self.recorder.emit("probe_error", error=f"watchdog: {type(exc).__name__}: {exc}")
                return
            if problem is not None and not self.finished:
                kind, reason = problem
                self.beat()  # the counters as they are when the run is stopped
                self.recorder.emit(
                    "stopped", kind=kind, reason=reason, site=self.optimizer_site, rss_mb=round(_rss_mb(), 1)
                )
                os.killpg(os.getpgid(0), signal.SIGKILL)
            if time.time() - last_beat >= HEARTBEAT_S:
                last_beat = time.time()
                self.beat()

    def beat(self) -> None:
        sizes = self.graph_sizes_since_boundary()
        self.recorder.emit(
            "heartbeat",
            steps=self.steps,
            optimizer_steps=self.optimizer_steps,
            compiles=self.met.counter_value("UncachedCompile") or 0,
            graph_nodes=sizes[-1] if sizes else None,
            rss_mb=round(_rss_mb(), 1),
        )

    # --- exit -----------------------------------------------------------------------------------

    def named_tensors_to_check(self) -> list[tuple[str, object]]:
        seen: set[int] = set()
        named = []

        def add(name, tensor):
            if tensor is not None and id(tensor) not in seen and tensor.is_floating_point():
                seen.add(id(tensor))
                named.append((name, tensor))

        add("last loss", self.last_loss)
        for module in self.modules:
            for name, param in module.named_parameters():
                add(f"{type(module).__name__}.{name}", param)
        for number, optimizer in enumerate(self.optimizers):
            for group_index, group in enumerate(optimizer.param_groups):
                for i, param in enumerate(group["params"]):
                    add(f"optimizer {number} param_groups[{group_index}][{i}]", param)
        return named

    def nonfinite_tensors(self) -> list[str]:
        """Names of the checked tensors holding NaN/Inf: one small graph, one transfer, after the last snapshot."""
        torch = self.torch
        by_device: dict[str, list[tuple[str, object]]] = {}
        for name, tensor in self.named_tensors_to_check():
            by_device.setdefault(str(tensor.device), []).append((name, tensor))
        bad = []
        with torch.no_grad():
            for named in by_device.values():
                flags = torch.stack([torch.isfinite(t.detach()).all() for _, t in named]).cpu()
                bad += [name for (name, _), finite in zip(named, flags.tolist(), strict=True) if not finite]
        return bad

    def finish(self, script_exit: object = None) -> None:
        if self.finished:
            return
        self.finished = True
        final = self.snapshot()
        totals = self.delta(final, {"compiles": 0, "compile_ns": 0, "transfers": 0, "aten": {}})
        reads_after_last_step = self.take_reads()  # before the check's own read below
        self.check_placement()
        self.reading.active = True  # the NaN/Inf check's transfer is the probe's, not the script's
        try:
            nonfinite = self.nonfinite_tensors()
            nonfinite_error = None
        except Exception as exc:  # a broken runtime must not hide the rest of the report
            nonfinite, nonfinite_error = [], f"{type(exc).__name__}: {exc}"
        self.recorder.emit(
            "end",
            steps=self.steps,
            totals=totals,
            closure_transfers=self.closure_reads["transfers"],
            closure_host_reads=self.closure_reads["host_reads"],
            nonfinite_tensors=nonfinite,
            nonfinite_check_error=nonfinite_error,
            nonfinite_reads=self.nonfinite_reads,
            item_sites=sorted(self.item_sites.items(), key=lambda item: -item[1])[:MAX_LISTED],
            reads_after_last_step=reads_after_last_step,
            host_wait_after_last_step_s=self.host_wait_s - self.host_wait_at_boundary,
            optimizers=len(self.optimizers),
            optimizer_steps=self.optimizer_steps,
            off_xla_optimizer_steps=self.off_xla_optimizer_steps,
            optimizer_site=self.optimizer_site,
            xla_modules=len(self.modules),
            script_exit=repr(script_exit),
        )

    def install(self) -> None:
        import torch
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.torch_xla as torch_xla_module
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        sync = self.wrap_sync(torch_xla_module.sync)
        torch_xla.sync = sync
        torch_xla_module.sync = sync  # torch_xla.compile() calls the module-level name
        xm._run_step_closures = self.wrap_run_step_closures(xm._run_step_closures)
        torch.nn.Module.to = self.wrap_module_to(torch.nn.Module.to)
        for method, kind in READ_METHODS.items():
            if hasattr(torch.Tensor, method):
                setattr(torch.Tensor, method, self.wrap_read(getattr(torch.Tensor, method), kind))
        torch.Tensor.backward = self.wrap_backward(torch.Tensor.backward)
        register_optimizer_step_pre_hook(self.on_optimizer_step)
        threading.Thread(target=self.watch, name="xlaport-check-watchdog", daemon=True).start()


def _main_thread_site() -> str | None:
    """`file:line` of the user code the main thread is running now."""
    return _first_user_frame(sys._current_frames().get(threading.main_thread().ident))
