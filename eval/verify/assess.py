"""The assessment: fail-fast gates, L1 numbers, L3 (the goal holds against the reference and a stated claim)
and L4 (faster and cheaper)."""

from __future__ import annotations

import math
from typing import Any

from . import curves as cv
from .config import VerifyConfig
from .runs import RunRecord


def projected_seconds(run: RunRecord, full_steps: int) -> float | None:
    """Fixed cost of the smoke test (start-up, compilation) plus the full run's steps at the steady step time."""
    if run.timing.step_s is None or not run.steps_run:
        return None
    overhead = max(run.wall_s - run.steps_run * run.timing.step_s, 0.0)
    return overhead + full_steps * run.timing.step_s


def absolute_gates(mig: RunRecord, check, config: VerifyConfig) -> list[cv.Stop]:
    """The gates that need no reference: NaN/inf (the only stop on the loss alone) and the user's time budget
    (a cost ceiling on the migrated run, not a judgment of its numbers). Both come before the reference run."""
    bad = cv.first_bad_value(mig.curves.loss)
    if bad is not None:
        gates = [cv.Stop("nan", True, f"the migrated smoke test diverged: loss {bad[1]} at step {bad[0]}", step=bad[0])]
    elif check.nan:
        gates = [cv.Stop("nan", True, "the migrated smoke test produced NaN/Inf: " + "; ".join(check.nan_details[:3]))]
    else:
        gates = [cv.Stop("nan", False, "no NaN/inf in the migrated loss or parameters")]
    if config.budget_hours is not None and config.full_run_steps:
        projected = projected_seconds(mig, config.full_run_steps)
        if projected is None:
            gates.append(cv.Stop("budget", False, "the migrated step time is unknown: the budget is not judged"))
        else:
            over = projected > config.budget_hours * 3600
            gates.append(
                cv.Stop(
                    "budget",
                    over,
                    f"the projected full run takes {projected / 3600:.2f} h, "
                    f"{'over' if over else 'within'} the budget of {config.budget_hours:g} h "
                    f"({config.full_run_steps} steps at {mig.timing.step_s:.3g} s/step after warm-up, plus "
                    f"{projected - config.full_run_steps * mig.timing.step_s:.0f} s of start-up and compilation)",
                    against=f"budget_hours = {config.budget_hours:g}",
                )
            )
    return gates


def relative_gates(
    ref: RunRecord | None, mig: RunRecord, config: VerifyConfig, others: tuple[RunRecord, ...] = ()
) -> list[cv.Stop]:
    """Divergence and "loss is not falling", judged against the reference's curve over the same steps and its noise
    (`others`: further runs of the original, whose curves widen the band)."""
    if ref is None or not ref.ok or not len(ref.curves.loss) or not len(mig.curves.loss):
        return [
            cv.Stop(
                "divergence",
                False,
                "no reference loss curve to hold the migrated one against: divergence and 'not falling' are not "
                "judged (only NaN/inf stops a run on its own)",
            )
        ]
    limits = config.thresholds()
    extra = tuple(run.curves.loss for run in others if len(run.curves.loss))
    gates = [cv.divergence_gate(ref.curves.loss, mig.curves.loss, limits, others=extra)]
    gates.append(cv.falling_gate(ref.curves.loss, mig.curves.loss, limits))
    for gate in gates:
        gate.against = f"{ref.role} on {ref.device}: {gate.against}"
    return gates


