"""The probe's host reads: every read of an XLA tensor's value on the host (`.item()`, `print`, `.cpu()`, ...),
counted, timed and located per step, and the non-finite values the script itself read."""

from __future__ import annotations

import functools
import math
import sys
import threading
import time
from typing import Protocol

from xlaport.eval.check.events import GRAD_SCALER_READ
from xlaport.eval.check.probe_sites import in_grad_scaler, user_site

MAX_LISTED = 10
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


class StepState(Protocol):
    """What a read needs of the step counters (probe.py `Probe`)."""

    in_sync: bool  # a sync is running: step closures read finished values, not the script
    steps: int

    def compile_ns(self) -> float: ...


class HostReads:
    """The script's host reads of XLA tensors, for the step that is running and in total."""

    def __init__(self, probe: StepState) -> None:
        self.probe = probe
        self.item_sites: dict[str | None, int] = {}  # where the script reads XLA tensors on the host
        self.last_read_site: str | None = None  # the latest of them
        self.reading = threading.local()  # .active: this thread is inside a counted read, whose own reads are its
        self.step_reads: dict[tuple[str | None, str], list] = {}  # (site, kind) -> [reads, wait s] this step
        self.host_wait_s = 0.0  # running total of main-thread time blocked in host reads (compiles excluded)
        self.host_wait_at_boundary = 0.0
        self.nonfinite_reads: list[dict] = []

    def take_reads(self) -> list[dict]:
        """The host reads since the last step, one entry per (site, kind), and starts counting afresh."""
        reads = [
            {"site": site, "kind": kind, "count": n, "wait_s": round(wait, 6)}
            for (site, kind), (n, wait) in self.step_reads.items()
        ]
        self.step_reads = {}
        return reads

    def wrap_read(self, original, kind: str):
        """Counts, times and locates a host read of an XLA tensor made through `original` (a Tensor method)."""
        reads, probe = self, self.probe

        @functools.wraps(original)
        def read(tensor, *args, **kwargs):
            device = getattr(tensor, "device", None)
            if getattr(reads.reading, "active", False) or device is None or device.type != "xla":
                return original(tensor, *args, **kwargs)
            reads.reading.active = True
            start, compile_start = time.perf_counter(), probe.compile_ns()
            try:
                value = original(tensor, *args, **kwargs)
            finally:
                reads.reading.active = False
            if kind == "cpu" and getattr(value, "device", None) is not None and value.device.type == "xla":
                return value  # `.to(...)` that stays on the device: not a read
            # the compile a read triggers is compilation, not waiting: only the rest counts as the host's wait
            wait = max(time.perf_counter() - start - (probe.compile_ns() - compile_start) / 1e9, 0.0)
            reads.host_wait_s += wait
            if not probe.in_sync:  # step closures run inside the sync on finished values: not the script's reads
                site = user_site()
                if site is not None and in_grad_scaler(sys._getframe(1)):
                    site += GRAD_SCALER_READ
                entry = reads.step_reads.setdefault((site, kind), [0, 0.0])
                entry[0] += 1
                entry[1] += wait
                reads.item_sites[site] = reads.item_sites.get(site, 0) + 1
                reads.last_read_site = site
            if (
                kind in ("item", "float")
                and isinstance(value, float)
                and not math.isfinite(value)
                and len(reads.nonfinite_reads) < MAX_LISTED
            ):
                reads.nonfinite_reads.append({"step": probe.steps, "value": repr(value), "site": user_site()})
            return value

        return read
