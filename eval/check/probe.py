"""The probe the runner (eval/check/runner.py) installs once the script imports torch_xla: the per-step counters
and the patched torch/torch_xla entry points, and the exit checks. Its other concerns have modules of their own:
the host reads (probe_reads.py), the placement checks (probe_placement.py) and the fail-fast watchdog
(probe_watch.py). How it measures without changing what the script computes: see runner.py. Standard library,
torch and torch_xla only (torch is imported when the probe is made)."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import weakref

from xlaport.eval.check.probe_placement import Placement
from xlaport.eval.check.probe_reads import MAX_LISTED, READ_METHODS, HostReads
from xlaport.eval.check.probe_sites import user_site
from xlaport.eval.check.probe_watch import Watchdog


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
        self.last_loss_ref = None
        self.last_loss = None
        self.finished = False
        self.reads = HostReads(self)
        self.placement = Placement(recorder)
        self.watchdog = Watchdog(self)  # the loop as the optimizer sees it: fail fast, and "did it run on XLA at all"
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
        step["host_wait_s"] = self.reads.host_wait_s - self.reads.host_wait_at_boundary
        step["reads"] = self.reads.take_reads()
        if step["compiles"]:
            step["sync_site"] = user_site(3)
        self.recorder.emit("step", index=self.steps, **step)
        self.boundary = now
        self.reads.host_wait_at_boundary = self.reads.host_wait_s
        self.watchdog.optimizer_steps_at_boundary = self.watchdog.optimizer_steps
        self.closure_reads_at_boundary = dict(self.closure_reads)
        if self.steps == 0:
            self.placement.check()
        self.steps += 1
        # the loss of this step is computed now: keeping it alive no longer adds a graph output
        loss = self.last_loss_ref() if self.last_loss_ref is not None else None
        if loss is not None:
            self.last_loss = loss
        if self.max_steps and self.steps >= self.max_steps:
            raise StepLimitReached(self.steps)

    def compile_ns(self) -> float:
        data = self.met.metric_data("CompileTime")
        return data[1] if data else 0

    def wrap_backward(self, original):
        probe = self

        @functools.wraps(original)
        def backward(tensor, *args, **kwargs):
            if tensor.device.type == "xla" and tensor.numel() == 1:
                probe.last_loss_ref = weakref.ref(tensor)  # weak: holding it before the sync would change the graph
            return original(tensor, *args, **kwargs)

        return backward

    def on_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.watchdog.on_optimizer_step(optimizer)
        self.placement.add_optimizer(optimizer)

    # --- exit -----------------------------------------------------------------------------------

    def named_tensors_to_check(self) -> list[tuple[str, object]]:
        seen: set[int] = set()
        named = []

        def add(name, tensor):
            if tensor is not None and id(tensor) not in seen and tensor.is_floating_point():
                seen.add(id(tensor))
                named.append((name, tensor))

        add("last loss", self.last_loss)
        for module in self.placement.modules:
            for name, param in module.named_parameters():
                add(f"{type(module).__name__}.{name}", param)
        for number, optimizer in enumerate(self.placement.optimizers):
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
        reads, watchdog = self.reads, self.watchdog
        reads_after_last_step = reads.take_reads()  # before the check's own read below
        self.placement.check()
        reads.reading.active = True  # the NaN/Inf check's transfer is the probe's, not the script's
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
            nonfinite_reads=reads.nonfinite_reads,
            item_sites=sorted(reads.item_sites.items(), key=lambda item: -item[1])[:MAX_LISTED],
            reads_after_last_step=reads_after_last_step,
            host_wait_after_last_step_s=reads.host_wait_s - reads.host_wait_at_boundary,
            optimizers=len(self.placement.optimizers),
            optimizer_steps=watchdog.optimizer_steps,
            off_xla_optimizer_steps=watchdog.off_xla_optimizer_steps,
            optimizer_site=watchdog.optimizer_site,
            xla_modules=len(self.placement.modules),
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
        torch.nn.Module.to = self.placement.wrap_module_to(torch.nn.Module.to)
        for method, kind in READ_METHODS.items():
            if hasattr(torch.Tensor, method):
                setattr(torch.Tensor, method, self.reads.wrap_read(getattr(torch.Tensor, method), kind))
        torch.Tensor.backward = self.wrap_backward(torch.Tensor.backward)
        register_optimizer_step_pre_hook(self.on_optimizer_step)
        torch.optim.Optimizer.__init__ = self.watchdog.wrap_optimizer_init(torch.optim.Optimizer.__init__)
        threading.Thread(target=self.watchdog.watch, name="xlaport-check-watchdog", daemon=True).start()
