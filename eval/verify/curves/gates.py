"""The smoke gates: the migrated curve held against the reference's band over the same steps (divergence,
"loss is not falling")."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .capture import Series
from .measures import Thresholds, align, step_noise

BAND_WINDOW = 2  # steps either side: a spike of the reference one or two steps earlier or later still covers


@dataclass
class Band:
    """The reference's loss widened by its own noise: where a correct migration's curve may lie.

    At each step: the lowest and highest reference loss within `window` steps either side (a spike that
    comes a step early or late on other hardware is still covered), minus / plus `z` times the reference's
    step-to-step noise over its last 25% (the noise once training settles; spikes do not inflate it)."""

    steps: list[int]
    low: list[float]
    high: list[float]
    noise: float
    z: float
    window: int = BAND_WINDOW

    def to_dict(self) -> dict:
        return asdict(self)


def reference_band(ref: Series, z: float, window: int = BAND_WINDOW, others: tuple[Series, ...] = ()) -> Band:
    """`others`: further runs of the original (another seed): the band covers each of them too."""
    finite = [(s, v) for s, v in zip(ref.steps, ref.values, strict=True) if math.isfinite(v)]
    steps = [s for s, _ in finite]
    values = np.array([v for _, v in finite], dtype=float)
    if not len(values):
        return Band([], [], [], 0.0, z, window)
    noise = step_noise(values[-max(3, math.ceil(len(values) * 0.25)) :])
    at_step = {s: [v] for s, v in finite}
    for run in others:
        run_values = [v for v in run.values if math.isfinite(v)]
        noise = max(noise, step_noise(run_values[-max(3, math.ceil(len(run_values) * 0.25)) :]))
        for s, v in zip(run.steps, run.values, strict=True):
            if s in at_step and math.isfinite(v):
                at_step[s].append(v)
    low, high = [], []
    for i in range(len(steps)):
        near = [v for s in steps[max(0, i - window) : i + window + 1] for v in at_step[s]]
        low.append(float(min(near) - z * noise))
        high.append(float(max(near) + z * noise))
    return Band(steps, low, high, noise, z, window)


@dataclass
class Stop:
    """One smoke gate: whether it stopped the run, and why (every gate is recorded, stopped or not)."""

    gate: str  # "nan" | "budget" | "divergence" | "not_falling"
    stopped: bool
    reason: str
    step: int | None = None  # where the gate fired (the first bad step, or where the curves separate)
    against: str | None = None  # what the migrated run was held against ("the reference's noise band", ...)

    def to_dict(self) -> dict:
        return asdict(self)


def band_at(band: Band, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mask of `steps` the band covers, low, high) at those steps."""
    index = {s: i for i, s in enumerate(band.steps)}
    mask = np.array([int(s) in index for s in steps], dtype=bool)
    low = np.array([band.low[index[int(s)]] for s in steps[mask]], dtype=float)
    high = np.array([band.high[index[int(s)]] for s in steps[mask]], dtype=float)
    return mask, low, high


def stays_outside_from(steps: np.ndarray, outside: np.ndarray) -> int | None:
    """The first step from which `outside` holds to the end; None when the last step is inside."""
    if not len(outside) or not outside[-1]:
        return None
    start = len(outside) - int(np.argmin(outside[::-1])) if not outside.all() else 0
    return int(steps[start])


def divergence_gate(ref: Series, mig: Series, limits: Thresholds, others: tuple[Series, ...] = ()) -> Stop:
    """Diverged: the migrated loss rises above `explode_factor` times the top of the reference's band, and is still
    above the band at the last common step. A spike that comes back into the band is noted, not stopped.
    `others`: further runs of the original, whose curves the band covers as well."""
    band = reference_band(ref, limits.noise_z, others=others)
    against = f"the reference's noise band (±{band.z:g}x its step noise {band.noise:.3g}, ±{band.window} steps)"
    steps = np.array(sorted(set(mig.steps) & set(band.steps)), dtype=int)
    if not len(steps):
        return Stop("divergence", False, "no common steps with the reference: not judged", against=against)
    by_step = dict(zip(mig.steps, mig.values, strict=True))
    m = np.array([by_step[int(s)] for s in steps], dtype=float)
    _, _, high = band_at(band, steps)
    ceiling = high + (limits.explode_factor - 1.0) * np.abs(high)
    over = m > ceiling
    if not over.any():
        return Stop(
            "divergence",
            False,
            f"the migrated loss stays below {limits.explode_factor:g}x the top of the reference's band at all "
            f"{len(steps)} common steps",
            against=against,
        )
    first = int(np.argmax(over))
    what = (
        f"loss {m[first]:.4g} at step {steps[first]}, more than {limits.explode_factor:g}x the top of the "
        f"reference's band there ({high[first]:.4g})"
    )
    separate = stays_outside_from(steps, m > high)
    if separate is None:
        return Stop(
            "divergence",
            False,
            f"{what}, but it came back into the band by step {steps[-1]}: a spike, not a divergence",
            step=int(steps[first]),
            against=against,
        )
    return Stop(
        "divergence",
        True,
        f"the migrated smoke test diverged from the reference: {what}; it stays above the band from step {separate} "
        f"to the last common step {steps[-1]} ({m[-1]:.4g} vs at most {high[-1]:.4g})",
        step=separate,
        against=against,
    )


def falling_gate(ref: Series, mig: Series, limits: Thresholds) -> Stop:
    """Not falling: over the common steps, the reference's mean loss falls from the first 25% to the last 25% by more
    than `noise_z` standard errors of that difference, and the migrated run's does not."""
    steps, r, m = align(ref, mig)
    against = "the reference's fall over the same steps (first vs last 25%, in standard errors)"
    if len(steps) < 8 or not (np.all(np.isfinite(r)) and np.all(np.isfinite(m))):
        return Stop("not_falling", False, "too few common finite steps to judge", against=against)
    quarter = max(2, math.ceil(len(steps) * 0.25))

    def fall(values: np.ndarray) -> tuple[float, float]:
        head, tail = values[:quarter], values[-quarter:]
        se = math.sqrt((np.var(head, ddof=1) + np.var(tail, ddof=1)) / quarter)
        return float(head.mean() - tail.mean()), se

    (ref_fall, ref_se), (mig_fall, mig_se) = fall(r), fall(m)
    numbers = (
        f"over steps {steps[0]}-{steps[-1]} the mean loss of the first and last 25% goes from "
        f"{r[:quarter].mean():.4g} to {r[-quarter:].mean():.4g} in the reference, from {m[:quarter].mean():.4g} to "
        f"{m[-quarter:].mean():.4g} in the migrated run"
    )
    if ref_fall <= limits.noise_z * ref_se:
        return Stop("not_falling", False, f"the reference does not clearly fall either ({numbers})", against=against)
    if mig_fall > limits.noise_z * mig_se:
        return Stop("not_falling", False, f"the loss falls like the reference's ({numbers})", against=against)
    return Stop(
        "not_falling",
        True,
        f"the migrated loss is not falling while the reference's does: {numbers} (a fall of more than "
        f"{limits.noise_z:g} standard errors in the reference only)",
        step=int(steps[0]),
        against=against,
    )
