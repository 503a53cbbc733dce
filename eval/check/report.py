"""What a check found (`CheckReport` and its parts) and its text rendering."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field


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
    # where the step's wall time went: trace_s + compile_s + host_wait_s == wall_s; execute_s overlaps them
    # Python and lazy tracing, dispatch and the barrier: the rest of the wall time (step 0 also holds the set-up
    # since torch_xla's import: building the model, loading data)
    trace_s: float = 0.0
    host_wait_s: float = 0.0  # blocked in device-to-host reads (.item(), bool(t), .cpu() ...), compiles excluded
    execute_s: float = 0.0  # device execution (torch_xla's ExecuteTime); runs beside tracing, so it overlaps
    reads: list[dict] = field(default_factory=list)  # {"site", "kind", "count", "wait_s"}: the step's host reads


@dataclass
class TimeSplit:
    """Where the time of some steps went (seconds): trace_s + compile_s + host_wait_s == wall_s."""

    scope: str  # "all steps" or "after warm-up"
    steps: int
    wall_s: float
    trace_s: float
    compile_s: float
    host_wait_s: float
    execute_s: float  # device busy time, overlapping the rest

    def ms_per_step(self, seconds: float) -> float:
        return 1000 * seconds / self.steps if self.steps else 0.0


@dataclass
class PerformanceFinding:
    """What costs time without changing what the program computes: never a reason to refuse L2.

    kind: "host_sync" (a site reading device values on the host), "compile" (new graphs after warm-up, then
    cached), "slow_step" (a step far slower than the typical one)."""

    kind: str
    site: str | None  # file:line
    what: str  # the finding in one sentence
    when: str  # "every step", "in 2 of 10 steps after warm-up (steps 5, 10)", "once, after the last step" ...
    every_step: bool  # happens in most steps after warm-up: a per-step cost, worth fixing first
    count: int  # reads (or compiles) in the whole run
    steps: list[int]
    cost_s: float  # seconds it cost in the whole run
    ms_per_step: float | None  # its mean cost per step after warm-up (per-step findings only)
    share: float | None  # its share of the step time after warm-up (per-step findings only)
    fix: str  # what removes the cost, with the kb entry
    code: str | None = None  # the kb entry of the fix


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
    # transfers of the typical step after warm-up (the median, so a checkpoint or an evaluation every N steps
    # is not spread over every step: those are listed per event in `performance`); None without such steps
    host_transfers_per_step: float | None
    transfers_total: int
    item_sites: list[dict]  # {"location", "count"}: where the script read XLA tensors (.item(), bool(t), .cpu() ...)
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
    lost_ties: list[str] = field(default_factory=list)  # shared parameters that a device move untied
    stopped: str | None = None  # "no_barrier" or "off_xla" when the runner stopped the run early (fail-fast)
    phase: str = ""  # the last phase the run reached (start-up, step N, exit ...)
    memory_limit_mb: int | None = None
    optimizer_steps: int = 0
    off_xla_optimizer_steps: int = 0  # optimizer steps whose parameters were all off the XLA device
    device_choice: str | None = None  # where the script chose the device its model ended up on (off XLA)
    performance: list[PerformanceFinding] = field(default_factory=list)  # most costly first
    time_split: list[TimeSplit] = field(default_factory=list)  # all steps, then the steps after warm-up

    @property
    def ok(self) -> bool:
        return self.level == "L2"

    def to_dict(self) -> dict:
        return asdict(self)


def op_counts(ops: Mapping[str, int]) -> str:
    return ", ".join(f"{op}×{n}" for op, n in sorted(ops.items(), key=lambda item: -item[1]))


def render_text(report: CheckReport) -> str:
    lines = [
        f"xlaport check {report.script} {' '.join(report.args)}".rstrip(),
        f"  level: {report.level}   exit code: {report.exit_code}   device: PJRT_DEVICE={report.pjrt_device}",
        f"  time: {report.wall_s:.1f} s = start-up {report.startup_s:.1f} s + compile {report.compile_s:.1f} s "
        f"+ run {report.run_s:.1f} s   (peak memory {report.peak_rss_mb:.0f} MB)",
        # where a step's time goes is what a user reads first (and what `xlaport optimize` ranks by)
        *[f"  {line}" for line in time_split_lines(report.time_split)],
        f"  steps: {report.steps} ({report.steps_warmup} warm-up)   compiles: {report.compiles_total} "
        f"({report.compiles_after_warmup} after warm-up)",
        "  per-step compiles: "
        + (" ".join(str(s.compiles) for s in report.per_step[:40]) or "-")
        + (" ..." if report.steps > 40 else ""),
        f"  host transfers in the typical step after warm-up: {_or_dash(report.host_transfers_per_step)}   "
        f"host reads (total): {report.host_reads}   transfers (total): {report.transfers_total}",
        "  CPU fallback ops: " + (op_counts(report.fallback_ops) or "none"),
        "  host reads of XLA tensors: "
        + (", ".join(f"{site['location']}×{site['count']}" for site in report.item_sites) or "none"),
        "  NaN/Inf: " + ("; ".join(report.nan_details) if report.nan else "none"),
        "  stale optimizer params: " + ("; ".join(report.stale_optimizer_params) or "none"),
        "  params off the XLA device: " + ("; ".join(report.params_off_device) or "none"),
        "  tied weights lost: " + ("; ".join(report.lost_ties) or "none"),
    ]
    if report.per_step:
        lines.append(
            "  per-step ms (tracing and dispatch/compiling/host waits): "
            + " ".join(
                f"{1000 * s.trace_s:.0f}/{1000 * s.compile_s:.0f}/{1000 * s.host_wait_s:.0f}"
                for s in report.per_step[:20]
            )
            + (" ..." if report.steps > 20 else "")
        )
    if report.level == "none" or report.stopped:
        lines.append(f"  last phase reached: {report.phase}")
    for source in report.recompile_sources:
        lines.append(
            f"  recompiled {source.compiles}× at {source.location or '?'} ({source.cause or 'cause unknown'}), "
            f"steps {step_list(source.steps)}"
        )
    if report.reasons:
        lines.append("  why not L2:")
        lines.extend(f"    - {reason}" for reason in report.reasons)
    if report.performance:
        lines.append("  performance (costs time, not correctness; most costly first):")
        lines.extend(f"    - {performance_line(finding)}" for finding in report.performance)
    lines.extend(f"  note: {note}" for note in report.notes)
    if report.error:
        lines.append("  error:")
        lines.extend("    " + line for line in report.error.splitlines())
    return "\n".join(lines)


def time_split_lines(splits: list[TimeSplit]) -> list[str]:
    """`where the time goes (after warm-up, 8 steps, 3.1 ms per step): tracing and dispatch 1.2 ms (39%), ...`"""
    lines = []
    for split in splits:
        if not split.wall_s:
            continue
        parts = [
            f"{name} {split.ms_per_step(seconds):.1f} ms ({seconds / split.wall_s:.0%})"
            for name, seconds in (
                ("tracing and dispatch", split.trace_s),
                ("compiling", split.compile_s),
                ("waiting on host reads", split.host_wait_s),
            )
        ]
        lines.append(
            f"where the time goes ({split.scope}, {split.steps} step(s), {split.ms_per_step(split.wall_s):.1f} ms "
            f"per step): {', '.join(parts)}; the device executed {split.ms_per_step(split.execute_s):.1f} ms "
            "per step, beside the rest"
        )
    return lines


def performance_line(finding: PerformanceFinding) -> str:
    """One performance finding in words: when, what and what it cost, and the fix."""
    code = f" ({finding.code})" if finding.code else ""
    return f"{finding.kind.replace('_', ' ')} {finding.when}: {finding.what}. Fix{code}: {finding.fix}"


def performance_lines(report: CheckReport | Mapping) -> list[str]:
    """Where the time goes and the performance findings of a report (or of its `to_dict()`), one line each:
    what the HTML and Markdown reports list under the check."""
    data = report.to_dict() if isinstance(report, CheckReport) else report
    splits = [TimeSplit(**split) for split in data.get("time_split") or []]
    findings = [PerformanceFinding(**finding) for finding in data.get("performance") or []]
    return time_split_lines(splits) + [f"performance: {performance_line(finding)}" for finding in findings]


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def step_list(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:10])
    return shown + (", ..." if len(steps) > 10 else "")
