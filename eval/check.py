"""The XLA execution check: run an unmodified script under torch_xla and say whether it really ran on XLA.

`run_check` starts eval/check_runner.py in a sandboxed child process (time and memory limits, its own
temporary working directory), reads the per-step metrics the runner wrote, and grades the run:

- "none": the script did not finish (non-zero exit, a signal, time-out, memory limit); `reasons` says how it
  ended, the last phase it reached and its peak memory;
- "L0": it ran, but something below keeps it from L2 (`reasons` says what). The runner stops a run early
  (fail-fast) when its loop has no step barrier or trains on the CPU instead of the XLA device: that is L0
  with the reason and the loop's line, in seconds instead of a time-out;
- "L2": it ran on the XLA device with no CPU fallback op, no compilation after the warm-up steps, no
  per-step device-to-host transfers, no NaN/Inf, every parameter on the device and every optimizer
  holding the model's own parameters.

The child's working directory is a fresh temporary folder (the script's outputs land there and are
removed); the script's folder is `sys.path[0]` as under `python SCRIPT` and is passed in
`XLAPORT_SCRIPT_DIR`. Pass `workdir=` to run somewhere else, e.g. where relative data paths resolve.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .sandbox import SandboxResult, read_child_file, readable_scratch, run_sandboxed

RUNNER = Path(__file__).with_name("check_runner.py")
TRANSFERS_PER_STEP_LIMIT = 0.5  # the same threshold as torch_xla's own pt-xla-profiler warning
GOOGLE_PCI_VENDOR = "0x1ae0"
ERROR_LINES = 20


@dataclass
class StepStats:
    """What one step (the work up to and including one graph-launching `torch_xla.sync`) cost."""

    index: int
    compiles: int
    compile_s: float
    transfers: int  # device-to-host transfers, not counting those of step closures
    host_reads: int  # aten::_local_scalar_dense (.item(), bool(t), float(t) ...), not counting step closures
    fallbacks: dict[str, int]
    closure_transfers: int  # transfers made by xm.add_step_closure closures (after the graph ran)
    wall_s: float
    sync_site: str | None = None  # file:line of the sync, recorded when the step compiled


@dataclass
class RecompileSource:
    """Compilations after warm-up that share a cause and a source line."""

    location: str | None
    cause: str | None
    compiles: int
    steps: list[int]


@dataclass
class CheckReport:
    script: str
    args: list[str]
    exit_code: int | None
    level: str  # "none", "L0" or "L2"
    reasons: list[str]
    error: str | None
    timed_out: bool
    memory_exceeded: bool
    pjrt_device: str
    torch_xla_imported: bool
    steps: int
    steps_warmup: int
    per_step: list[StepStats]
    fallback_ops: dict[str, int]
    host_reads: int
    compiles_total: int
    compiles_after_warmup: int
    recompile_sources: list[RecompileSource]
    host_transfers_per_step: float | None  # mean over the steps after warm-up; None when there are none
    transfers_total: int
    item_sites: list[dict]  # {"location", "count"}: where .item() read XLA tensors outside step closures
    nan: bool
    nan_details: list[str]
    stale_optimizer_params: list[str]
    params_off_device: list[str]
    wall_s: float
    startup_s: float  # launch until torch_xla was imported (the whole run when it never was)
    compile_s: float  # sum of XLA compile times
    run_s: float  # the rest
    peak_rss_mb: float
    stdout_tail: str = ""
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None  # "no_barrier" or "off_xla" when the runner stopped the run early (fail-fast)
    phase: str = ""  # the last phase the run reached (start-up, step N, exit ...)
    memory_limit_mb: int | None = None
    optimizer_steps: int = 0
    off_xla_optimizer_steps: int = 0  # optimizer steps whose parameters were all off the XLA device
    device_choice: str | None = None  # where the script chose the device its model ended up on (off XLA)

    @property
    def ok(self) -> bool:
        return self.level == "L2"

    def to_dict(self) -> dict:
        return asdict(self)


def default_pjrt_device(env: Mapping[str, str]) -> str:
    """PJRT_DEVICE as given, else TPU when a Google TPU is attached over PCI, else CPU."""
    if env.get("PJRT_DEVICE"):
        return env["PJRT_DEVICE"]
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if Path(vendor).read_text().strip() == GOOGLE_PCI_VENDOR:
                return "TPU"
        except OSError:
            continue
    return "CPU"


def run_check(
    script: Path,
    args: Sequence[str] = (),
    steps_warmup: int = 2,
    timeout_s: float = 600,
    memory_mb: int = 8192,
    env: Mapping[str, str] | None = None,
    workdir: Path | None = None,
    writable: Sequence[Path] = (),
) -> CheckReport:
    """Runs `script` with `args` under torch_xla in a child process and grades what happened. `writable`:
    the caller's scratch folders the child may write (handed over to the sandbox user, see eval/sandbox/)."""
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    if steps_warmup < 0:
        raise ValueError("steps_warmup must be >= 0")
    with tempfile.TemporaryDirectory(prefix="xlaport-check-") as tmp:
        tmp_path = Path(tmp)
        events_file = tmp_path / "events.jsonl"
        debug_file = tmp_path / "pt_xla_debug.txt"
        cwd = Path(workdir) if workdir is not None else tmp_path / "work"
        cwd.mkdir(exist_ok=True)
        merged_env = {**os.environ, **(env or {})}
        child_env = {
            **(env or {}),
            "PJRT_DEVICE": default_pjrt_device(merged_env),
            "XLAPORT_CHECK_OUT": str(events_file),
            "XLAPORT_SCRIPT_DIR": str(script.parent),
            # per-compilation analysis (cause + Python frames) to name the source of recompilations
            "PT_XLA_DEBUG_LEVEL": "1",
            "PT_XLA_DEBUG_FILE": str(debug_file),
            "PT_XLA_DEBUG_MAX_FRAME": "20",
        }
        child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", merged_env.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        launched_at = time.time()
        result = run_sandboxed(
            [sys.executable, str(RUNNER), str(script), *args],
            cwd=cwd,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            env=child_env,
            writable=[tmp_path, *writable],
        )
        events = read_events(events_file)
        debug_text = (read_child_file(debug_file) or b"").decode("utf-8", errors="replace")
        compilations = parse_compilation_analysis(debug_text)
    report = build_report(
        script=script,
        args=list(args),
        steps_warmup=steps_warmup,
        timeout_s=timeout_s,
        result=result,
        events=events,
        compilations=compilations,
        launched_at=launched_at,
        pjrt_device=child_env["PJRT_DEVICE"],
        memory_mb=result.memory_limit_mb,  # the limit that applied (the sandbox may clamp it)
    )
    if not result.sandboxed:
        report.notes.append("not sandboxed: " + "; ".join(result.gaps))
    if result.memory_limit_mb < memory_mb:
        report.notes.append(
            f"memory limit lowered to this machine's {result.memory_limit_mb} MB (asked {memory_mb} MB)"
        )
    if workdir is None and report.error and ("FileNotFoundError" in report.error or "No such file" in report.error):
        report.notes.append(
            "the script ran in a fresh temporary working directory: if it reads files by relative path, "
            "run it with --workdir DIR (workdir= in the API)"
        )
    return report


