"""The original's run-to-run spread: how much two runs of the unchanged program differ from each other.

A program that fixes its seed logs the same first loss in every run (before any update, the same weights see the
same batch); one that does not starts from other weights and batches each time, and a migrated run differs from
the reference by that much with nothing wrong. Two runs of the original (or several recorded runs) measure it; a
difference inside it is never blamed on the migration."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .capture import Series
from .measures import spearman, step_noise

SAME_FIRST_LOSS = 1e-5  # relative: first logged losses closer than this are the same (a fixed seed)


@dataclass
class Spread:
    """Run-to-run noise of the original, relative to its loss (0.02 = 2%): one run's standard deviation."""

    runs: int  # runs of the original compared
    steps: int  # loss points all of them logged
    first_losses: list[float]  # each run's first logged loss: equal when the program fixes its seed
    seeded: bool  # the first logged losses agree (within SAME_FIRST_LOSS)
    rel_sd: float  # of the loss at one step, pooled over the common steps
    first_rel_sd: float  # of the first logged loss (at least the pooled value over the first 25% of common steps)
    tail_rel_sd: float  # of the mean loss over the last 25% of the common steps (what L3 compares)
    trends: list[float | None] = field(default_factory=list)  # each run's Spearman of loss against step
    source: str = ""  # where the runs come from ("two runs of the original here", "recorded logs")
    curves: list[Series] = field(default_factory=list, repr=False)  # the runs' loss curves (not in to_dict)

    @property
    def measured(self) -> bool:
        """Whether the runs differ at all (a program that fixes its seed and runs deterministically does not)."""
        return self.rel_sd > 0.0

    def describe(self) -> str:
        firsts = ", ".join(f"{v:.6g}" for v in self.first_losses)
        if self.seeded and not self.measured:
            return (
                f"the original fixes its seed: {self.runs} runs ({self.source}) log the same loss at all "
                f"{self.steps} common steps (first {firsts})"
            )
        if self.seeded:
            return (
                f"the original fixes its seed (first logged losses {firsts}) but its runs drift apart by "
                f"{self.rel_sd:.2%} (standard deviation over {self.steps} common steps; {self.source}): "
                "non-deterministic kernels"
            )
        return (
            f"the original does not fix its seed: {self.runs} runs ({self.source}) log first losses {firsts}; "
            f"one run deviates from another by {self.rel_sd:.2%} of the loss at a step ({self.first_rel_sd:.2%} at "
            f"the first step, {self.tail_rel_sd:.2%} for the mean over the last 25%; {self.steps} common steps): "
            "differences inside this spread are randomness, not the migration"
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        del data["curves"]
        return data


def measure_spread(runs: list[Series], source: str) -> Spread | None:
    """The spread of two or more loss curves of the original; None when fewer than two have a finite loss."""
    runs = [r for r in runs if len(r) and all(math.isfinite(v) for v in r.values)]
    if len(runs) < 2:
        return None
    by_step = [dict(zip(r.steps, r.values, strict=True)) for r in runs]
    common = sorted(set.intersection(*(set(d) for d in by_step)))
    firsts = [r.values[0] for r in runs]
    scale = max(abs(float(np.mean(firsts))), 1e-12)
    seeded = (max(firsts) - min(firsts)) / scale <= SAME_FIRST_LOSS
    trends = [spearman(r.steps, r.values) for r in runs]
    if not common:
        return Spread(len(runs), 0, firsts, seeded, 0.0, 0.0, 0.0, trends, source, runs)
    values = np.array([[d[s] for s in common] for d in by_step], dtype=float)  # runs x steps
    rel = np.std(values, axis=0, ddof=1) / np.maximum(np.abs(values.mean(axis=0)), 1e-12)
    quarter = max(1, math.ceil(len(common) * 0.25))
    tail_means = values[:, -quarter:].mean(axis=1)
    return Spread(
        runs=len(runs),
        steps=len(common),
        first_losses=firsts,
        seeded=seeded,
        rel_sd=_pooled(rel),
        # one pair says little about one step: the first quarter's steps, pooled, are a floor for the first
        first_rel_sd=max(float(rel[0]), _pooled(rel[:quarter])),
        tail_rel_sd=float(np.std(tail_means, ddof=1) / max(abs(float(tail_means.mean())), 1e-12)),
        trends=trends,
        source=source,
        curves=runs,
    )


def _pooled(rel_sds: np.ndarray) -> float:
    return float(np.sqrt(np.mean(rel_sds**2)))


@dataclass
class AgainstRuns:
    """The migrated run held against the center of the original's runs (not one of them, which may be an outlier):
    relative differences and the noise of each (one run's standard deviation x sqrt(1 + 1/runs))."""

    runs: int
    first_diff: float
    first_noise: float
    tail_diff: float
    tail_noise: float


def against_runs(mig: Series, spread: Spread, ref: Series) -> AgainstRuns | None:
    """`ref` is the deciding reference (one of the spread's runs, or a recorded log the spread was measured beside);
    None when the migrated run shares fewer than two steps with the original's runs."""
    mig_by_step = dict(zip(mig.steps, mig.values, strict=True))
    last = max(set(mig_by_step) & set(ref.steps), default=None)
    # the runs that reach the end of the comparison (a repeat cut short does not), the deciding one first
    runs = [ref, *(r for r in spread.curves if r is not ref and last is not None and last in r.steps)]
    by_step = [dict(zip(r.steps, r.values, strict=True)) for r in runs]
    common = sorted(set(mig_by_step).intersection(*(set(d) for d in by_step)))
    if len(common) < 2:
        return None
    values = np.array([[d[s] for s in common] for d in by_step], dtype=float)
    m = np.array([mig_by_step[s] for s in common], dtype=float)
    quarter = max(2, math.ceil(len(common) * 0.25))
    first_center = float(values[:, 0].mean())
    tail_means = values[:, -quarter:].mean(axis=1)
    tail_center = float(tail_means.mean())
    # one run's tail-mean deviation: the runs' own spread of it, at least what their batch noise gives
    half = max(3, len(common) // 2)  # the batch noise, estimated over the last half (more points than the tail)
    batch = [step_noise(row[-half:]) ** 2 / quarter for row in (*values, m)]
    tail_var = max(float(np.var(tail_means, ddof=1)) if len(runs) > 1 else 0.0, float(np.mean(batch)))
    if len(runs) == 1:  # a repeat cut short: its spread over the steps it logged stands for the tail
        tail_var = max(tail_var, (spread.tail_rel_sd * tail_center) ** 2)
    widen = math.sqrt(1 + 1 / len(runs))
    return AgainstRuns(
        runs=len(runs),
        first_diff=(float(m[0]) - first_center) / max(abs(first_center), 1e-12),
        first_noise=spread.first_rel_sd * widen,
        tail_diff=(float(m[-quarter:].mean()) - tail_center) / max(abs(tail_center), 1e-12),
        tail_noise=math.sqrt(tail_var) * widen / max(abs(tail_center), 1e-12),
    )
