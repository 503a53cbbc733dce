"""What a comparison measures and returns: thresholds, the loss and metric comparisons, and the numeric helpers
both the comparisons and the gates use."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .capture import Series


@dataclass
class Thresholds:
    """When a difference counts. Tolerances are triggers for a closer look, as in the study's smoke-test gate."""

    loss_tolerance: float = 0.05  # relative difference of the last-25% mean loss
    initial_loss_tolerance: float = 0.03  # relative difference of the first logged loss (before any update)
    metric_tolerance: float = 0.01  # absolute, in the metric's own units (0.01 = one point of a 0-1 accuracy)
    noise_z: float = 2.0  # a regression must exceed this many standard errors of the noise
    spread_z: float = 5.0  # without a fixed seed: a regression must exceed this many run-to-run deviations
    min_steps: int = 20  # fewer aligned loss points than this cannot decide
    explode_factor: float = 3.0  # migrated loss above this multiple of the reference's largest loss = diverged
    trend_min: float = 0.3  # |Spearman| of loss against step above which a curve has a clear trend


@dataclass
class LossComparison:
    steps_compared: int
    verdict: str  # "same" | "better" | "worse" | "diverged" | "inconclusive"
    reasons: list[str] = field(default_factory=list)
    ref_initial: float | None = None
    mig_initial: float | None = None
    initial_rel_diff: float | None = None
    ref_final: float | None = None
    mig_final: float | None = None
    ref_tail_mean: float | None = None
    mig_tail_mean: float | None = None
    tail_rel_diff: float | None = None  # (migrated - reference) / |reference|; positive = migrated worse
    tail_noise_se: float | None = None  # standard error of the paired tail difference, relative to the reference
    ref_step_noise: float | None = None  # the reference's own step-to-step noise in the tail, relative
    curve_distance: float | None = None  # mean relative difference over aligned steps
    separates_at_step: int | None = None  # first aligned step from which the curves stay apart
    departs_at_step: int | None = None  # first aligned step where they are apart (beyond tolerance and band)
    ref_trend: float | None = None  # Spearman of loss against step
    mig_trend: float | None = None
    curve_spearman: float | None = None  # Spearman between the two curves
    run_to_run_noise: float | None = None  # relative noise of the tail difference from the original's own spread
    confidence: str = ""  # how far the figures can be trusted, in words (points, noise, spread)
    # the first logged loss is outside what two runs of an unseeded original show, by less than two runs can
    # blame on the migration: another run of the original would decide (verify runs it when it can)
    another_run_would_decide: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class MetricComparison:
    name: str
    higher_is_better: bool
    verdict: str  # "same" | "better" | "worse" | "inconclusive" | "missing"
    reasons: list[str] = field(default_factory=list)
    ref_final: float | None = None
    mig_final: float | None = None
    gain: float | None = None  # positive = migrated better, in the metric's units
    noise: float | None = None  # the reference's own evaluation-to-evaluation noise, when it can be estimated
    evaluations: tuple[int, int] = (0, 0)

    def to_dict(self) -> dict:
        return asdict(self)


def spearman(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> float | None:
    """Rank correlation; None when either side is constant or too short."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return None
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def step_noise(values: list[float] | np.ndarray) -> float:
    """Step-to-step noise: spread of consecutive differences / sqrt(2) (a slow trend barely contributes)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 3:
        return 0.0
    return float(np.std(np.diff(values), ddof=1) / math.sqrt(2))


def align(ref: Series, mig: Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps both runs logged (the last value wins for a repeated step), with both runs' values."""
    ref_by_step, mig_by_step = (
        dict(zip(ref.steps, ref.values, strict=True)),
        dict(zip(mig.steps, mig.values, strict=True)),
    )
    steps = sorted(set(ref_by_step) & set(mig_by_step))
    return (
        np.array(steps, dtype=int),
        np.array([ref_by_step[s] for s in steps], dtype=float),
        np.array([mig_by_step[s] for s in steps], dtype=float),
    )


def first_bad_value(series: Series) -> tuple[int, float] | None:
    """(step, value) of the first NaN or infinite loss."""
    for step, value in zip(series.steps, series.values, strict=True):
        if not math.isfinite(value):
            return step, value
    return None
