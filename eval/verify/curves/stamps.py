"""Per-line timestamps of a run's stdout, for the step time."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .capture import loss_lines

# Installed as `sitecustomize` in the child (through PYTHONPATH): copies every stdout line, with the time it was
# written, to $XLAPORT_STAMPS, and every stderr line to $XLAPORT_STAMPS_ERR (Python `logging` and tqdm write there).
# A carriage return ends a line too: tqdm redraws its bar (and its `loss=` postfix) with `\r`, never `\n`.
# It only observes output; the script computes the same.
STAMP_SITECUSTOMIZE = """
import os, re, sys, time
class _Stamped:
    def __init__(self, inner, log):
        self._inner, self._log, self._pending = inner, log, ""
    def write(self, text):
        self._pending += text
        *lines, self._pending = re.split("\\r\\n|\\r|\\n", self._pending)
        now = time.monotonic()
        for line in lines:
            if line.strip():
                self._log.write(f"{now:.6f}\\t{line}\\n")
        if lines:
            self._log.flush()
        return self._inner.write(text)
    def __getattr__(self, name):
        return getattr(self._inner, name)
for _name, _var in (("stdout", "XLAPORT_STAMPS"), ("stderr", "XLAPORT_STAMPS_ERR")):
    _path = os.environ.get(_var)
    if _path:
        _log = open(_path, "a", encoding="utf-8", buffering=1)
        _log.write(f"{time.monotonic():.6f}\\t#xlaport-start\\n")
        setattr(sys, _name, _Stamped(getattr(sys, _name), _log))
"""

STAMP_START = "#xlaport-start"


@dataclass
class Timing:
    """Start-up time (process start to the first loss line) and seconds per step after warm-up."""

    startup_s: float | None = None
    step_s: float | None = None
    per_step_s: list[float] = field(default_factory=list)  # time between consecutive loss lines, per step


def parse_stamps(text: str, loss_pattern: str | None = None, warmup: int = 2) -> tuple[str, Timing]:
    """(stdout text, timing) from a stamp file written by STAMP_SITECUSTOMIZE."""
    lines, times, start = [], [], None
    for raw in text.splitlines():
        stamp, _, line = raw.partition("\t")
        try:
            when = float(stamp)
        except ValueError:
            continue
        if line == STAMP_START:
            start = when if start is None else start
            continue
        lines.append(line)
        times.append(when)
    loss_times, loss_steps = [], []
    for index, step, _ in loss_lines(lines, loss_pattern):
        loss_times.append(times[index])
        loss_steps.append(step if step is not None else len(loss_steps))
    timing = Timing()
    if start is not None and loss_times:
        timing.startup_s = loss_times[0] - start
    for i in range(1, len(loss_times)):
        gap = max(loss_steps[i] - loss_steps[i - 1], 1)
        timing.per_step_s.append((loss_times[i] - loss_times[i - 1]) / gap)
    steady = timing.per_step_s[warmup:] or timing.per_step_s
    if steady:
        timing.step_s = float(np.median(steady))
    return "\n".join(lines), timing