def judge_claim(claim: cv.Claim, ref: RunRecord | None, mig: RunRecord, metric_verdicts: dict[str, str]) -> dict:
    """Whether the stated claim holds on the migrated run; a claim the original misses too is inherited, not a
    migration failure, as long as the migrated run matches the reference (the study's ‡ rule)."""

    def observed(run: RunRecord | None) -> float | None:
        if run is None:
            return None
        series = cv.find_metric(run.curves, claim.name)
        if series is None:
            return None
        if series is run.curves.loss:  # a loss claim is judged on the last-25% mean, not one noisy step
            tail = max(1, math.ceil(len(series) * 0.25))
            return sum(series.values[-tail:]) / tail
        return series.final

    mig_value, ref_value = observed(mig), observed(ref)
    result = {"claim": str(claim), "migrated": mig_value, "reference": ref_value, "holds": None, "inherited": False}
    if mig_value is None:
        result["verdict"] = "inconclusive"
        result["reason"] = f"the migrated run reported no `{claim.name}`, so the claim {claim} cannot be checked"
        return result
    result["holds"] = claim.holds(mig_value)
    if result["holds"]:
        result["verdict"] = "pass"
        result["reason"] = f"claim {claim} holds: migrated {claim.name} = {mig_value:.4g}"
        return result
    ref_misses = ref_value is not None and not claim.holds(ref_value)
    name = cv.find_metric(mig.curves, claim.name)
    matches = metric_verdicts.get(name.name if name is not None else claim.name) in ("same", "better")
    if ref_misses and matches:
        result.update(verdict="pass", inherited=True)
        result["reason"] = (
            f"claim {claim} is missed by the original code too (reference {ref_value:.4g}, migrated {mig_value:.4g}); "
            "the migration preserves the original's behaviour (inherited, not migration-induced)"
        )
        return result
    result["verdict"] = "fail"
    where = f"; the reference reaches {ref_value:.4g}" if ref_value is not None and not ref_misses else ""
    result["reason"] = f"claim {claim} does not hold: migrated {claim.name} = {mig_value:.4g}{where}"
    return result


