"""The probe's fail-fast watchdog: the loop as the optimizer sees it, and a thread beside the script that stops
the run as soon as the loop shows it will never end a step on the XLA device (no step barrier, or training on
the CPU), leaving a heartbeat so a killed run still says how far it got."""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any, Protocol

from xlaport.eval.check.probe_reads import HostReads
from xlaport.eval.check.probe_sites import in_stack, main_thread_site, rss_mb, user_site

# Fail fast: optimizer steps (or growing compilations) with no step barrier in between mean the graph
# grows without end; a few are proof enough. Legit loops end one step per optimizer step.
STALL_STEPS = 5
OFF_XLA_STEPS = 10  # optimizer steps on the CPU with no XLA step yet (a CPU warm-up model may take a few)
STALL_COMPILES = 6  # compilations of ever-larger graphs with no barrier (host reads, no optimizer)
WATCH_S = 0.2
HEARTBEAT_S = 1.0
GRAD_SCALER_FILE = os.path.join("amp", "grad_scaler.py")


class LoopState(Protocol):
    """What the watchdog reads of the probe (probe.py `Probe`): its counters and where the script last read."""

    met: Any  # torch_xla.debug.metrics
    recorder: Any
    boundary: dict  # the counters at the end of the last step
    steps: int
    finished: bool
    reads: HostReads


class Watchdog:
    """The optimizer steps of the loop, between the probe's steps, and the verdict that it is stalled."""

    def __init__(self, probe: LoopState) -> None:
        self.probe = probe
        self.optimizer_steps = 0
        self.optimizer_steps_at_boundary = 0
        self.optimizers_made = 0  # a training program: growing graphs before its first step are one forward pass
        self.off_xla_optimizer_steps = 0
        self.optimizer_site: str | None = None
        self.through_grad_scaler = False

    def wrap_optimizer_init(self, original):
        watchdog = self

        @functools.wraps(original)
        def __init__(optimizer, *args, **kwargs):
            watchdog.optimizers_made += 1
            return original(optimizer, *args, **kwargs)

        return __init__

    def on_optimizer_step(self, optimizer) -> None:
        self.optimizer_steps += 1
        if not any(p.device.type == "xla" for group in optimizer.param_groups for p in group["params"]):
            self.off_xla_optimizer_steps += 1
        self.optimizer_site = user_site(3)
        self.through_grad_scaler = in_stack(GRAD_SCALER_FILE, 3)

    def graph_sizes_since_boundary(self) -> list[int]:
        """Node counts of the XLA graphs run since the last step (the newest samples of TensorsGraphSize)."""
        data = self.probe.met.metric_data("TensorsGraphSize")
        if not data:
            return []
        new = data[0] - self.probe.boundary["graphs"]
        return [int(value) for _, value in data[2][-new:]] if new > 0 else []

    def stalled_loop(self) -> tuple[str, str] | None:
        """(kind, reason) when the loop already shows it will never end a step on the XLA device."""
        probe = self.probe
        since = self.optimizer_steps - self.optimizer_steps_at_boundary
        sizes = self.graph_sizes_since_boundary()
        compiles = (probe.met.counter_value("UncachedCompile") or 0) - probe.boundary["compiles"]
        site = self.optimizer_site or "?"
        if probe.steps == 0 and self.off_xla_optimizer_steps >= OFF_XLA_STEPS:
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
        # a program that built an optimizer and has not ended a step yet is inside its first step: host reads
        # in its forward pass (a check per layer) compile the forward so far, one bigger graph each, and stop when
        # the step ends; a training loop without a barrier is caught by its optimizer steps above
        first_step = self.optimizers_made > 0 and probe.steps == 0
        if (
            not first_step
            and compiles >= STALL_COMPILES
            and len(recent) == STALL_COMPILES
            and all(a < b for a, b in zip(recent, recent[1:], strict=False))
        ):
            return "no_barrier", (
                f"no step barrier: {compiles} compilations since the last step, each of a bigger graph "
                f"({recent[0]} to {recent[-1]} nodes): host reads (.item(), print of a tensor) run a graph that holds "
                f"every iteration so far, last at {probe.reads.last_read_site or main_thread_site() or '?'}. Call "
                "torch_xla.sync() once per iteration of the loop"
            )
        return None

    def watch(self) -> None:
        """Runs beside the script: stops the whole run (process group) as soon as the loop is known to be
        stalled, and leaves a heartbeat so a killed run still says how far it got."""
        probe = self.probe
        last_beat = 0.0
        while not probe.finished:
            time.sleep(WATCH_S)
            try:
                problem = self.stalled_loop()
            except Exception as exc:  # never let the watchdog break the script
                probe.recorder.emit("probe_error", error=f"watchdog: {type(exc).__name__}: {exc}")
                return
            if problem is not None and not probe.finished:
                kind, reason = problem
                self.beat()  # the counters as they are when the run is stopped
                probe.recorder.emit(
                    "stopped", kind=kind, reason=reason, site=self.optimizer_site, rss_mb=round(rss_mb(), 1)
                )
                os.killpg(os.getpgid(0), signal.SIGKILL)
            if time.time() - last_beat >= HEARTBEAT_S:
                last_beat = time.time()
                self.beat()

    def beat(self) -> None:
        sizes = self.graph_sizes_since_boundary()
        self.probe.recorder.emit(
            "heartbeat",
            steps=self.probe.steps,
            optimizer_steps=self.optimizer_steps,
            compiles=self.probe.met.counter_value("UncachedCompile") or 0,
            graph_nodes=sizes[-1] if sizes else None,
            rss_mb=round(rss_mb(), 1),
        )
