"""From the child's events to a graded `CheckReport`: the level ("none", "L0", "L2") and the reasons."""

from __future__ import annotations

import re
import signal
import statistics
from pathlib import Path

from ..sandbox import SandboxResult
from .crash import EXCEPTION_LINE, Explain, crash_reason, error_line
from .events import (
    CHILD_FILES,
    GRAD_SCALER_READ,
    Compilation,
    ProcessEvents,
    device_choice,
    last_phase,
    pick_process,
    recompile_sources,
)
from .probe_placement import KEPT_LIST_MARK
from .report import CheckReport, PerformanceFinding, StepStats, TimeSplit, op_counts, step_list

# Loss scaling reads its inf check on the host before every step: nothing in torch 2.9 / torch_xla 2.9 does it
# on the device (torch_xla has no GradScaler; torch's scaler does not use torch_xla's syncfree optimizers).
GRAD_SCALER_FIX = (
    "loss scaling costs one host sync per step on XLA, and removing it changes the numbers, so the default "
    "migration keeps it. `xlaport migrate --unsafe-fixes` applies XLA501 (bfloat16 autocast) and XLA502 (no "
    'GradScaler: bfloat16 needs no loss scaling), or with accelerate XLA302 (mixed_precision "bf16"), which '
    "makes the step sync-free; check the numerics after"
)
# Each kind of host read (probe.READ_METHODS): how the report names it, and the kb entry and fix that remove it.
READ_KINDS = {
    "item": ("`.item()`", "XLA401", "read it in a step closure, xm.add_step_closure(...), or only every N steps"),
    "float": ("`float()` of a tensor", "XLA402", "keep the value on the device; read it in a step closure"),
    "int": ("`int()` of a tensor", "XLA402", "keep the value on the device; read it in a step closure"),
    "bool": (
        "`bool()` of a tensor (an `if` on a device value)",
        "XLA405",
        "decide on the device (torch.where, a mask) or once before the loop",
    ),
    "print": ("printing a tensor", "XLA403", "print from xm.add_step_closure(...) or only every N steps"),
    "cpu": ("a copy to the host (`.cpu()` / `.to('cpu')`)", "XLA404", "copy every N steps or in a step closure"),
    "tolist": ("`.tolist()`", "XLA404", "copy every N steps or in a step closure"),
    "numpy": ("`.numpy()`", "XLA404", "copy every N steps or in a step closure"),
}
# A site that reads in more than this share of the steps after warm-up costs every step; below it, its reads are
# events (an evaluation or a checkpoint every N steps). The same threshold as torch_xla's pt-xla-profiler warning.
EVERY_STEP_SHARE = 0.5
SLOW_STEP_FACTOR = 3  # a step this many times the typical (median) one, and SLOW_STEP_MIN_S more, is reported
SLOW_STEP_MIN_S = 0.05
ERROR_LINES = 20


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
    explain: Explain | None = None,
) -> CheckReport:
    """The report of one run. `explain`: names the kb entries whose symptom an error matches (crash.py)."""
    process = pick_process(events)
    stopped = next((e for e in events if e["event"] == "stopped"), None)
    imported = next((e for e in events if e["event"] == "torch_xla_imported"), None)
    finished = any(e["event"] == "script_end" and e["pid"] == process.main_pid for e in events)
    end = process.end

    per_step = []
    previous_t = process.imported_t or launched_at
    for index, event in enumerate(process.steps):
        wall, host_wait = event["t"] - previous_t, event.get("host_wait_s", 0.0)
        per_step.append(
            StepStats(
                index=index,
                compiles=event["compiles"],
                compile_s=round(event["compile_s"], 4),
                transfers=event["transfers"],
                host_reads=event["host_reads"],
                fallbacks=event["fallbacks"],
                closure_transfers=event["closure_transfers"],
                wall_s=round(wall, 4),
                sync_site=event.get("sync_site"),
                trace_s=round(max(wall - event["compile_s"] - host_wait, 0.0), 4),
                host_wait_s=round(host_wait, 4),
                execute_s=round(event.get("execute_s", 0.0), 4),
                reads=event.get("reads", []),
            )
        )
        previous_t = event["t"]

    totals = end["totals"] if end else _sum_steps(per_step)
    beats = [e for e in events if e["event"] == "heartbeat" and e["pid"] == process.pid]
    if end is None and beats:  # a killed run: its compilations outside the counted steps too
        totals["compiles"] = max(totals["compiles"], beats[-1]["compiles"])
    after_warmup = per_step[steps_warmup:]
    compiles_after_warmup = sum(s.compiles for s in after_warmup)
    transfers_per_step = statistics.median(s.transfers for s in after_warmup) if after_warmup else None
    ends = [e for e in events if e["event"] == "end"]
    nan_details = [f"non-finite values in {name}" for e in ends for name in e["nonfinite_tensors"]]
    nan_details += [
        f"the script read {read['value']} at step {read['step']} ({read['site']})"
        for e in ends
        for read in e["nonfinite_reads"]
    ]
    placement = {"stale": [], "off_device": [], "untied": []}
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
        lost_ties=placement["untied"],
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
        device_choice=device_choice(events, args),
        time_split=time_splits(per_step, steps_warmup),
    )
    report.performance = performance_findings(report, (end or {}).get("reads_after_last_step", []))
    if stopped:
        report.level, report.reasons = "L0", [stopped["reason"]]
        if report.stopped == "off_xla" and report.device_choice:
            report.reasons[0] += f"; the device comes from {report.device_choice}"
        report.notes.append(f"stopped early by the check after {report.wall_s:.1f} s ({report.phase})")
        return report
    if not (result.timed_out or result.memory_exceeded or result.returncode == 0):
        report.notes += _crash_notes(result)
    report.level, report.reasons = grade(report, finished=finished, timeout_s=timeout_s)
    if (note := tpu_only_fallback_note(report)) is not None:
        report.notes.append(note)
    if report.level == "none" and report.exit_code and report.reasons:
        crash = crash_reason(report.error, explain)
        if crash:
            report.reasons[0] += f" ({crash})"
    return report


