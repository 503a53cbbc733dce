"""Comparing the migrated curve with the reference's: the L1 numbers of the loss and of each metric."""

from __future__ import annotations

import math

import numpy as np

from .capture import MIN_NOISE_EVALS, Series
from .gates import band_at, reference_band, stays_outside_from
from .measures import LossComparison, MetricComparison, Thresholds, align, first_bad_value, spearman, step_noise
from .spread import AgainstRuns, Spread, against_runs

# What would turn an undecided loss comparison into a decision (the study: explain the uncertainty, do not fail).
WHAT_WOULD_DECIDE = (
    "more logged steps (min_steps aligned loss points), a fixed seed in the original (torch.manual_seed: both "
    "runs then start from the same weights and batches), or several recorded runs of the original "
    "(--reference-log, repeated) to measure its spread"
)


def compare_loss(ref: Series, mig: Series, limits: Thresholds, spread: Spread | None = None) -> LossComparison:
    """L1 numbers for the training loss, and whether the migrated curve is the same, better or worse.

    `spread` is the original's run-to-run noise (two runs of it): when it does not fix its seed, a difference
    inside that noise is randomness, and only one far outside it (`spread_z`) is the migration's."""
    bad = first_bad_value(mig)
    steps, r, m = align(ref, mig)
    result = LossComparison(steps_compared=len(steps), verdict="same")
    if bad is not None:
        result.verdict = "diverged"
        result.reasons.append(f"migrated loss is {bad[1]} at step {bad[0]}")
        return result
    if len(steps) < 2:
        result.verdict = "inconclusive"
        result.confidence = f"none: {len(steps)} common step"
        result.reasons.append(
            f"{'no' if not len(steps) else 'only one'} common step in the two loss curves: nothing to compare "
            "(check the loss pattern or log file, and that both runs number their steps alike)"
        )
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
    rel = _figures(result, ref, steps, r, m, limits)
    random = spread is not None and not spread.seeded  # the runs start from other weights and batches
    diff, noise = result.tail_rel_diff, result.tail_noise_se
    view = None
    if random:
        # held against the center of the original's runs, with their spread as the noise
        view = against_runs(mig, spread, ref) or AgainstRuns(
            1,
            result.initial_rel_diff,
            math.sqrt(2) * spread.first_rel_sd,
            diff,
            max(noise, math.sqrt(2) * spread.tail_rel_sd),
        )
        diff, noise = view.tail_diff, view.tail_noise
        result.run_to_run_noise = noise
    elif spread is not None and spread.measured:
        # seeded but not deterministic: the paired difference's own noise, or the runs' drift, whichever is larger
        result.run_to_run_noise = math.sqrt(2) * spread.tail_rel_sd
        noise = max(noise, result.run_to_run_noise)
    result.confidence = _confidence(result, limits, spread)

    # the first logged loss is one point, before training changed anything: it decides even when few were logged
    first_diff = view.first_diff if view is not None else result.initial_rel_diff
    first_undecided = False
    if abs(first_diff) > limits.initial_loss_tolerance:
        # one step's loss is one batch's draw: the reference's early step-to-step noise is a floor for the
        # run-to-run noise two runs' first steps give (two close by chance once failed a correct migration)
        early = step_noise(r[:10]) / max(abs(float(r[0])), 1e-12)
        first = _first_loss_verdict(result, r[0], m[0], steps[0], limits, view, spread, early)
        if first is not None and first.verdict != "inconclusive":
            return first
        if first is not None:  # undecided by the runs measured: the rest of the curve may still show a defect
            first_undecided, result.verdict = True, "same"
    if len(steps) < limits.min_steps:
        return _undecided_first(_few_points(result, rel, limits, random), first_undecided)
    strict = limits.spread_z if random else limits.noise_z
    spread_words = "the original's run-to-run spread" if random else "the step-to-step noise of the difference"
    if diff > limits.loss_tolerance and diff > strict * noise:
        result.verdict = "worse"
        where = (
            f"; the curves first leave the reference's noise band at step {result.departs_at_step}"
            if result.departs_at_step is not None
            else ""
        )
        if result.separates_at_step is not None:
            where += f" and stay apart from step {result.separates_at_step}"
        cause = (
            "far outside what the original differs from itself between runs"
            if random
            else "same loss at the first step, so the optimization changed (e.g. learning rate, gradient "
            "clipping or reduction, optimizer state)"
        )
        against = f"the mean of the original's {view.runs} runs" if view is not None else "the reference"
        result.reasons.append(
            f"mean loss over the last 25% of steps is {diff:+.1%} higher than {against} "
            f"(migrated {result.mig_tail_mean:.4g}, reference {result.ref_tail_mean:.4g}; tolerance "
            f"{limits.loss_tolerance:.0%}, noise {noise:.1%} from {spread_words}, {strict:g}x needed){where}; {cause}"
        )
    elif diff < -limits.loss_tolerance and not (random and -diff <= limits.noise_z * noise):
        result.verdict = "better"
        result.reasons.append(
            f"improvement: mean loss over the last 25% of steps is {diff:+.1%} lower than the reference "
            f"({result.mig_tail_mean:.4g} vs {result.ref_tail_mean:.4g}); reported, not a failure"
        )
    elif random and diff > limits.loss_tolerance and diff > limits.noise_z * noise:
        result.verdict = "inconclusive"
        result.reasons.append(
            f"mean loss over the last 25% of steps is {diff:+.1%} from the mean of the original's runs, between "
            f"{limits.noise_z:g}x and {limits.spread_z:g}x their run-to-run spread ({noise:.1%}, measured from "
            f"{view.runs} runs): too close to its randomness to blame or clear the migration; would decide: "
            f"{WHAT_WOULD_DECIDE}"
        )
    elif random and abs(diff) > limits.loss_tolerance:
        result.reasons.append(
            f"mean loss over the last 25% of steps is {diff:+.1%} from the mean of the original's runs, inside their "
            f"run-to-run spread ({limits.noise_z:g}x {noise:.1%}): randomness, not the migration"
        )
    elif diff > limits.loss_tolerance:
        result.verdict = "inconclusive"
        result.reasons.append(
            f"mean loss over the last 25% of steps is {diff:+.1%} higher than the reference, but within "
            f"{limits.noise_z:g} standard errors of the step-to-step noise of the difference "
            f"({noise:.1%}; the reference's own step noise is {result.ref_step_noise:.1%}): run more steps to decide"
        )
    else:
        result.reasons.append(
            f"mean loss over the last 25% of steps within {limits.loss_tolerance:.0%} of the reference ({diff:+.2%})"
        )
    if result.verdict in ("same", "better") and _trend_worse(result, limits, spread if random else None):
        result.verdict = "worse"
        result.reasons.append(
            f"loss trends disagree: the reference decreases (Spearman {result.ref_trend:+.2f}) but the migrated "
            f"loss does not (Spearman {result.mig_trend if result.mig_trend is not None else 0.0:+.2f})"
        )
    return _undecided_first(result, first_undecided)


