"""The XLA execution check: run an unmodified script under torch_xla and say whether it really ran on XLA.

`run_check` (run.py) starts runner.py in a sandboxed child process (time and memory limits, its own
temporary working directory), reads the per-step metrics the runner wrote, and grades the run:

- "none": the script did not finish (non-zero exit, a signal, time-out, memory limit); `reasons` says how it
  ended, the last phase it reached and its peak memory;
- "L0": it ran, but something below keeps it from L2 (`reasons` says what). The runner stops a run early
  (fail-fast) when its loop has no step barrier or trains on the CPU instead of the XLA device: that is L0
  with the reason and the loop's line, in seconds instead of a time-out;
- "L2" (execution integrity, as the study defines it): it ran on the XLA device with no CPU fallback op, no
  repeated compilation after the warm-up steps, no NaN/Inf, every parameter on the device, every optimizer
  holding the model's own parameters and no weight tie lost.

What costs time without changing the computation is reported in `performance`, never a reason for L0: host
syncs (per site: every step with its share of the step time, or per event for an evaluation or a checkpoint),
new graphs after warm-up that are then cached, slow steps; and `time_split` says where the step time went
(tracing and dispatch, compilation, host waits, device execution).

With `workdir=` (the CLI: the caller's folder) the child runs there as `python SCRIPT` would, seeing its
project through a private writable view (the user's files are never changed; the report says what the run
wrote). Without it the working directory is a fresh temporary folder (submitted code). The script's folder is
`sys.path[0]` as under `python SCRIPT` and is passed in `XLAPORT_SCRIPT_DIR`.

Files: `run.py` starts the child, `runner.py` and `probe.py` are the child side, `events.py` reads what it
left, `grade.py` builds and grades the report, `report.py` is the report type and its text, `cli.py` the
`xlaport check` command.
"""

from .events import parse_compilation_analysis, read_events
from .grade import build_report, grade
from .report import (
    CheckReport,
    PerformanceFinding,
    RecompileSource,
    StepStats,
    TimeSplit,
    performance_lines,
    render_text,
)
from .run import check_source, default_pjrt_device, run_check

__all__ = [
    "CheckReport",
    "PerformanceFinding",
    "RecompileSource",
    "StepStats",
    "TimeSplit",
    "build_report",
    "check_source",
    "default_pjrt_device",
    "grade",
    "parse_compilation_analysis",
    "performance_lines",
    "read_events",
    "render_text",
    "run_check",
]
