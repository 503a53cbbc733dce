"""Training curves: capturing per-step loss and evaluation metrics from a run, and comparing two runs.

Capture reads what a training script already prints or writes (no changes to the script):
- stdout lines such as `loss 0.123`, `loss=0.123`, `Loss: 0.123`, `'loss': 0.123` (HF Trainer log
  dicts), `eval_accuracy=0.91`, `accuracy: 0.91`, `{'eval_loss': 0.4, ...}`; a `step N` on the same
  line gives the step, otherwise points are numbered in order;
- or a JSON / JSONL / CSV file the script writes (records with `step`, `loss` and metric columns,
  or `{"loss": [...], "accuracy": 0.9, "evals": [{"step": 20, "val_loss": 1.2}]}`).

Comparison is deliberately asymmetric: a migrated run whose loss ends lower, or whose metric ends
better, than the reference is reported as an improvement, never as a failure. A difference is only
called a regression when it is larger than both the tolerance and the noise (for the loss: the
standard error of the paired per-step difference over the last 25% of steps; for a metric: the
reference's own evaluation-to-evaluation noise or a given one); when the tolerance is exceeded but the
noise could explain it, the verdict is "inconclusive". The first logged loss is the exception: it is
computed before any update, so a difference there is never an improvement (a different objective).

The smoke gates (divergence, "loss is not falling") are relative too: the migrated curve is held against
the reference's curve over the same steps, widened by the reference's own noise (`reference_band`), so a
spike the original has as well is not a failure. Only NaN/inf stops a run on its own.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf(?:inity)?"

# `loss` as a word of its own: not `eval_loss`, `train_loss` (HF's end-of-run mean) or `val_loss`.
DEFAULT_LOSS_PATTERN = rf"(?<![\w.])['\"]?loss['\"]?\s*[:=]?\s*(?P<value>{NUMBER})(?![\w.])"
STEP_PATTERN = re.compile(r"(?<![\w.])['\"]?(?:global_step|step|iter|iteration)['\"]?\s*[:=]?\s*(?P<step>\d+)", re.I)

METRIC_WORDS = (
    "accuracy|acc|top1|top5|f1|precision|recall|auc|bleu|rouge[\\w]*|exact_match|matthews_correlation"
    "|perplexity|ppl|mse|mae|wer|cer"
)
# A known metric name, or any eval_/val_/valid_/test_ key (HF Trainer's evaluation dicts).
DEFAULT_METRIC_PATTERN = (
    rf"(?<![\w.])['\"]?(?P<name>(?:(?:eval|val|valid|validation|test)_[a-z0-9_]+|{METRIC_WORDS}))['\"]?"
    rf"\s*[:=]?\s*(?P<value>{NUMBER})(?![\w.])"
)
# Keys of evaluation dicts that describe the evaluation run, not the model.
NOT_METRICS = re.compile(r"(runtime|per_second|samples|_steps?|epoch|_time|_seconds)$")
# Keys of log files that are bookkeeping, not metrics.
NOT_METRIC_KEYS = frozenset(
    {
        "step",
        "global_step",
        "iter",
        "iteration",
        "epoch",
        "loss",
        "train_loss",
        "lr",
        "learning_rate",
        "grad_norm",
        "time",
        "wall_time",
        "timestamp",
        "train_seconds",
        "step_time",
        "seconds",
        # a recorded reference log's run facts (read_reference_log)
        "step_time_s",
        "step_s",
        "seconds_per_step",
        "price_per_hour",
        "price_per_h",
        "usd_per_hour",
        "price",
    }
)
MIN_NOISE_EVALS = 4  # evaluations in the second half needed to estimate a metric's noise from the reference
LOWER_IS_BETTER = re.compile(r"(loss|perplexity|ppl|error|err|mse|mae|wer|cer)", re.I)


@dataclass
class Series:
    """Values of one quantity by step (steps are the script's own numbers, or the order of appearance)."""

    name: str
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, step: int, value: float) -> None:
        self.steps.append(step)
        self.values.append(value)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def final(self) -> float | None:
        return self.values[-1] if self.values else None


@dataclass
class RunCurves:
    """What a run reported: training loss per step, each evaluation metric per evaluation."""

    loss: Series = field(default_factory=lambda: Series("loss"))
    metrics: dict[str, Series] = field(default_factory=dict)
    source: str = "stdout"

    def metric(self, name: str) -> Series:
        return self.metrics.setdefault(name, Series(name))

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "loss": asdict(self.loss),
            "metrics": {name: asdict(series) for name, series in self.metrics.items()},
        }


def higher_is_better(name: str, overrides: dict[str, str] | None = None) -> bool:
    """Metric direction: `overrides` maps a name to "higher" or "lower"; otherwise loss-like names are lower-better."""
    for key, direction in (overrides or {}).items():
        if key == name:
            return direction.lower().startswith("h")
    return not LOWER_IS_BETTER.search(name)