def _optimizer_steps(events: list[dict], process: ProcessEvents, end: dict | None) -> tuple[int, int]:
    """(optimizer steps, those with every parameter off XLA) of the reported process: from its summary, else
    from its last heartbeat (a killed run)."""
    if end is not None:
        return end.get("optimizer_steps", 0), end.get("off_xla_optimizer_steps", 0)
    beats = [e for e in events if e["event"] == "heartbeat" and e["pid"] == process.pid]
    return (beats[-1]["optimizer_steps"], 0) if beats else (0, 0)


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
    raised = _exception_index(tail)
    if raised is not None and raised < len(tail) - ERROR_LINES:
        # a message longer than the kept lines (a dispatcher error lists every backend): keep up to its first line
        kept = [*tail[max(0, raised + 1 - ERROR_LINES) : raised + 1], f"  ... ({len(tail) - raised - 1} more lines)"]
    else:
        kept = tail[-ERROR_LINES:]
    user = _deepest_user_frame(tail)
    if user is not None and user[0] not in kept:  # deep library frames pushed the user's line out: keep it
        kept = [*user, "  ...", *kept]
    return "\n".join(kept) or f"exit code {result.returncode}"


def _exception_index(traceback_lines: list[str]) -> int | None:
    """Where the raised exception's own line is: the first one after the last frame that names an exception."""
    frames = [i for i, line in enumerate(traceback_lines) if _FRAME.match(line)]
    start = frames[-1] + 1 if frames else 0
    for i in range(start, len(traceback_lines)):
        if EXCEPTION_LINE.match(traceback_lines[i]):
            return i
    return None


_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line (?P<line>\d+)')
_LIBRARY = ("site-packages", "dist-packages", "/lib/python3", "<frozen")


