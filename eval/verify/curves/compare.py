"""Comparing the migrated curve with the reference's: the L1 numbers of the loss and of each metric."""

from __future__ import annotations

import math

import numpy as np

from .capture import MIN_NOISE_EVALS, Series
from .gates import band_at, reference_band, stays_outside_from
from .measures import LossComparison, MetricComparison, Thresholds, align, first_bad_value, spearman, step_noise


def compare_loss(ref: Series, mig: Series, limits: Thresholds) -> LossComparison:
    """L1 numbers for the training loss, and whether the migrated curve is the same, better or worse."""
    bad = first_bad_value(mig)
    steps, r, m = align(ref, mig)
    result = LossComparison(steps_compared=len(steps), verdict="same")
    if bad is not None:
        result.verdict = "diverged"
        result.reasons.append(f"migrated loss is {bad[1]} at step {bad[0]}")
        return result
    if len(steps) == 0:
        result.verdict = "inconclusive"
        result.reasons.append("no common steps in the two loss curves (check the loss pattern or log file)")
        return result
    finite_ref = r[np.isfinite(r)]
    if finite_ref.size and np.any(m > limits.explode_factor * np.max(np.abs(finite_ref))):
        at = int(steps[np.argmax(m > limits.explode_factor * np.max(np.abs(finite_ref)))])
        result.verdict = "diverged"
        result.reasons.append(
            f"migrated loss exploded: {m[steps == at][0]:.4g} at step {at}, more than "
            f"{limits.explode_factor:g}x the reference's largest loss ({np.max(np.abs(finite_ref)):.4g})"
        )
        return result
    scale = np.maximum(np.abs(r), 1e-12)
    rel = (m - r) / scale
    tail = max(2, math.ceil(len(steps) * 0.25))
    result.ref_initial, result.mig_initial = float(r[0]), float(m[0])
    result.initial_rel_diff = float(rel[0])
    result.ref_final, result.mig_final = float(r[-1]), float(m[-1])
    result.ref_tail_mean, result.mig_tail_mean = float(np.mean(r[-tail:])), float(np.mean(m[-tail:]))
    result.tail_rel_diff = (result.mig_tail_mean - result.ref_tail_mean) / max(abs(result.ref_tail_mean), 1e-12)
    result.curve_distance = float(np.mean(np.abs(rel)))
    result.ref_trend, result.mig_trend = spearman(steps, r), spearman(steps, m)
    result.curve_spearman = spearman(r, m)
    # apart: beyond the tolerance and outside the reference's own noise band (a shared spike is not apart)
    covered, low, high = band_at(reference_band(ref, limits.noise_z), steps)
    apart = np.abs(rel) > limits.loss_tolerance
    apart[covered] &= (m[covered] > high) | (m[covered] < low)
    result.separates_at_step = stays_outside_from(steps, apart)
    result.departs_at_step = int(steps[int(np.argmax(apart))]) if apart.any() else None
    # Both runs use the same seed and data order, so batch-to-batch noise is shared and cancels in the
    # paired difference; what is left is the noise of the difference itself. When the runs do not share
    # their noise (other random streams), this equals the two runs' own noise combined.
    tail_scale = max(abs(result.ref_tail_mean), 1e-12)
    result.tail_noise_se = float(np.std((m - r)[-tail:], ddof=1) / math.sqrt(tail) / tail_scale)
    result.ref_step_noise = step_noise(r[-tail:]) / tail_scale

    if len(steps) < limits.min_steps:
        result.verdict = "inconclusive"
        result.reasons.append(
            f"only {len(steps)} aligned loss points (fewer than min_steps={limits.min_steps}): too few to decide"
        )
        return result
    # Before any update both runs evaluate the same weights on the same batch: a difference here cannot be an
    # improvement; it means a different objective, data or initialization.
    if abs(result.initial_rel_diff) > limits.initial_loss_tolerance:
        result.verdict = "worse"
        result.reasons.append(
            f"first logged loss differs by {result.initial_rel_diff:+.1%} (reference {r[0]:.4g}, migrated {m[0]:.4g}, "
            f"at step {steps[0]}, before training changed anything): the migrated code computes a different "
            "objective, data or initialization (e.g. a dropped loss term)"
        )
        return result
    diff = result.tail_rel_diff
    explained_by_noise = diff <= limits.noise_z * result.tail_noise_se
    if diff > limits.loss_tolerance and not explained_by_noise:
        result.verdict = "worse"
        where = (
            f"; the curves first leave the reference's noise band at step {result.departs_at_step}"
            if result.departs_at_step is not None
            else ""
        )
        if result.separates_at_step is not None:
            where += f" and stay apart from step {result.separates_at_step}"
        result.reasons.append(
            f"mean loss over the last 25% of steps is {diff:+.1%} higher than the reference "
            f"({result.mig_tail_mean:.4g} vs {result.ref_tail_mean:.4g}; tolerance {limits.loss_tolerance:.0%}, "
            f"standard error {result.tail_noise_se:.1%}){where}; same loss at the first step, so the optimization "
            "changed (e.g. learning rate, gradient clipping or reduction, optimizer state)"
        )
    elif diff > limits.loss_tolerance:
        result.verdict = "inconclusive"
        result.reasons.append(
            f"mean loss over the last 25% of steps is {diff:+.1%} higher than the reference, but within "
            f"{limits.noise_z:g} standard errors of the step-to-step noise of the difference "
            f"({result.tail_noise_se:.1%}; the reference's own step noise is {result.ref_step_noise:.1%}): run more steps to decide"
        )
    elif diff < -limits.loss_tolerance:
        result.verdict = "better"
        result.reasons.append(
            f"improvement: mean loss over the last 25% of steps is {diff:+.1%} lower than the reference "
            f"({result.mig_tail_mean:.4g} vs {result.ref_tail_mean:.4g}); reported, not a failure"
        )
    else:
        result.reasons.append(
            f"mean loss over the last 25% of steps within {limits.loss_tolerance:.0%} of the reference ({diff:+.2%})"
        )
    if result.verdict in ("same", "better") and _trend_worse(result, limits):
        result.verdict = "worse"
        result.reasons.append(
            f"loss trends disagree: the reference decreases (Spearman {result.ref_trend:+.2f}) but the migrated "
            f"loss does not (Spearman {result.mig_trend:+.2f})"
        )
    return result