def check_source(source: str, args: Sequence[str] = (), **kwargs) -> CheckReport:
    """Writes `source` to a temporary `script.py` and checks it (for the HTTP service and the MCP tool)."""
    with readable_scratch("xlaport-source-") as tmp:
        script = Path(tmp) / "script.py"
        script.write_text(source, encoding="utf-8")
        return run_check(script, args, **kwargs)


# --- reading what the child left ----------------------------------------------------------------


def read_events(path: Path) -> list[dict]:
    """The runner's JSON lines; a last line cut short by a kill is dropped."""
    events = []
    for line in (read_child_file(path) or b"").decode("utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


@dataclass
class Compilation:
    cause: str | None
    location: str | None


_FRAME = re.compile(r"^\s*(?P<func>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")


def parse_compilation_analysis(text: str) -> list[Compilation]:
    """One entry per "Compilation Analysis" block of PT_XLA_DEBUG_LEVEL=1 output, in order."""
    prefix = "Compilation Analysis: "
    compilations: list[Compilation] = []
    block: list[str] | None = None
    for raw in text.splitlines():
        if not raw.startswith(prefix):
            continue
        line = raw[len(prefix) :]
        if line.startswith("====="):
            if block is None:
                block = []
            else:
                compilations.append(_compilation_from_block(block))
                block = None
        elif block is not None:
            block.append(line)
    return compilations


def _compilation_from_block(lines: list[str]) -> Compilation:
    cause = None
    frames: list[str] = []
    section = None
    for line in lines:
        stripped = line.strip()
        if stripped == "Compilation Cause":
            section = "cause"
        elif stripped.startswith("Graph Info"):
            section = "graph"
        elif stripped.startswith("Python Frame Triggered Execution"):
            section = "frames"
        elif stripped.startswith("-----"):
            section = None
        elif section == "cause" and cause is None and stripped:
            cause = stripped
        elif section == "frames":
            match = _FRAME.match(line)
            if match:
                frames.append(f"{match['file']}:{match['line']}")
    return Compilation(cause=cause, location=_user_frame(frames))


def _user_frame(frames: list[str]) -> str | None:
    """The innermost frame outside installed packages and the runner: the user's line."""
    for frame in frames:
        if "site-packages" not in frame and RUNNER.name not in frame and not frame.startswith("<frozen"):
            return frame
    return frames[0] if frames else None


# --- grading ------------------------------------------------------------------------------------


def build_report(
    script: Path,
    args: list[str],
    steps_warmup: int,
    timeout_s: float,
    result: SandboxResult,
    events: list[dict],
    compilations: list[Compilation],
    launched_at: float,
    pjrt_device: str,
    memory_mb: int | None = None,
) -> CheckReport:
    process = pick_process(events)
    stopped = next((e for e in events if e["event"] == "stopped"), None)
    imported = next((e for e in events if e["event"] == "torch_xla_imported"), None)
    finished = any(e["event"] == "script_end" and e["pid"] == process.main_pid for e in events)
    end = process.end

    per_step = []
    previous_t = process.imported_t or launched_at
    for index, event in enumerate(process.steps):
        per_step.append(
            StepStats(
                index=index,
                compiles=event["compiles"],
                compile_s=round(event["compile_s"], 4),
                transfers=event["transfers"],
                host_reads=event["host_reads"],
                fallbacks=event["fallbacks"],
                closure_transfers=event["closure_transfers"],
                wall_s=round(event["t"] - previous_t, 4),
                sync_site=event.get("sync_site"),
            )
        )
        previous_t = event["t"]

    totals = end["totals"] if end else _sum_steps(per_step)
    beats = [e for e in events if e["event"] == "heartbeat" and e["pid"] == process.pid]
    if end is None and beats:  # a killed run: its compilations outside the counted steps too
        totals["compiles"] = max(totals["compiles"], beats[-1]["compiles"])
    after_warmup = per_step[steps_warmup:]
    compiles_after_warmup = sum(s.compiles for s in after_warmup)
    transfers_per_step = round(sum(s.transfers for s in after_warmup) / len(after_warmup), 3) if after_warmup else None
    ends = [e for e in events if e["event"] == "end"]
    nan_details = [f"non-finite values in {name}" for e in ends for name in e["nonfinite_tensors"]]
    nan_details += [
        f"the script read {read['value']} at step {read['step']} ({read['site']})"
        for e in ends
        for read in e["nonfinite_reads"]
    ]
    placement = {"stale": [], "off_device": []}
    for event in events:
        if event["event"] == "placement" and event["message"] not in placement[event["kind"]]:
            placement[event["kind"]].append(event["message"])
    notes = [
        f"the NaN/Inf check of the parameters failed: {e['nonfinite_check_error']}"
        for e in ends
        if e.get("nonfinite_check_error")
    ]
    notes += [f"the probe could not be installed: {e['error']}" for e in events if e["event"] == "probe_error"]
    if process.pid != process.main_pid:
        notes.append(
            f"the steps come from worker process {process.pid}; {process.processes_with_steps} process(es) ran steps"
        )

    wall_s = round(result.wall_s, 3)
    startup_s = round(min(imported["t"] - launched_at, wall_s), 3) if imported else wall_s
    compile_s = round(totals["compile_s"], 3)
    optimizer_steps, off_xla_steps = _optimizer_steps(events, process, end)
    report = CheckReport(
        script=str(script),
        args=args,
        exit_code=None if result.timed_out or result.memory_exceeded or stopped else result.returncode,
        level="none",
        reasons=[],
        error=None if stopped else _error_text(result),
        timed_out=result.timed_out,
        memory_exceeded=result.memory_exceeded,
        pjrt_device=pjrt_device,
        torch_xla_imported=imported is not None,
        steps=len(per_step),
        steps_warmup=steps_warmup,
        per_step=per_step,
        fallback_ops=totals["fallbacks"],
        host_reads=totals["host_reads"],
        compiles_total=totals["compiles"],
        compiles_after_warmup=compiles_after_warmup,
        recompile_sources=recompile_sources(per_step, compilations, steps_warmup),
        host_transfers_per_step=transfers_per_step,
        transfers_total=totals["transfers"],
        item_sites=[{"location": site, "count": count} for site, count in (end or {}).get("item_sites", [])],
        nan=bool(nan_details),
        nan_details=nan_details,
        stale_optimizer_params=placement["stale"],
        params_off_device=placement["off_device"],
        wall_s=wall_s,
        startup_s=startup_s,
        compile_s=compile_s,
        run_s=round(max(wall_s - startup_s - compile_s, 0.0), 3),
        peak_rss_mb=round(result.peak_rss_mb, 1),
        stdout_tail="\n".join(result.stdout.strip().splitlines()[-10:]),
        notes=notes,
        stopped=stopped["kind"] if stopped else None,
        phase=last_phase(events, process, finished),
        memory_limit_mb=result.memory_limit_mb or memory_mb,  # the limit applied (clamped to the host)
        optimizer_steps=optimizer_steps,
        off_xla_optimizer_steps=off_xla_steps,
        device_choice=device_choice(events),
    )
    if stopped:
        report.level, report.reasons = "L0", [stopped["reason"]]
        if report.stopped == "off_xla" and report.device_choice:
            report.reasons[0] += f"; the device comes from {report.device_choice}"
        report.notes.append(f"stopped early by the check after {report.wall_s:.1f} s ({report.phase})")
        return report
    if not (result.timed_out or result.memory_exceeded or result.returncode == 0):
        report.notes += _crash_notes(result)
    report.level, report.reasons = grade(report, finished=finished, timeout_s=timeout_s)
    return report


def _optimizer_steps(events: list[dict], process: ProcessEvents, end: dict | None) -> tuple[int, int]:
    """(optimizer steps, those with every parameter off XLA) of the reported process: from its summary, else
    from its last heartbeat (a killed run)."""
    if end is not None:
        return end.get("optimizer_steps", 0), end.get("off_xla_optimizer_steps", 0)
    beats = [e for e in events if e["event"] == "heartbeat" and e["pid"] == process.pid]
    return (beats[-1]["optimizer_steps"], 0) if beats else (0, 0)


def last_phase(events: list[dict], process: ProcessEvents, finished: bool) -> str:
    """How far the run got, in words, from the events it left (for runs that were killed)."""
    kinds = {e["event"] for e in events}
    if finished:
        return "after the script ended"
    if "start" not in kinds:
        return "starting Python (before the check's runner ran)"
    if not any(e["event"] == "torch_xla_imported" for e in events):
        return "running the script, before it imported torch_xla"
    beats = [e for e in events if e["event"] == "heartbeat" and e["pid"] == process.pid]
    beat = beats[-1] if beats else {}
    detail = []
    if beat.get("compiles"):
        detail.append(f"{beat['compiles']} graph compilation(s) so far")
    if beat.get("graph_nodes"):
        detail.append(f"the last graph had {beat['graph_nodes']} nodes")
    if beat.get("optimizer_steps"):
        detail.append(f"{beat['optimizer_steps']} optimizer step(s)")
    where = (
        f"in XLA step {len(process.steps)} ({len(process.steps)} complete)"
        if process.steps
        else "after importing torch_xla, before the first XLA step"
    )
    return where + (": " + ", ".join(detail) if detail else "")


def device_choice(events: list[dict]) -> str | None:
    """`file:line: source` of where the device of a module left off the XLA device was chosen: the (up to three
    nearest) assignments of the name passed to `.to(...)` there, else the `.to(...)` call itself."""
    move = next((e for e in events if e["event"] == "off_xla_move" and e.get("site")), None)
    if move is None:
        return None
    path, _, line = move["site"].rpartition(":")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        call = lines[int(line) - 1]
    except (OSError, ValueError, IndexError):
        return move["site"]
    name = re.search(r"\.to\(\s*([A-Za-z_][\w.]*)\s*[,)]", call)
    found = []
    if name is not None:
        assign = re.compile(rf"^\s*{re.escape(name.group(1))}\s*(?::[^=]*)?=(?!=)")
        found = [n for n in range(int(line) - 1, 0, -1) if assign.match(lines[n - 1])][:3]
    if not found:
        return f"{move['site']}: {call.strip()}"
    where = "; ".join(f"{path}:{n}: {lines[n - 1].strip()}" for n in sorted(found))
    if any("accelerator" in lines[n - 1] or "cuda" in lines[n - 1] for n in found):
        where += " (torch.accelerator and torch.cuda know nothing of XLA: take the device from torch_xla.device())"
    return where


OUT_OF_MEMORY = re.compile(r"LLVM ERROR: out of memory|Cannot allocate memory|std::bad_alloc|RESOURCE_EXHAUSTED", re.I)


def _crash_notes(result: SandboxResult) -> list[str]:
    """What the child's death says beyond its exit code: the signal's name, an out-of-memory message."""
    notes = []
    if result.returncode < 0:
        try:
            notes.append(f"killed by signal {signal.Signals(-result.returncode).name}")
        except ValueError:
            notes.append(f"killed by signal {-result.returncode}")
    oom = OUT_OF_MEMORY.search(result.stderr or "")
    if oom:
        notes.append(f"out of memory: the child printed {oom.group(0)!r}")
    return notes


@dataclass
class ProcessEvents:
    """The events of the one process whose steps the report shows."""

    main_pid: int | None
    pid: int | None
    steps: list[dict]
    end: dict | None
    imported_t: float | None
    processes_with_steps: int


def pick_process(events: list[dict]) -> ProcessEvents:
    """The process that ran the most steps: the runner itself, or a worker of torch_xla.launch / xmp.spawn."""
    main_pid = next((e["pid"] for e in events if e["event"] == "start"), None)
    steps_by_pid: dict[int, list[dict]] = {}
    for event in events:
        if event["event"] == "step":
            steps_by_pid.setdefault(event["pid"], []).append(event)
    pid = max(steps_by_pid, key=lambda p: (len(steps_by_pid[p]), p == main_pid), default=main_pid)
    return ProcessEvents(
        main_pid=main_pid,
        pid=pid,
        steps=steps_by_pid.get(pid, []),
        end=next((e for e in events if e["event"] == "end" and e["pid"] == pid), None),
        imported_t=next((e["t"] for e in events if e["event"] == "torch_xla_imported" and e["pid"] == pid), None),
        processes_with_steps=len(steps_by_pid),
    )


def _sum_steps(per_step: list[StepStats]) -> dict:
    """Totals from the steps alone, for a run killed before the runner's summary."""
    fallbacks: dict[str, int] = {}
    for step in per_step:
        for op, n in step.fallbacks.items():
            fallbacks[op] = fallbacks.get(op, 0) + n
    return {
        "compiles": sum(s.compiles for s in per_step),
        "compile_s": sum(s.compile_s for s in per_step),
        "transfers": sum(s.transfers + s.closure_transfers for s in per_step),
        "host_reads": sum(s.host_reads for s in per_step),
        "fallbacks": fallbacks,
    }


def _error_text(result: SandboxResult) -> str | None:
    if result.timed_out or result.memory_exceeded:
        return result.describe_failure()
    if result.returncode == 0:
        return None
    lines = (result.stderr or result.stdout).rstrip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    tail = _without_runner_frames(lines[starts[-1] :]) if starts else lines
    return "\n".join(tail[-ERROR_LINES:]) or f"exit code {result.returncode}"


def _without_runner_frames(traceback_lines: list[str]) -> list[str]:
    """Drops the runner's and runpy's frames (and their source lines) from a traceback."""
    kept: list[str] = []
    skip_source = False
    for line in traceback_lines:
        is_frame = line.startswith('  File "')
        if is_frame:
            skip_source = str(RUNNER) in line or '"<frozen runpy>"' in line
            if skip_source:
                continue
        elif skip_source and line.startswith("    "):
            continue
        else:
            skip_source = False
        kept.append(line)
    return kept


def recompile_sources(
    per_step: list[StepStats], compilations: list[Compilation], steps_warmup: int
) -> list[RecompileSource]:
    """Groups the compilations of the steps after warm-up by (source line, cause).

    The debug file lists compilations in the order they happened, the same order the steps count
    them in, so the k-th compilation belongs to the step whose running count covers k.
    """
    groups: dict[tuple[str | None, str | None], RecompileSource] = {}
    position = 0
    for step in per_step:
        for k in range(position, position + step.compiles):
            if step.index < steps_warmup:
                continue
            known = compilations[k] if k < len(compilations) else Compilation(None, step.sync_site)
            key = (known.location or step.sync_site, known.cause)
            source = groups.setdefault(key, RecompileSource(location=key[0], cause=key[1], compiles=0, steps=[]))
            source.compiles += 1
            if step.index not in source.steps:
                source.steps.append(step.index)
        position += step.compiles
    return sorted(groups.values(), key=lambda s: -s.compiles)


def _counts(ops: Mapping[str, int]) -> str:
    return ", ".join(f"{op}×{n}" for op, n in sorted(ops.items(), key=lambda item: -item[1]))


# Post-warm-up steps that compile before it counts as repeated compilation (C4).
REPEATED_COMPILE_STEPS = 3


def grade(report: CheckReport, finished: bool, timeout_s: float) -> tuple[str, list[str]]:
    """The level and, when it is not L2, the reasons in plain sentences."""
    where = f"last phase: {report.phase}; peak memory {report.peak_rss_mb:.0f} MB"
    if report.timed_out:
        return "none", [f"did not finish: timed out after {timeout_s:g} s ({report.steps} step(s) done; {where})"]
    if report.memory_exceeded:
        return "none", [
            f"did not finish: killed by the memory limit of {report.memory_limit_mb} MB "
            f"(peak {report.peak_rss_mb:.0f} MB; last phase: {report.phase})"
        ]
    if report.exit_code != 0:
        killed = [n for n in report.notes if n.startswith(("killed by signal", "out of memory"))]
        if killed:
            return "none", [f"exited with code {report.exit_code}: {'; '.join(killed)} ({where})"]
        last = (report.error or "").strip().splitlines()[-1:] or ["no error text"]
        return "none", [f"exited with code {report.exit_code}: {last[0]}"]

    reasons = []
    on_cpu = report.steps == 0 and 0 < report.optimizer_steps == report.off_xla_optimizer_steps
    if not report.torch_xla_imported:
        reasons.append("the script never imported torch_xla, so nothing ran on the XLA device")
    elif not finished:
        reasons.append("the run left no summary (did the script end with os._exit?); the numbers are partial")
    if on_cpu:
        reasons.append(
            f"ran on the CPU, not on the XLA device: {report.optimizer_steps} optimizer step(s) updated parameters "
            "that are not on the XLA device, and no XLA graph ran"
            + (f"; the device comes from {report.device_choice}" if report.device_choice else "")
        )
    elif report.torch_xla_imported and report.steps == 0:
        reasons.append(
            "no XLA step was seen (no torch_xla.sync(), xm.mark_step(), MpDeviceLoader batch or "
            "xm.optimizer_step(..., barrier=True)); without a step barrier the graph grows without end"
        )
    elif 0 < report.steps <= report.steps_warmup:
        reasons.append(
            f"only {report.steps} step(s) ran, not more than the {report.steps_warmup} warm-up step(s), "
            "so recompilation after warm-up cannot be judged"
        )
    if report.fallback_ops:
        reasons.append(
            f"{sum(report.fallback_ops.values())} op call(s) fell back to the CPU ({_counts(report.fallback_ops)}): "
            "each one copies tensors to the host and back; rewrite them with lowered ops"
        )
    steps_with = [s.index for s in report.per_step[report.steps_warmup :] if s.compiles]
    if steps_with and len(steps_with) < REPEATED_COMPILE_STEPS:
        # a new graph that appears once and is then cached (DDP's bucket rebuild, the first evaluation)
        # costs one compile; recompilation is a compile that keeps coming back
        report.notes.append(
            f"{report.compiles_after_warmup} new graph(s) after warm-up at step(s) {_step_list(steps_with)}, "
            "then cached: not repeated compilation"
        )
    elif steps_with:
        after = len(report.per_step) - report.steps_warmup
        where = report.recompile_sources[0].location if report.recompile_sources else None
        reasons.append(
            f"repeated compilation: {report.compiles_after_warmup} graph compilation(s) after the "
            f"{report.steps_warmup} warm-up step(s), in {len(steps_with)} of {after} step(s)"
            + (f", first from {where}" if where else "")
            + "; shapes or Python values change from step to step (pad to fixed sizes)"
        )
    after_warmup = report.per_step[report.steps_warmup :]
    # A sync is a stall of the step, however many tensors it copies: a checkpoint every N steps
    # copies many tensors once, `.item()` every step stalls every step.
    syncing_steps = sum(1 for s in after_warmup if s.transfers)
    if after_warmup and syncing_steps / len(after_warmup) > TRANSFERS_PER_STEP_LIMIT:
        host_reads_after = sum(s.host_reads for s in after_warmup)
        reasons.append(
            f"per-step host syncs: {syncing_steps} of {len(after_warmup)} steps after warm-up copy values to the "
            f"host ({report.host_transfers_per_step:g} transfer(s) per step, {host_reads_after} of them "
            ".item()/bool()-style host reads"
            + (", the rest from the CPU fallback ops" if report.fallback_ops else "")
            + ")"
            + (f", .item() mostly at {report.item_sites[0]['location']}" if report.item_sites else "")
            + "; each one waits for the device. Log with xm.add_step_closure or every N steps"
        )
    if report.nan:
        reasons.append("NaN/Inf: " + "; ".join(report.nan_details[:5]))
    if report.stale_optimizer_params:
        reasons.append(
            "the optimizer does not hold the model's parameters, so training changes nothing "
            "(build it after model.to(device)): " + "; ".join(report.stale_optimizer_params)
        )
    if report.params_off_device and not on_cpu:
        reasons.append("parameters not on the XLA device: " + "; ".join(report.params_off_device))
    return ("L0", reasons) if reasons else ("L2", [])


# --- text ---------------------------------------------------------------------------------------


def render_text(report: CheckReport) -> str:
    lines = [
        f"xlaport check {report.script} {' '.join(report.args)}".rstrip(),
        f"  level: {report.level}   exit code: {report.exit_code}   device: PJRT_DEVICE={report.pjrt_device}",
        f"  time: {report.wall_s:.1f} s = start-up {report.startup_s:.1f} s + compile {report.compile_s:.1f} s "
        f"+ run {report.run_s:.1f} s   (peak memory {report.peak_rss_mb:.0f} MB)",
        f"  steps: {report.steps} ({report.steps_warmup} warm-up)   compiles: {report.compiles_total} "
        f"({report.compiles_after_warmup} after warm-up)",
        "  per-step compiles: "
        + (" ".join(str(s.compiles) for s in report.per_step[:40]) or "-")
        + (" ..." if report.steps > 40 else ""),
        f"  host transfers per step after warm-up: {_or_dash(report.host_transfers_per_step)}   "
        f"host reads (total): {report.host_reads}   transfers (total): {report.transfers_total}",
        "  CPU fallback ops: " + (_counts(report.fallback_ops) or "none"),
        "  .item() on XLA tensors: "
        + (", ".join(f"{site['location']}×{site['count']}" for site in report.item_sites) or "none"),
        "  NaN/Inf: " + ("; ".join(report.nan_details) if report.nan else "none"),
        "  stale optimizer params: " + ("; ".join(report.stale_optimizer_params) or "none"),
        "  params off the XLA device: " + ("; ".join(report.params_off_device) or "none"),
    ]
    if report.level == "none" or report.stopped:
        lines.append(f"  last phase reached: {report.phase}")
    for source in report.recompile_sources:
        lines.append(
            f"  recompiled {source.compiles}× at {source.location or '?'} ({source.cause or 'cause unknown'}), "
            f"steps {_step_list(source.steps)}"
        )
    if report.reasons:
        lines.append("  why not L2:")
        lines.extend(f"    - {reason}" for reason in report.reasons)
    lines.extend(f"  note: {note}" for note in report.notes)
    if report.error:
        lines.append("  error:")
        lines.extend("    " + line for line in report.error.splitlines())
    return "\n".join(lines)


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _step_list(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:10])
    return shown + (", ..." if len(steps) > 10 else "")