def _deepest_user_frame(traceback_lines: list[str]) -> tuple[str, ...] | None:
    """The traceback's deepest frame in the user's code (not a library's, not Python's), with its source line."""
    for i in range(len(traceback_lines) - 1, -1, -1):
        frame = _FRAME.match(traceback_lines[i])
        if frame and not any(part in frame["path"] for part in _LIBRARY):
            source = traceback_lines[i + 1 : i + 2]
            return (traceback_lines[i], *(s for s in source if not _FRAME.match(s)))
    return None


def failing_line(error: str | None, script: str) -> str | None:
    """Where the user's code failed: `path:line` (relative to the script's folder when below it) and the
    line's text, from the deepest frame of the error's traceback in the user's code; None without one."""
    user = _deepest_user_frame((error or "").splitlines())
    if user is None:
        return None
    frame = _FRAME.match(user[0])
    path = Path(frame["path"])
    try:
        shown = path.relative_to(Path(script).parent)
    except ValueError:
        shown = Path(path.name)
    text = user[1].strip() if len(user) > 1 else ""
    return f"{shown}:{frame['line']}" + (f" `{text}`" if text else "")


def _without_runner_frames(traceback_lines: list[str]) -> list[str]:
    """Drops the runner's and runpy's frames (and their source lines) from a traceback."""
    kept: list[str] = []
    skip_source = False
    for line in traceback_lines:
        is_frame = line.startswith('  File "')
        if is_frame:
            skip_source = any(own in line for own in CHILD_FILES) or '"<frozen runpy>"' in line
            if skip_source:
                continue
        elif skip_source and line.startswith("    "):
            continue
        else:
            skip_source = False
        kept.append(line)
    return kept


# Post-warm-up steps that compile before it counts as repeated compilation (C4).
REPEATED_COMPILE_STEPS = 3
# Cached steps after the last compile that show a late phase settled (at least twice its compiling steps).
SETTLE_STEPS = 4


def loop_warmup_steps(report: CheckReport) -> set[int]:
    """Post-warm-up steps that are another loop's own warm-up: the first `steps_warmup` compiling steps at a step
    barrier (sync site) that none of the run's warm-up steps reached. A GAN steps its generator's optimizer at
    its own barrier, after n critic steps: that optimizer's graphs without and with its state compile after the
    run's warm-up. A barrier that is not named (None) is no loop of its own."""
    seen: dict[str, int] = {}
    own: set[int] = set()
    warmup_sites = {s.sync_site for s in report.per_step[: report.steps_warmup]}
    for step in report.per_step[report.steps_warmup :]:
        site = step.sync_site
        if not step.compiles or site is None or site in warmup_sites:
            continue
        seen[site] = seen.get(site, 0) + 1
        if seen[site] <= report.steps_warmup:
            own.add(step.index)
    return own