def _trend_worse(result: LossComparison, limits: Thresholds) -> bool:
    """The reference clearly learns and the migrated run clearly does not (the reverse is not a failure)."""
    if result.ref_trend is None:
        return False
    mig_trend = result.mig_trend if result.mig_trend is not None else 0.0
    return result.ref_trend <= -limits.trend_min and mig_trend > -limits.trend_min / 3


def compare_metric(
    ref: Series, mig: Series, name: str, higher_better: bool, limits: Thresholds, noise: float | None = None
) -> MetricComparison:
    """Final evaluation metric of both runs; `noise` overrides the estimate from the reference's evaluations."""
    result = MetricComparison(
        name=name, higher_is_better=higher_better, verdict="same", evaluations=(len(ref), len(mig))
    )
    if not len(ref) or not len(mig):
        result.verdict = "missing"
        side = "reference" if not len(ref) else "migrated run"
        result.reasons.append(f"the {side} reported no `{name}`")
        return result
    result.ref_final, result.mig_final = ref.final, mig.final
    if not math.isfinite(mig.final):
        result.verdict = "worse"
        result.reasons.append(f"migrated {name} is {mig.final}")
        return result
    sign = 1.0 if higher_better else -1.0
    result.gain = sign * (mig.final - ref.final)
    if noise is None and len(ref) >= 2 * MIN_NOISE_EVALS:
        # spread between consecutive evaluations in the second half of training, where the metric has settled
        noise = step_noise(ref.values[len(ref) // 2 :])
    result.noise = noise
    direction = "higher" if higher_better else "lower"
    delta = f"{name} {mig.final:.4g} vs reference {ref.final:.4g} ({result.gain:+.4g}, {direction} is better)"
    if result.gain >= -limits.metric_tolerance:
        result.verdict = "better" if result.gain > limits.metric_tolerance else "same"
        note = (
            "improvement, reported, not a failure"
            if result.verdict == "better"
            else f"within {limits.metric_tolerance:g}"
        )
        result.reasons.append(f"{delta}: {note}")
    elif noise and -result.gain <= limits.noise_z * math.sqrt(2) * noise:
        result.verdict = "inconclusive"
        result.reasons.append(
            f"{delta}: worse than the tolerance {limits.metric_tolerance:g} but within {limits.noise_z:g}x the "
            f"reference's own evaluation noise ({noise:.3g}); evaluate on more data or more often to decide"
        )
    else:
        result.verdict = "worse"
        result.reasons.append(f"{delta}: worse by more than the tolerance {limits.metric_tolerance:g}")
    return result