def _number(text: str) -> float:
    return float(text.lower().replace("infinity", "inf"))


def parse_text(text: str, loss_pattern: str | None = None, metric_pattern: str | None = None) -> RunCurves:
    """Loss and metric points found in a run's output.

    `loss_pattern` must have a `value` group (or one group); `metric_pattern` a `value` group and
    optionally a `name` group (without one, the metric is called "metric").
    """
    loss_re = re.compile(loss_pattern or DEFAULT_LOSS_PATTERN, re.I)
    metric_re = re.compile(metric_pattern or DEFAULT_METRIC_PATTERN, re.I)
    curves = RunCurves()
    evaluations: dict[str, int] = {}
    for line in text.splitlines():
        step_match = STEP_PATTERN.search(line)
        step = int(step_match.group("step")) if step_match else None
        loss_match = loss_re.search(line)
        if loss_match:
            value = loss_match.group("value") if "value" in loss_re.groupindex else loss_match.group(1)
            curves.loss.add(step if step is not None else len(curves.loss), _number(value))
        for match in metric_re.finditer(line):
            name = match.group("name") if "name" in metric_re.groupindex else "metric"
            if NOT_METRICS.search(name):
                continue
            evaluations[name] = evaluations.get(name, 0) + 1
            where = (
                step if step is not None else (curves.loss.steps[-1] if curves.loss.steps else evaluations[name] - 1)
            )
            curves.metric(name).add(where, _number(match.group("value")))
    return curves


def _add_record(curves: RunCurves, record: dict, index: int) -> None:
    step = next(
        (int(record[k]) for k in ("step", "global_step", "iter", "iteration") if _is_number(record.get(k))), None
    )
    for key in ("loss", "train_loss"):
        if _is_number(record.get(key)):
            curves.loss.add(step if step is not None else len(curves.loss), float(record[key]))
            break
    for key, value in record.items():
        if key in NOT_METRIC_KEYS or NOT_METRICS.search(key) or not _is_number(value):
            continue
        series = curves.metric(key)
        series.add(step if step is not None else (curves.loss.steps[-1] if curves.loss.steps else index), float(value))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_log_file(path: Path, text: str | None = None) -> RunCurves:
    """Loss and metrics from a JSON, JSONL or CSV file the script wrote (`text`: its content, if already read);
    ValueError when it cannot be read."""
    text = path.read_text(encoding="utf-8") if text is None else text
    curves = RunCurves(source=str(path))
    if path.suffix.lower() == ".csv":
        for index, row in enumerate(csv.DictReader(io.StringIO(text))):
            _add_record(curves, {k: _csv_value(v) for k, v in row.items() if k}, index)
        return curves
    try:
        data = json.loads(text)
        records = None
    except json.JSONDecodeError:  # JSON lines
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: neither JSON nor JSON lines ({exc})") from None
        data = None
    if isinstance(data, list):
        records = data
    if records is not None:
        for index, record in enumerate(records):
            if isinstance(record, dict):
                _add_record(curves, record, index)
        return curves
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object or a list of records")
    _add_summary(curves, data)
    return curves


# --- a recorded reference run (verify --reference-log) --------------------------------------------

DEVICE_KEYS = ("device", "device_name", "gpu")
PRICE_KEYS = ("price_per_hour", "price_per_h", "usd_per_hour", "price")
STEP_TIME_KEYS = ("step_time_s", "step_s", "seconds_per_step", "step_time")


@dataclass
class ReferenceLog:
    """A run of the original on real GPUs, as its user recorded it: loss per step, metrics, step times, device, price.

    Accepted forms (the same as the scripts' own log files, plus the run facts):
    - JSON lines or a JSON list of records: `{"step": 0, "loss": 2.3, "step_time_s": 0.041}`, metric keys
      (`eval_accuracy`, ...) on any record, `device` / `price_per_hour` on any record (the first wins);
    - a JSON object: `{"device": "NVIDIA H200", "price_per_hour": 3.5, "loss": [...], "step_time_s": [...] or 0.041,
      "accuracy": 0.966, "evals": [{"step": 100, "eval_accuracy": 0.9}]}`;
    - CSV with the same column names (`step,loss,step_time_s,eval_accuracy,device`)."""

    path: str
    curves: RunCurves
    device: str | None
    price_per_hour: float | None
    per_step_s: list[float]
    step_s: float | None  # median seconds per step after the warm-up steps

    @property
    def label(self) -> str:
        return f"{self.device or 'unnamed GPU'} (recorded in {Path(self.path).name})"