def assess(
    ref: RunRecord | None,
    mig: RunRecord,
    check,
    config: VerifyConfig,
    spread: cv.Spread | None = None,
    spread_runs: tuple[RunRecord, ...] = (),
    seed_in_source: bool | None = None,
) -> tuple[str, list[str], list[str], bool, cv.LossComparison | None, list[cv.MetricComparison], dict | None, dict]:
    """(level, reasons, improvements, undecided, loss comparison, metric comparisons, claim, performance).

    `spread`: the original's run-to-run noise, measured on `spread_runs` (two runs of it, or recorded logs); when
    it does not fix its seed, differences inside that noise are not blamed on the migration. Without a spread,
    `seed_in_source` False (the original's sources seed nothing) makes a first-loss difference undecided."""
    reasons: list[str] = []
    improvements: list[str] = []
    limits = config.thresholds()

    # L0 and L2 come from the execution check of the migrated run.
    if getattr(check, "stopped", None):  # the execution check stopped a run that could never reach L2
        reasons.extend(f"L2: stopped by the execution check: {reason}" for reason in check.reasons)
        return "L0", reasons, improvements, False, None, [], None, {}
    if not mig.ok:
        reasons.append("L0: the migrated run did not finish: " + "; ".join(check.reasons or [mig.error or "?"]))
        return "none", reasons, improvements, False, None, [], None, {}
    level = "L0"
    if check.level == "L2":
        level = "L2"
    else:
        reasons.extend(f"L2: {reason}" for reason in check.reasons)

    # L1 measurements and the L3 judgment against the reference run (and the claim).
    failures: list[str] = []
    undecided: list[str] = []
    loss_cmp = None
    metric_cmps: list[cv.MetricComparison] = []
    if ref is None or not ref.ok:
        why = "no reference run" if ref is None else f"the reference run failed ({(ref.error or '').splitlines()[0]})"
        undecided.append(f"L3: {why}: nothing to compare against")
    else:
        if len(ref.curves.loss) and len(mig.curves.loss):
            loss_cmp = cv.compare_loss(ref.curves.loss, mig.curves.loss, limits, spread)
            if spread is None and seed_in_source is False:
                _first_loss_without_seed(loss_cmp)
            if loss_cmp.ref_tail_mean is not None:
                reasons.append(f"L1: {loss_summary(loss_cmp)}; confidence {loss_cmp.confidence}")
            tag = {"worse": failures, "diverged": failures, "inconclusive": undecided}.get(loss_cmp.verdict)
            for reason in loss_cmp.reasons:
                if loss_cmp.verdict == "better":
                    improvements.append(f"L1: {reason}")
                elif tag is not None:
                    tag.append(f"L3: training loss: {reason}")
                else:
                    reasons.append(f"L1: {reason}")
        else:
            side, silent = ("reference", ref) if not len(ref.curves.loss) else ("migrated run", mig)
            reasons.append(f"L1: {no_loss_message(side, config, silent.read)}")
        # the reference defines the goal: its metric is the one the migrated run must keep
        preferred = config.metric or (cv.parse_claim(config.claim).name if config.claim else None)
        primary = cv.primary_metric(ref.curves, preferred)
        for name in _metric_names(ref, mig, primary):
            run_to_run, runs = metric_spread(name, spread, spread_runs)
            cmp = cv.compare_metric(
                cv.find_metric(ref.curves, name) or cv.Series(name),
                cv.find_metric(mig.curves, name) or cv.Series(name),
                name,
                cv.higher_is_better(name, config.metric_directions),
                limits,
                noise=config.metric_noise,
                run_to_run=run_to_run,
                runs=runs,
            )
            metric_cmps.append(cmp)
            is_primary = name == primary
            for reason in cmp.reasons:
                if cmp.verdict == "better":
                    improvements.append(f"L1: {reason}")
                elif is_primary and cmp.verdict == "worse":
                    failures.append(f"L3: evaluation metric: {reason}" + _metric_hint(loss_cmp))
                elif is_primary and cmp.verdict == "missing" and len(cmp_ref(ref, name)):
                    failures.append(f"L3: evaluation metric: {reason}, the reference did: evaluation coverage changed")
                elif is_primary and cmp.verdict in ("inconclusive", "missing"):
                    undecided.append(f"L3: evaluation metric: {reason}")
                else:
                    reasons.append(f"L1: {reason}")
        if primary is None:
            reasons.append("L1: no evaluation metric found; L3 is judged on the training loss alone")
            if loss_cmp is None:
                undecided.append("L3: neither a loss nor a metric was captured from both runs")

    claim_result = None
    if config.claim:
        verdicts = {m.name: m.verdict for m in metric_cmps}
        claim_result = judge_claim(cv.parse_claim(config.claim), ref if ref and ref.ok else None, mig, verdicts)
        bucket = {"fail": failures, "inconclusive": undecided}.get(claim_result["verdict"], reasons)
        bucket.append(f"L3: {claim_result['reason']}")
        if claim_result["verdict"] == "pass" and undecided and all("reference run" in u for u in undecided):
            undecided.clear()  # no reference, but the stated claim decides L3 on its own
            reasons.append("L3: judged on the stated claim alone (no usable reference run)")

    reasons.extend(failures)
    reasons.extend(undecided)
    goal_holds = not failures and not undecided
    if goal_holds and level == "L2":
        level = "L3"
        reasons.append("L3: the goal holds against the reference run" + (" and the claim" if config.claim else ""))
    elif goal_holds:
        reasons.append("L3: the goal holds, but L3 is not claimed because L2 failed")
    if ref is not None and ref.ok:
        reasons.append(l3_evidence(loss_cmp, metric_cmps, claim_result, spread))

    performance, l4_reason, l4_undecided = assess_performance(ref, mig, check, config)
    if level == "L3":
        if l4_reason is None:
            level = "L4"
            reasons.append("L4: the migrated run is faster" + (" and cheaper" if performance.get("cost_ratio") else ""))
        else:
            reasons.append(f"L4: {l4_reason}")
    # a failure settles it; only without one can missing evidence make the outcome inconclusive
    l4_open = level == "L3" and l4_undecided and config.require == "L4"
    undecided_overall = not failures and (bool(undecided) or l4_open)
    return level, reasons, improvements, undecided_overall, loss_cmp, metric_cmps, claim_result, performance