def _undecided_first(result: LossComparison, undecided: bool) -> LossComparison:
    """A first loss the runs measured leave undecided keeps the verdict from being anything but worse."""
    if undecided and result.verdict != "worse":
        result.verdict = "inconclusive"
    return result


def _figures(
    result: LossComparison, ref: Series, steps: np.ndarray, r: np.ndarray, m: np.ndarray, limits: Thresholds
) -> np.ndarray:
    """Fills the L1 numbers of `result` (two or more aligned steps); the per-step relative differences."""
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
    return rel


def _confidence(result: LossComparison, limits: Thresholds, spread: Spread | None) -> str:
    """The L1 figures' confidence in words: how many points, how noisy, whether randomness was measured."""
    points = result.steps_compared
    level = "high" if points >= limits.min_steps else "low"
    noise = f"tail difference ±{result.tail_noise_se:.1%} (standard error over the last 25%)"
    if spread is None:
        randomness = "the original's run-to-run spread was not measured"
    elif not spread.seeded:
        randomness = f"unseeded: run-to-run spread {spread.tail_rel_sd:.1%} of the loss ({spread.runs} runs)"
        level = "low" if spread.runs < 3 else level
    else:
        randomness = "seeded: runs of the original repeat " + ("exactly" if not spread.measured else "closely")
    return f"{level}: {points} aligned loss points (min_steps {limits.min_steps}); {noise}; {randomness}"