def _raw_records(path: Path, text: str) -> list[dict]:
    """Every record of a log file as a dict (a JSON object is one record, plus the records of its lists)."""
    if path.suffix.lower() == ".csv":
        return [{k: _csv_value(v) for k, v in row.items() if k} for row in csv.DictReader(io.StringIO(text))]
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        nested = [r for v in data.values() if isinstance(v, list) for r in v if isinstance(r, dict)]
        return [data, *nested]
    return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []


def read_reference_log(path: Path, warmup: int = 2) -> ReferenceLog:
    """The recorded run in `path`; ValueError when it cannot be read or holds neither a loss nor a metric."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the reference log {path}: {exc}") from None
    curves = parse_log_file(path, text)
    if not len(curves.loss) and not any(len(series) for series in curves.metrics.values()):
        raise ValueError(f"{path}: no loss and no metric found (expected records like {{'step': 0, 'loss': 2.3}})")
    records = _raw_records(path, text)
    device = next((str(r[k]) for r in records for k in DEVICE_KEYS if isinstance(r.get(k), str) and r[k]), None)
    price = next((float(r[k]) for r in records for k in PRICE_KEYS if _is_number(r.get(k))), None)
    per_step: list[float] = []
    for record in records:
        for key in STEP_TIME_KEYS:
            value = record.get(key)
            if isinstance(value, list):
                per_step += [float(v) for v in value if _is_number(v)]
            elif _is_number(value):  # per record, or one number for the whole run
                per_step.append(float(value))
    steady = per_step[warmup:] or per_step
    return ReferenceLog(
        path=str(path),
        curves=curves,
        device=device,
        price_per_hour=price,
        per_step_s=per_step,
        step_s=float(np.median(steady)) if steady else None,
    )


def _add_summary(curves: RunCurves, data: dict) -> None:
    """{"loss": [...], "accuracy": 0.9, "evals": [{...}, ...]}: lists are per-step series, numbers final values."""
    for key, value in data.items():
        if key not in ("loss", "losses", "train_loss") and (key in NOT_METRIC_KEYS or NOT_METRICS.search(key)):
            continue
        if isinstance(value, list) and value and all(_is_number(v) for v in value):
            series = curves.loss if key in ("loss", "losses", "train_loss") else curves.metric(key)
            for step, v in enumerate(value):
                series.add(step, float(v))
        elif isinstance(value, list):
            for index, record in enumerate(value):
                if isinstance(record, dict):
                    _add_record(curves, record, index)
    last_step = curves.loss.steps[-1] + 1 if curves.loss.steps else 0
    for key, value in data.items():
        if _is_number(value) and key not in NOT_METRIC_KEYS and not NOT_METRICS.search(key):
            curves.metric(key).add(max([last_step, *curves.metric(key).steps]), float(value))


def _csv_value(text: str | None) -> float | str | None:
    if text is None or text.strip() == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text


# --- per-line timestamps (step time) ----------------------------------------------------------

# Installed as `sitecustomize` in the child (through PYTHONPATH): copies every stdout line, with the
# time it was written, to $XLAPORT_STAMPS. It only observes output; the script computes the same.
STAMP_SITECUSTOMIZE = """
import os, sys, time
_path = os.environ.get("XLAPORT_STAMPS")
if _path:
    class _Stamped:
        def __init__(self, inner, log):
            self._inner, self._log, self._pending = inner, log, ""
        def write(self, text):
            self._pending += text
            *lines, self._pending = self._pending.split("\\n")
            now = time.monotonic()
            for line in lines:
                self._log.write(f"{now:.6f}\\t{line}\\n")
            if lines:
                self._log.flush()
            return self._inner.write(text)
        def __getattr__(self, name):
            return getattr(self._inner, name)
    _log = open(_path, "a", encoding="utf-8", buffering=1)
    _log.write(f"{time.monotonic():.6f}\\t#xlaport-start\\n")
    sys.stdout = _Stamped(sys.stdout, _log)