def _first_loss_without_seed(loss_cmp: cv.LossComparison) -> None:
    """A first-loss difference when the original seeds nothing and its spread was not measured: undecided."""
    if loss_cmp.verdict != "worse" or not loss_cmp.reasons[-1].startswith("first logged loss"):
        return
    loss_cmp.verdict = "inconclusive"
    loss_cmp.reasons[-1] = (
        loss_cmp.reasons[-1].split("):")[0] + "): but the original's sources fix no seed (no manual_seed, "
        "random.seed or set_seed call) and its run-to-run spread was not measured, so this may be randomness; "
        f"would decide: a second run of the original (repeat_reference_s > 0), {cv.WHAT_WOULD_DECIDE}"
    )


def no_loss_message(side: str, config: VerifyConfig, read: list[str] | None = None) -> str:
    """Why there is no loss comparison: what was read (the streams, the files the run wrote), the formats tried, and
    how to point verify at the loss."""
    if config.loss_pattern:
        tried = f"the loss_pattern `{config.loss_pattern}` matched no line"
    else:
        tried = "tried: " + "; ".join(f"`{form}`" for form in cv.LOSS_FORMATS)
    if read:
        where = "read: " + ", ".join(read)
    else:
        where = "read: " + (f"the log_file {config.log_file}" if config.log_file else "the run's stdout and stderr")
    return (
        f"no training loss found in the {side}'s output ({where}; {tried}; and a `loss` key or column in the "
        "JSON/JSONL/CSV files and a loss line in the .log/.txt files the run wrote); set loss_pattern to a regex with "
        "a `value` group (e.g. --loss-pattern 'cost (?P<value>[0-9.eE+-]+)'), or log_file to the file the script "
        "writes its losses to"
    )


def metric_spread(name: str, spread: cv.Spread | None, runs: tuple[RunRecord, ...]) -> tuple[float | None, int]:
    """(the metric's standard deviation between runs of an original that does not fix its seed, how many runs
    reported it); None for the first when it is seeded, or fewer than two of its runs reported the metric."""
    if spread is None or spread.seeded:
        return None, 0
    finals = [s.final for s in (cv.find_metric(r.curves, name) for r in runs) if s is not None]
    finals = [v for v in finals if v is not None and math.isfinite(v)]
    if len(finals) < 2:
        return None, len(finals)
    mean = sum(finals) / len(finals)
    return math.sqrt(sum((v - mean) ** 2 for v in finals) / (len(finals) - 1)), len(finals)


def l3_evidence(
    loss_cmp: cv.LossComparison | None,
    metric_cmps: list[cv.MetricComparison],
    claim: dict | None,
    spread: cv.Spread | None,
) -> str:
    """What the L3 judgment rests on and what it lacks, in one line."""
    rests, missing = [], []
    if loss_cmp is not None and loss_cmp.steps_compared >= 2:
        rests.append(f"the training loss at {loss_cmp.steps_compared} aligned steps ({loss_cmp.verdict})")
        if loss_cmp.ref_trend is None:
            missing.append("a loss trend (3 or more points)")
    else:
        missing.append("a training loss logged by both runs")
    compared = [m for m in metric_cmps if m.verdict != "missing"]
    if compared:
        rests.append("evaluation " + ", ".join(f"{m.name} ({m.verdict})" for m in compared))
    else:
        missing.append("an evaluation metric")
    if claim is not None:
        rests.append(f"the claim {claim['claim']} ({claim['verdict']})")
    else:
        missing.append("a stated claim (--claim)")
    if spread is None:
        missing.append("the original's run-to-run spread (a second run of it: repeat_reference_s)")
    elif spread.seeded:
        rests.append(f"a fixed seed ({spread.runs} runs of the original start alike)")
    else:
        rests.append(f"the original's run-to-run spread ({spread.runs} runs, {spread.rel_sd:.1%} of the loss)")
        if spread.runs < 3:
            missing.append("a third run of the original (the spread of two runs is a rough estimate)")
    return f"L3 evidence: rests on {'; '.join(rests) or 'nothing'}; missing: {'; '.join(missing) or 'nothing'}"