def _few_points(result: LossComparison, rel: np.ndarray, limits: Thresholds, random: bool) -> LossComparison:
    """Fewer aligned points than min_steps: too few for the tail statistics. Curves that agree point by point
    (a fixed seed) still show the same computation; anything else is undecided, with what would decide."""
    points = len(rel)
    worst = float(np.max(np.abs(rel)))
    if not random and worst <= limits.initial_loss_tolerance:
        result.reasons.append(
            f"only {points} aligned loss points (fewer than min_steps={limits.min_steps}), but they agree point by "
            f"point within {limits.initial_loss_tolerance:.0%} (largest difference {worst:.2%}): the same "
            "computation as far as it was logged; a longer run would also check the trend and the last-25% mean"
        )
        return result
    result.verdict = "inconclusive"
    why = (
        "the original does not fix its seed, so a few points cannot separate its randomness from the migration"
        if random
        else f"they differ by up to {worst:.1%}"
    )
    result.reasons.append(
        f"only {points} aligned loss points (fewer than min_steps={limits.min_steps}) and {why}: too few to "
        f"decide; would decide: {WHAT_WOULD_DECIDE}"
    )
    return result


# Student's t at 0.995 (two-sided 99%) by degrees of freedom: a standard deviation measured from n runs has n - 1
# degrees of freedom, and what is rare against a spread known exactly is common against one of two runs (two runs
# of an unseeded original whose first losses fell close by chance made a correct migration's first loss "11x the
# noise", which t(1) gives once in 17 tries)
T_995 = {1: 63.66, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250, 10: 3.169}


MOST_RUNS = 5  # runs of the original verify makes, at most, to decide a first loss that fewer leave undecided


def blame_bar(runs: int, spread_z: float) -> float:
    """How many times the run-to-run noise measured from `runs` runs a deviation must be to blame the migration:
    `spread_z`, and at least what chance exceeds once in a hundred tries against a spread of that many runs."""
    return max(spread_z, T_995.get(max(runs - 1, 1), 0.0))


def _first_loss_verdict(
    result: LossComparison,
    r0: float,
    m0: float,
    step: int,
    limits: Thresholds,
    view: AgainstRuns | None,
    spread: Spread | None,
    early_noise: float = 0.0,
) -> LossComparison | None:
    """A first logged loss beyond the tolerance: a changed objective, unless the original's own runs differ that
    much at their first step (no fixed seed: `view` holds the migrated run against them). None when the comparison
    goes on."""
    diff = result.initial_rel_diff
    what = f"first logged loss differs by {diff:+.1%} (reference {r0:.4g}, migrated {m0:.4g}, at step {step}"
    if view is None or spread is None:
        result.verdict = "worse"
        result.reasons.append(
            f"{what}, before training changed anything): the migrated code computes a different objective, data or "
            "initialization (e.g. a dropped loss term)"
        )
        return result
    firsts = ", ".join(f"{v:.4g}" for v in spread.first_losses)
    against = (
        f"{view.first_diff:+.1%} from the mean first loss of the original's {view.runs} runs (its runs' first "
        f"losses: {firsts}), whose run-to-run noise there is {view.first_noise:.1%}"
        + (f" (at least its early step-to-step noise, {early_noise:.1%})" if early_noise > view.first_noise else "")
    )
    noise = max(view.first_noise, early_noise)
    if abs(view.first_diff) <= limits.noise_z * noise:
        result.reasons.append(f"{what}): {against}: inside it, randomness, not the migration")
        return None
    blame = blame_bar(view.runs, limits.spread_z)  # the noise is measured from view.runs runs
    bar = f"{blame:.3g}x (with {view.runs} runs: {limits.spread_z:g}x, and at least Student's t at 99%)"
    times = abs(view.first_diff) / max(noise, 1e-12)
    if times <= blame:
        result.verdict = "inconclusive"
        result.another_run_would_decide = view.runs < MOST_RUNS
        result.reasons.append(
            f"{what}): {against}: {times:.0f}x it, between {limits.noise_z:g}x and {bar}; would decide: another run "
            f"of the original, {WHAT_WOULD_DECIDE}"
        )
        return result
    result.verdict = "worse"
    result.reasons.append(
        f"{what}): {against}: {times:.0f}x it, more than {bar}, so the migrated code computes a different "
        "objective, data or initialization (e.g. a dropped loss term, a scaled loss)"
    )
    return result