"""

STAMP_START = "#xlaport-start"


@dataclass
class Timing:
    """Start-up time (process start to the first loss line) and seconds per step after warm-up."""

    startup_s: float | None = None
    step_s: float | None = None
    per_step_s: list[float] = field(default_factory=list)  # time between consecutive loss lines, per step


def parse_stamps(text: str, loss_pattern: str | None = None, warmup: int = 2) -> tuple[str, Timing]:
    """(stdout text, timing) from a stamp file written by STAMP_SITECUSTOMIZE."""
    loss_re = re.compile(loss_pattern or DEFAULT_LOSS_PATTERN, re.I)
    lines, start, loss_times, loss_steps = [], None, [], []
    for raw in text.splitlines():
        stamp, _, line = raw.partition("\t")
        try:
            when = float(stamp)
        except ValueError:
            continue
        if line == STAMP_START:
            start = when if start is None else start
            continue
        lines.append(line)
        if loss_re.search(line):
            step_match = STEP_PATTERN.search(line)
            loss_times.append(when)
            loss_steps.append(int(step_match.group("step")) if step_match else len(loss_steps))
    timing = Timing()
    if start is not None and loss_times:
        timing.startup_s = loss_times[0] - start
    for i in range(1, len(loss_times)):
        gap = max(loss_steps[i] - loss_steps[i - 1], 1)
        timing.per_step_s.append((loss_times[i] - loss_times[i - 1]) / gap)
    steady = timing.per_step_s[warmup:] or timing.per_step_s
    if steady:
        timing.step_s = float(np.median(steady))
    return "\n".join(lines), timing


# --- comparisons --------------------------------------------------------------------------------


@dataclass
class Thresholds:
    """When a difference counts. Tolerances are triggers for a closer look, as in the study's smoke-test gate."""

    loss_tolerance: float = 0.05  # relative difference of the last-25% mean loss
    initial_loss_tolerance: float = 0.03  # relative difference of the first logged loss (before any update)
    metric_tolerance: float = 0.01  # absolute, in the metric's own units (0.01 = one point of a 0-1 accuracy)
    noise_z: float = 2.0  # a regression must exceed this many standard errors of the noise
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


def reference_band(ref: Series, z: float, window: int = BAND_WINDOW) -> Band:
    finite = [(s, v) for s, v in zip(ref.steps, ref.values, strict=True) if math.isfinite(v)]
    steps = [s for s, _ in finite]
    values = np.array([v for _, v in finite], dtype=float)
    if not len(values):
        return Band([], [], [], 0.0, z, window)
    noise = step_noise(values[-max(3, math.ceil(len(values) * 0.25)) :])
    low, high = [], []
    for i in range(len(values)):
        near = values[max(0, i - window) : i + window + 1]
        low.append(float(near.min() - z * noise))
        high.append(float(near.max() + z * noise))
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


def _band_at(band: Band, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def divergence_gate(ref: Series, mig: Series, limits: Thresholds) -> Stop:
    """Diverged: the migrated loss rises above `explode_factor` times the top of the reference's band, and is still
    above the band at the last common step. A spike that comes back into the band is noted, not stopped."""
    band = reference_band(ref, limits.noise_z)
    against = f"the reference's noise band (±{band.z:g}x its step noise {band.noise:.3g}, ±{band.window} steps)"
    steps = np.array(sorted(set(mig.steps) & set(band.steps)), dtype=int)
    if not len(steps):
        return Stop("divergence", False, "no common steps with the reference: not judged", against=against)
    by_step = dict(zip(mig.steps, mig.values, strict=True))
    m = np.array([by_step[int(s)] for s in steps], dtype=float)
    _, _, high = _band_at(band, steps)
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
    covered, low, high = _band_at(reference_band(ref, limits.noise_z), steps)
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


# --- stated claims ------------------------------------------------------------------------------

CLAIM_RE = re.compile(rf"^\s*(?P<name>[A-Za-z_][\w.]*)\s*(?P<op>>=|<=|>|<)\s*(?P<value>{NUMBER})\s*%?\s*$")


@dataclass
class Claim:
    name: str
    op: str
    value: float

    def holds(self, observed: float) -> bool:
        return {
            ">=": observed >= self.value,
            "<=": observed <= self.value,
            ">": observed > self.value,
            "<": observed < self.value,
        }[self.op]

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value:g}"


def parse_claim(text: str) -> Claim:
    """`accuracy>=0.95` → Claim; ValueError with the expected form otherwise."""
    match = CLAIM_RE.match(text)
    if not match:
        raise ValueError(f'cannot read the claim {text!r}: expected NAME OP NUMBER, e.g. "accuracy>=0.95"')
    return Claim(match.group("name"), match.group("op"), _number(match.group("value")))


def find_metric(curves: RunCurves, name: str) -> Series | None:
    """The series called `name`, or its eval_/val_/test_ variant; `loss` is the training loss."""
    if name == "loss":
        return curves.loss if len(curves.loss) else None
    for candidate in (name, f"eval_{name}", f"val_{name}", f"valid_{name}", f"test_{name}"):
        series = curves.metrics.get(candidate)
        if series is not None and len(series):
            return series
    return None


def primary_metric(curves: RunCurves, preferred: str | None = None) -> str | None:
    """The metric that stands for the project's goal: `preferred`, else the first non-loss one, else any."""
    if preferred:
        series = find_metric(curves, preferred)
        return series.name if series is not None else preferred
    names = [n for n, s in curves.metrics.items() if len(s)]
    non_loss = [n for n in names if not LOWER_IS_BETTER.search(n)]
    return (non_loss or names or [None])[0]