def cmp_ref(ref: RunRecord, name: str) -> cv.Series:
    return cv.find_metric(ref.curves, name) or cv.Series(name)


def _metric_names(ref: RunRecord, mig: RunRecord, primary: str | None) -> list[str]:
    """The primary metric first, then every other metric both runs reported."""
    names = [primary] if primary else []
    for name in mig.curves.metrics:
        if name not in names and name in ref.curves.metrics:
            names.append(name)
    return names


def loss_summary(c: cv.LossComparison) -> str:
    """The L1 numbers of the loss in one line (reference vs migrated)."""
    trend = (
        f"; trend (Spearman vs step) {c.ref_trend:+.2f} vs {c.mig_trend:+.2f}"
        if c.ref_trend is not None and c.mig_trend is not None
        else ""
    )
    return (
        f"loss over {c.steps_compared} aligned steps, reference vs migrated: first {c.ref_initial:.4g} vs "
        f"{c.mig_initial:.4g}, final {c.ref_final:.4g} vs {c.mig_final:.4g}, last-25% mean {c.ref_tail_mean:.4g} vs "
        f"{c.mig_tail_mean:.4g} ({c.tail_rel_diff:+.1%}); mean relative curve distance {c.curve_distance:.1%}{trend}"
    )


def _metric_hint(loss_cmp: cv.LossComparison | None) -> str:
    if loss_cmp is not None and loss_cmp.verdict in ("same", "better"):
        return (
            "; the training curves agree, so look at what happens after training: checkpoint save/reload "
            "(which weights are evaluated), evaluation mode, or the evaluation code itself"
        )
    return ""


def assess_performance(
    ref: RunRecord | None, mig: RunRecord, check, config: VerifyConfig
) -> tuple[dict, str | None, bool]:
    """L4 numbers; (numbers, why L4 is not reached or None, whether that is for lack of evidence)."""
    ref_step = ref.timing.step_s if ref is not None else None
    mig_step = mig.timing.step_s
    perf: dict[str, Any] = {
        "reference_device": ref.device if ref is not None else None,
        "migrated_device": mig.device,
        "reference_step_s": ref_step,
        "migrated_step_s": mig_step,
        "speedup": (ref_step / mig_step) if ref_step and mig_step else None,
        "price_reference_per_h": config.price_reference,
        "price_migrated_per_h": config.price_migrated,
        "cost_ratio": None,
        "full_run_steps": config.full_run_steps,
        "reference_full_run_s": None,
        "migrated_full_run_s": None,
    }
    if ref_step and mig_step and config.price_reference and config.price_migrated:
        perf["cost_ratio"] = (mig_step * config.price_migrated) / (ref_step * config.price_reference)
    if config.full_run_steps:
        perf["migrated_full_run_s"] = projected_seconds(mig, config.full_run_steps)
        perf["reference_full_run_s"] = projected_seconds(ref, config.full_run_steps) if ref else None
        for side in ("reference", "migrated"):
            seconds = perf[f"{side}_full_run_s"]
            price = config.price_reference if side == "reference" else config.price_migrated
            perf[f"{side}_full_run_cost"] = seconds / 3600 * price if seconds is not None and price else None
    if ref is None or not (ref.device.startswith("cuda") or ref.log):
        return perf, "not assessable here: the reference did not run on a GPU, so its step time is not the GPU's", True
    if "CPU" in mig.device:
        return perf, "not assessable here: the migrated run used XLA on the CPU, not a TPU", True
    if perf["speedup"] is None:
        return perf, "step times unknown (the runs' steps could not be timed)", True
    if perf["speedup"] <= 1.0:
        return perf, f"not faster: {perf['speedup']:.2f}x the reference's speed", False
    if perf["cost_ratio"] is not None and perf["cost_ratio"] >= 1.0:
        return perf, f"faster ({perf['speedup']:.2f}x) but not cheaper: a run costs {perf['cost_ratio']:.2f}x", False
    return perf, None, False