# one-sided z of p = 0.01: a rank correlation of a curve of n points is a trend only beyond z / sqrt(n - 1)
TREND_Z = 2.33


def _trend_worse(result: LossComparison, limits: Thresholds, spread: Spread | None = None) -> bool:
    """The reference clearly learns and the migrated run clearly does not (the reverse is not a failure). Without a
    fixed seed, every run of the original must clearly learn. "Clearly": a Spearman of at least `trend_min` that a
    curve of this many points does not reach by chance (32 losses of a network on random labels gave -0.30)."""
    if result.ref_trend is None:
        return False
    clear = min(max(limits.trend_min, TREND_Z / max(result.steps_compared - 1, 1) ** 0.5), 1.0)
    if spread is not None and any(t is None or t > -clear for t in spread.trends):
        return False
    mig_trend = result.mig_trend if result.mig_trend is not None else 0.0
    return result.ref_trend <= -clear and mig_trend > -limits.trend_min / 3


def compare_metric(
    ref: Series,
    mig: Series,
    name: str,
    higher_better: bool,
    limits: Thresholds,
    noise: float | None = None,
    run_to_run: float | None = None,
    runs: int = 2,
) -> MetricComparison:
    """Final evaluation metric of both runs; `noise` overrides the estimate from the reference's evaluations.
    `run_to_run`: the metric's standard deviation between runs of an original that does not fix its seed (from
    `runs` final values); a difference inside it is randomness, only one far beyond it is a defect."""
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
    if run_to_run is not None:
        return _metric_against_spread(result, name, limits, max(noise or 0.0, run_to_run), runs)
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


# Student's t at 99% (two-sided) for 1..5 degrees of freedom: a standard deviation from a few final values is
# itself uncertain (from two runs, one difference), so a defect must lie this far beyond it
T_99 = (63.66, 9.925, 5.841, 4.604, 4.032)


def _metric_against_spread(
    result: MetricComparison, name: str, limits: Thresholds, sd: float, runs: int
) -> MetricComparison:
    """The final metric of an original that does not fix its seed, held against the spread of its `runs` runs."""
    result.noise = sd
    noise = math.sqrt(1 + 1 / runs) * sd
    far = max(limits.spread_z, T_99[min(runs - 1, len(T_99)) - 1]) if runs >= 2 else math.inf
    direction = "higher" if result.higher_is_better else "lower"
    delta = (
        f"{name} {result.mig_final:.4g} vs reference {result.ref_final:.4g} ({result.gain:+.4g}, {direction} is better; "
        f"the original's runs differ by {noise:.3g})"
    )
    if result.gain >= -limits.metric_tolerance or -result.gain <= limits.noise_z * noise:
        better = result.gain > max(limits.metric_tolerance, limits.noise_z * noise)
        result.verdict = "better" if better else "same"
        note = "improvement, reported, not a failure" if better else "inside the original's run-to-run spread"
        result.reasons.append(f"{delta}: {note}")
    elif noise == 0.0 or -result.gain <= far * noise:
        result.verdict = "inconclusive"
        result.reasons.append(
            f"{delta}: worse than the tolerance {limits.metric_tolerance:g} and not clearly beyond the original's "
            f"run-to-run spread ({far:.3g}x needed with {runs} runs of it); would decide: {WHAT_WOULD_DECIDE}"
        )
    else:
        result.verdict = "worse"
        result.reasons.append(
            f"{delta}: worse by more than {far:.3g}x the original's run-to-run spread ({runs} runs) and the "
            f"tolerance {limits.metric_tolerance:g}"
        )
    return result
