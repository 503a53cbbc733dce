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
    lost_ties: list[str] = field(default_factory=list)  # shared parameters that a device move untied
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


def op_counts(ops: Mapping[str, int]) -> str:
    return ", ".join(f"{op}×{n}" for op, n in sorted(ops.items(), key=lambda item: -item[1]))


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
        "  CPU fallback ops: " + (op_counts(report.fallback_ops) or "none"),
        "  .item() on XLA tensors: "
        + (", ".join(f"{site['location']}×{site['count']}" for site in report.item_sites) or "none"),
        "  NaN/Inf: " + ("; ".join(report.nan_details) if report.nan else "none"),
        "  stale optimizer params: " + ("; ".join(report.stale_optimizer_params) or "none"),
        "  params off the XLA device: " + ("; ".join(report.params_off_device) or "none"),
        "  tied weights lost: " + ("; ".join(report.lost_ties) or "none"),
    ]
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
    lines.extend(f"  note: {note}" for note in report.notes)
    if report.error:
        lines.append("  error:")
        lines.extend("    " + line for line in report.error.splitlines())
    return "\n".join(lines)


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def step_list(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:10])
    return shown + (", ..." if len(steps) > 10 else "")