def compiles_keep_coming(report: CheckReport) -> bool:
    """Repeated compilation: post-warm-up steps compiled REPEATED_COMPILE_STEPS times or more, still in the second
    half of those steps, and not settled since (a second optimizer's loop has its own warm-up: loop_warmup_steps).
    New graphs of a first epoch's end (a partial last batch, an epoch-end metric) compile a few times early and are
    then cached: that settles, and is a performance finding, not a reason to refuse L2. So does a late phase (generation after training) whose few new graphs are followed
    by cached steps: at least SETTLE_STEPS of them and twice its compiling steps. A shape that changes from step to
    step keeps compiling to the end."""
    after = report.per_step[report.steps_warmup :]
    own_warmup = loop_warmup_steps(report)
    compiled = [i for i, s in enumerate(after) if s.compiles and s.index not in own_warmup]
    if len(compiled) < REPEATED_COMPILE_STEPS or compiled[-1] < len(after) // 2:
        return False
    late = sum(1 for i in compiled if i >= len(after) // 2)
    cached_since = len(after) - 1 - compiled[-1]
    return cached_since < max(SETTLE_STEPS, 2 * late)


# Ops torch_xla lowers on TPU only: on any other PJRT device (XLA:CPU here) they call the CPU fallback
# (torch_xla/csrc/aten_xla_type.cpp: "Only the XLA TPU backend for now implements the CustomCall required by our
# XLA lowering"). The backward of nearest and bilinear upsampling: every U-Net decoder's.
TPU_ONLY_LOWERINGS = frozenset({"aten::upsample_nearest2d_backward", "aten::upsample_bilinear2d_backward"})


def target_fallbacks(report: CheckReport) -> dict[str, int]:
    """The fallbacks the program would also take on a TPU: those of a TPU run, else all but TPU_ONLY_LOWERINGS."""
    if report.pjrt_device.upper() == "TPU":
        return dict(report.fallback_ops)
    return {op: n for op, n in report.fallback_ops.items() if op not in TPU_ONLY_LOWERINGS}


def tpu_only_fallback_note(report: CheckReport) -> str | None:
    """What a run off TPU says of the fallbacks a TPU does not take (they are not a reason to refuse L2)."""
    only_here = {op: n for op, n in report.fallback_ops.items() if op not in target_fallbacks(report)}
    if not only_here:
        return None
    return (
        f"{op_counts(only_here)} fell back to the CPU on PJRT_DEVICE={report.pjrt_device} only: torch_xla lowers "
        "these on TPU (not a reason to refuse L2; the step times here include the copies)"
    )


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
        last = error_line(report.error) or "no error text"
        where = failing_line(report.error, report.script)
        return "none", [f"exited with code {report.exit_code}: {last}" + (f" (at {where})" if where else "")]

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
    fallbacks = target_fallbacks(report)
    if fallbacks:
        reasons.append(
            f"{sum(fallbacks.values())} op call(s) fell back to the CPU ({op_counts(fallbacks)}): "
            "each one copies tensors to the host and back; rewrite them with lowered ops"
        )
    steps_with = [s.index for s in report.per_step[report.steps_warmup :] if s.compiles]
    # a new graph that appears once and is then cached (DDP's bucket rebuild, the first evaluation) costs one
    # compile, a performance finding; recompilation is a compile that keeps coming back
    if compiles_keep_coming(report):
        after = len(report.per_step) - report.steps_warmup
        where = report.recompile_sources[0].location if report.recompile_sources else None
        reasons.append(
            f"repeated compilation: {report.compiles_after_warmup} graph compilation(s) after the "
            f"{report.steps_warmup} warm-up step(s), in {len(steps_with)} of {after} step(s)"
            + (f", first from {where}" if where else "")
            + "; shapes or Python values change from step to step (pad to fixed sizes)"
        )
    # Host syncs (.item() logging, GradScaler's inf check, a checkpoint) cost time but do not change what is
    # computed: they are performance findings (report.performance), never a reason to refuse L2.
    if report.nan:
        reasons.append("NaN/Inf: " + "; ".join(report.nan_details[:5]))
    if report.stale_optimizer_params:
        # a group from a list the module kept before the move names its own fix; the others: build it after
        plain = any(KEPT_LIST_MARK not in message for message in report.stale_optimizer_params)
        reasons.append(
            "the optimizer does not hold the model's parameters, so training changes nothing"
            + (" (build it after model.to(device))" if plain else "")
            + ": "
            + "; ".join(report.stale_optimizer_params)
        )
    if report.params_off_device and not on_cpu:
        reasons.append("parameters not on the XLA device: " + "; ".join(report.params_off_device))
    if report.lost_ties:
        reasons.append("tied weights lost: " + "; ".join(report.lost_ties))
    return ("L0", reasons) if reasons else ("L2", [])


def time_splits(per_step: list[StepStats], steps_warmup: int) -> list[TimeSplit]:
    """Where the steps' time went, over all steps and over the steps after warm-up (when there are any)."""
    scopes = [("all steps", per_step), ("after warm-up", per_step[steps_warmup:])]
    return [
        TimeSplit(
            scope=scope,
            steps=len(steps),
            wall_s=round(sum(s.wall_s for s in steps), 4),
            trace_s=round(sum(s.trace_s for s in steps), 4),
            compile_s=round(sum(s.compile_s for s in steps), 4),
            host_wait_s=round(sum(s.host_wait_s for s in steps), 4),
            execute_s=round(sum(s.execute_s for s in steps), 4),
        )
        for scope, steps in scopes
        if steps
    ]


def performance_findings(report: CheckReport, reads_after_last_step: list[dict]) -> list[PerformanceFinding]:
    """Host syncs per site, compiles after warm-up that were then cached, and slow steps; per-step costs first,
    then by the time they cost."""
    findings = _host_sync_findings(report, reads_after_last_step)
    findings += _compile_findings(report)
    findings += _slow_step_findings(report)
    return sorted(findings, key=lambda f: (not f.every_step, -f.cost_s))


def _host_sync_findings(report: CheckReport, reads_after_last_step: list[dict]) -> list[PerformanceFinding]:
    """One finding per site that read device values on the host: every step (its share of the step time), or
    as events (an evaluation or a checkpoint every N steps, once after the last step), each listed as such."""
    after_warmup = report.per_step[report.steps_warmup :]
    step_time = sum(s.wall_s for s in after_warmup)
    by_site: dict[str | None, dict] = {}
    for step, reads in [(s.index, s.reads) for s in report.per_step] + [(None, reads_after_last_step)]:
        for read in reads:
            site = by_site.setdefault(read["site"], {"kinds": {}, "steps": [], "count": 0, "wait_s": 0.0, "after": 0.0})
            site["kinds"][read["kind"]] = site["kinds"].get(read["kind"], 0) + read["count"]
            site["count"] += read["count"]
            site["wait_s"] += read["wait_s"]
            if step is not None and step not in site["steps"]:
                site["steps"].append(step)
            if step is not None and step >= report.steps_warmup:
                site["after"] += read["wait_s"]
    findings = []
    after_last = {r["site"] for r in reads_after_last_step}
    for location, site in by_site.items():
        read_after_last_step = location in after_last  # by the recorded site, before the scaler's is renamed
        kind = max(site["kinds"], key=site["kinds"].get)
        label, code, fix = READ_KINDS.get(kind, READ_KINDS["item"])
        if location is not None and location.endswith(GRAD_SCALER_READ):
            location = location.removesuffix(GRAD_SCALER_READ)
            label, code, fix = "GradScaler's inf check (`scaler.step`)", "XLA502", GRAD_SCALER_FIX
        steps_after = [i for i in site["steps"] if i >= report.steps_warmup]
        every_step = bool(after_warmup) and len(steps_after) / len(after_warmup) > EVERY_STEP_SHARE
        events = len(site["steps"]) + read_after_last_step
        if every_step:
            when = (
                "every step"
                if len(steps_after) == len(after_warmup)
                else f"in {len(steps_after)} of {len(after_warmup)} steps after warm-up"
            )
            cost = (
                f"{1000 * site['after'] / len(after_warmup):.2f} ms per step, "
                f"{site['after'] / step_time:.0%} of the step time after warm-up"
                if step_time
                else "its cost could not be timed"
            )
        else:
            when = _event_steps(site["steps"], after_last_step=events > len(site["steps"]))
            cost = f"{1000 * site['wait_s'] / events:.1f} ms per event" + (
                f", {site['count'] / events:.3g} read(s) each" if site["count"] > events else ""
            )
            fix = "nothing to do: it is not paid every step" if site["count"] and events <= 1 else fix
        findings.append(
            PerformanceFinding(
                kind="host_sync",
                site=location,
                what=f"{label} at {location or 'an unknown line'} waits for the device and copies to the host "
                f"({site['count']} read(s) in the run; {cost})",
                when=when,
                every_step=every_step,
                count=site["count"],
                steps=site["steps"],
                cost_s=round(site["wait_s"], 4),
                ms_per_step=round(1000 * site["after"] / len(after_warmup), 3) if every_step else None,
                share=round(site["after"] / step_time, 4) if every_step and step_time else None,
                fix=fix,
                code=code,
            )
        )
    return findings


def _event_steps(steps: list[int], after_last_step: bool) -> str:
    """`in steps 5, 10 (every 5 steps)`, `once, in step 3`, `once, after the last step` ..."""
    parts = []
    if len(steps) == 1:
        parts.append(f"in step {steps[0]}")
    elif steps:
        gaps = {b - a for a, b in zip(steps, steps[1:], strict=False)}
        parts.append(f"in steps {step_list(steps)}" + (f" (every {gaps.pop()} steps)" if len(gaps) == 1 else ""))
    if after_last_step:
        parts.append("after the last step")
    return ("once, " if len(steps) + after_last_step == 1 else "") + " and ".join(parts)


def _compile_findings(report: CheckReport) -> list[PerformanceFinding]:
    """New graphs after warm-up that were then cached (`compiles_keep_coming` is False): what they cost.
    Repeated compilation is graded instead (a reason to refuse L2)."""
    compiled = [s for s in report.per_step[report.steps_warmup :] if s.compiles]
    if not compiled or compiles_keep_coming(report):
        return []
    where = report.recompile_sources[0].location if report.recompile_sources else compiled[0].sync_site
    cost = sum(s.compile_s for s in compiled)
    return [
        PerformanceFinding(
            kind="compile",
            site=where,
            what=f"{sum(s.compiles for s in compiled)} new graph(s) after warm-up"
            + (f", from {where}" if where else "")
            + f", then cached: {cost:.2f} s compiling; not repeated compilation",
            when=_event_steps([s.index for s in compiled], after_last_step=False),
            every_step=False,
            count=sum(s.compiles for s in compiled),
            steps=[s.index for s in compiled],
            cost_s=round(cost, 4),
            ms_per_step=None,
            share=None,
            fix="nothing to do when it is a new phase (the first evaluation); otherwise give the graph the "
            "warm-up steps' shapes",
        )
    ]


def _slow_step_findings(report: CheckReport, listed: int = 3) -> list[PerformanceFinding]:
    """Steps after warm-up far slower than the typical one that a compile does not explain, with where their
    time went."""
    after_warmup = report.per_step[report.steps_warmup :]
    if len(after_warmup) < 3:
        return []
    typical = statistics.median(s.wall_s for s in after_warmup)
    slow = [
        s
        for s in after_warmup
        if s.wall_s > max(SLOW_STEP_FACTOR * typical, typical + SLOW_STEP_MIN_S)
        and s.compile_s < (s.wall_s - typical) / 2
    ]
    findings = []
    for step in sorted(slow, key=lambda s: -s.wall_s)[:listed]:
        reads = sorted(step.reads, key=lambda r: -r["wait_s"])
        where = f" (most at {reads[0]['site']})" if reads and step.host_wait_s else ""
        findings.append(
            PerformanceFinding(
                kind="slow_step",
                site=reads[0]["site"] if reads else None,
                what=f"step {step.index} took {1000 * step.wall_s:.0f} ms against a typical {1000 * typical:.0f} ms: "
                f"{1000 * step.host_wait_s:.0f} ms waiting on host reads{where}, "
                f"{1000 * step.trace_s:.0f} ms tracing and dispatch, {1000 * step.compile_s:.0f} ms compiling",
                when=f"once, in step {step.index}",
                every_step=False,
                count=1,
                steps=[step.index],
                cost_s=round(step.wall_s - typical, 4),
                ms_per_step=None,
                share=None,
                fix="see what the script does in that step (an evaluation, a checkpoint, data loading)",
            )
        )
    return findings
