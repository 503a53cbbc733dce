"""`verify` and `verify_tree`: run the migrated command, then (unless a gate stops it) the reference, and grade."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ..sandbox import scratch as scratch_folder
from . import curves as cv
from .assess import absolute_gates, assess, relative_gates
from .config import VerifyConfig, VerifyUsageError, level_at_least, load_config
from .report import VerifyReport
from .runs import (
    RunRecord,
    reference_from_log,
    run_migrated,
    run_reference,
    source_fixes_seed,
    split_command,
    working_folder,
)


def verify(
    original: Path,
    migrated: Path,
    command: list[str],
    config: VerifyConfig | None = None,
    on_step: Callable[[str], None] | None = None,
    subdir: str | None = None,
) -> VerifyReport:
    """Runs the migrated and (unless fail-fast stops first) the reference command and grades the migration.
    `on_step` is told when each run, and the grading, starts (a progress display; the migration's timings).
    `subdir`: the folder of both trees the command runs in (default: the caller's, when it stands in a tree)."""
    on_step = on_step or (lambda name: None)
    started = time.perf_counter()
    config = (config or VerifyConfig()).validate()
    original, migrated = Path(original).resolve(), Path(migrated).resolve()
    for folder in (original, migrated):
        if not folder.is_dir():
            raise VerifyUsageError(f"not a directory: {folder}")
    script, args = split_command(list(command))
    if subdir is None:
        subdir = working_folder(original, migrated)  # the caller's folder when it stands in a tree, else the root
    elif Path(subdir).is_absolute() or ".." in Path(subdir).parts:
        raise VerifyUsageError(f"the working folder must be relative to the trees and inside them: {subdir}")
    subdir = "" if subdir in (".", "") else str(Path(subdir))
    for folder in (original, migrated):
        if not (folder / subdir / script).is_file():
            raise VerifyUsageError(f"{script} not found in {folder / subdir}")

    report = VerifyReport(
        original=str(original),
        migrated=str(migrated),
        command=list(command),
        level="none",
        required=config.require,
        status="fail",
        reasons=[],
        config=asdict(config),
    )
    log_ref, log_price = reference_from_log(config) if config.reference_log else (None, None)
    log_repeats = tuple(reference_from_log(config, path)[0] for path in config.reference_log_repeats)
    if log_price is not None and config.price_reference is None:
        config = config.with_overrides(price_reference=log_price)
        report.config = asdict(config)
    with scratch_folder("xlaport-verify-") as tmp:
        scratch = Path(tmp)
        on_step("the migrated run")
        mig, check = run_migrated(migrated, script, [*args, *config.migrated_args], config, scratch, subdir)
        report.migrated_run, report.check = mig, check.to_dict()
        gates = absolute_gates(mig, check, config) if mig.ok else []
        ran, again = None, None
        if mig.ok and not any(g.stopped for g in gates) and config.reference != "none":
            on_step("the original's run")
            ran = run_reference(original, script, args, config, scratch, subdir)
            if not log_repeats and ran.ok and len(ran.curves.loss) and config.repeat_reference_s > 0:
                budget = min(config.timeout_s, config.repeat_reference_s)
                on_step("the original's second run (its run-to-run spread)")
                again = run_reference(original, script, args, config, scratch, subdir, repeat=1, timeout_s=budget)
        ref = log_ref or ran  # a recorded GPU run decides; the run here is the fallback
        spread, spread_runs = measure_spread(log_ref, log_repeats, ran, again)
        more: list[RunRecord] = []
        while again is not None and spread is not None and not spread.seeded and mig.ok:
            # a few runs of an unseeded original measure its spread roughly: while the migrated run's first loss
            # is outside it by less than so few runs can blame on the migration, another run decides (at most
            # cv.MOST_RUNS in all)
            loss = assess(ref, mig, check, config, spread, spread_runs)[4]
            if loss is None or not loss.another_run_would_decide or 2 + len(more) >= cv.MOST_RUNS:
                break
            on_step(f"the original's run {3 + len(more)} ({2 + len(more)} leave the migrated first loss undecided)")
            more.append(
                run_reference(original, script, args, config, scratch, subdir, repeat=2 + len(more), timeout_s=budget)
            )
            spread, spread_runs = measure_spread(log_ref, log_repeats, ran, again, *more)
        if mig.ok and not any(g.stopped for g in gates):
            gates += relative_gates(ref, mig, config, others=tuple(r for r in spread_runs if r is not ref))
        report.reference_run, report.repeat_runs = ref, [r for r in spread_runs if r is not ref]
        report.spread = spread
    if log_ref is not None and log_ref.steps_run > mig.steps_run > 0:
        log_ref.notes.append(
            f"the log runs to step {log_ref.steps_run - 1}, the migrated run to step {mig.steps_run - 1}: losses are "
            "compared over the common steps, final metrics at the end of each run"
        )

    on_step("grading")
    seeded_source = source_fixes_seed(original) if spread is None and ref is not None else None
    level, reasons, improvements, undecided, loss_cmp, metric_cmps, claim, perf = assess(
        ref, mig, check, config, spread, spread_runs, seeded_source
    )
    if spread is not None:
        reasons.insert(0, f"L1: run-to-run: {spread.describe()}")
    elif ref is not None and ran is not None and not log_ref:
        why = "repeat_reference_s = 0" if config.repeat_reference_s <= 0 else "its second run logged no loss"
        reasons.insert(0, f"L1: run-to-run: the original's spread was not measured ({why})")
    if ref is not None:
        report.references.append(reference_summary(ref, level, loss_cmp, metric_cmps, config, decides=True))
    if log_ref is not None and ran is not None:
        fb_level, _, _, _, fb_loss, fb_metrics, *_ = assess(ran, mig, check, config, spread, spread_runs)
        report.fallback_run = ran
        report.references.append(reference_summary(ran, fb_level, fb_loss, fb_metrics, config, decides=False))
        reasons.append(
            f"L1: also held against the run of the original on {ran.device} (fallback reference, not deciding): "
            + _verdicts_line(fb_level, fb_loss, fb_metrics)
        )
    report.stops = [g.to_dict() for g in gates]
    stops = [g for g in gates if g.stopped]
    if stops:
        report.stopped = "; ".join(g.reason for g in stops)
        for gate in stops:
            after = f" (held against {gate.against})" if gate.against else ""
            if ran is None and config.reference != "none":
                after += "; the reference run was not started"
            reasons.append(f"stopped ({gate.gate}): {gate.reason}{after}")
        undecided = False
        if level_at_least(level, "L3"):
            level = "L2"
    report.capture = {run.role if run is not report.fallback_run else "fallback": capture_summary(run, config)
                      for run in (ref, report.fallback_run, mig) if run is not None}  # fmt: skip
    for run in (ref, report.fallback_run, *report.repeat_runs, mig):
        if run is not None:
            role = "fallback reference" if run is report.fallback_run else run.role
            reasons.extend(f"note ({role}): {note}" for note in run.notes)
    report.level, report.reasons, report.improvements = level, reasons, improvements
    report.loss, report.metrics, report.claim, report.performance = loss_cmp, metric_cmps, claim, perf
    report.status = "fail" if stops else _status(level, config.require, undecided)
    report.wall_s = time.perf_counter() - started
    return report


def measure_spread(
    log_ref: RunRecord | None,
    log_repeats: tuple[RunRecord, ...],
    ran: RunRecord | None,
    again: RunRecord | None,
    *more: RunRecord,
) -> tuple[cv.Spread | None, tuple[RunRecord, ...]]:
    """The original's run-to-run spread and the runs it comes from: the recorded logs when several were given,
    else two (or, with `more`, more) runs of it here (their spread stands for the GPU log's too: seeding is the
    program's, not the device's)."""
    if log_ref is not None and log_repeats:
        runs = (log_ref, *log_repeats)
        return cv.measure_spread([r.curves.loss for r in runs], f"{len(runs)} recorded logs"), runs
    if ran is not None and again is not None and ran.ok:
        repeats = (again, *(r for r in more if len(r.curves.loss)))
        cut = any("repeat_reference_s" in note for r in repeats for note in r.notes)
        count = {2: "two", 3: "three", 4: "four", 5: "five"}.get(1 + len(repeats), str(1 + len(repeats)))
        cut_words = " (the second one cut short)" if len(repeats) == 1 else " (a repeat cut short)"
        what = f"{count} runs of the original here" + (cut_words if cut else "")
        spread = cv.measure_spread([ran.curves.loss, *(r.curves.loss for r in repeats)], what)
        return spread, (ran, *repeats) if spread is not None else ()
    return None, ()


def capture_summary(run: RunRecord, config: VerifyConfig) -> dict:
    """What was captured from one run (for callers that must tell the user when no loss was found)."""
    found = len(run.curves.loss)
    summary = {
        "loss_points": found,
        "loss_source": run.curves.source if found else None,
        "metrics": sorted(name for name, series in run.curves.metrics.items() if len(series)),
    }
    if not found:
        summary["loss_formats_tried"] = [config.loss_pattern] if config.loss_pattern else list(cv.LOSS_FORMATS)
        summary["read"] = list(run.read)
        summary["hint"] = (
            "set loss_pattern (a regex with a `value` group) or log_file (the JSON/JSONL/CSV or text log the script "
            "writes)"
        )
    return summary


def reference_summary(
    run: RunRecord,
    level: str,
    loss_cmp: cv.LossComparison | None,
    metric_cmps: list[cv.MetricComparison],
    config: VerifyConfig,
    decides: bool,
) -> dict:
    """What one reference is and what the migration reaches against it (the report's "references" table)."""
    if run.log:
        kind = "recorded GPU run (log)"
    elif run.device.startswith("cuda"):
        kind = "run of the original on CUDA here"
    else:
        kind = "run of the original here, CUDA mapped to the CPU"
    band = cv.reference_band(run.curves.loss, config.noise_z)
    return {
        "kind": kind,
        "device": run.device,
        "source": run.log or " ".join(run.argv),
        "cached": run.cached,
        "decides": decides,
        "ok": run.ok,
        "level": level,
        "loss_points": len(run.curves.loss),
        "loss_verdict": loss_cmp.verdict if loss_cmp else None,
        "metric_verdicts": {m.name: m.verdict for m in metric_cmps},
        "step_s": run.timing.step_s,
        "noise": {"step_noise": band.noise, "z": band.z, "window": band.window},
    }


def _verdicts_line(level: str, loss_cmp: cv.LossComparison | None, metric_cmps: list[cv.MetricComparison]) -> str:
    parts = [f"level {level}", f"loss {loss_cmp.verdict if loss_cmp else 'not compared'}"]
    parts += [f"{m.name} {m.verdict} ({_fmt_num(m.mig_final)} vs {_fmt_num(m.ref_final)})" for m in metric_cmps]
    return ", ".join(parts)


def _fmt_num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def verify_tree(
    original_dir: Path,
    migrated_dir: Path,
    command: list[str],
    config: VerifyConfig | None = None,
    on_step: Callable[[str], None] | None = None,
    subdir: str | None = None,
) -> VerifyReport:
    """For `xlaport migrate --verify`: the settings come from the project's config (migrated tree first, then the
    original), with `config`'s non-default fields on top."""
    found, path = load_config(Path(migrated_dir), Path(original_dir))
    if config is not None:
        defaults = asdict(VerifyConfig())
        found = found.with_overrides(**{k: v for k, v in asdict(config).items() if v != defaults[k]})
    report = verify(original_dir, migrated_dir, command, found, on_step, subdir)
    report.config_file = path
    return report


def _status(level: str, required: str, undecided: bool) -> str:
    if level_at_least(level, required):
        return "pass"
    return "inconclusive" if undecided else "fail"
