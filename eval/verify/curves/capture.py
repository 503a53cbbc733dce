"""Capture: per-step loss and evaluation metrics from what a run prints (stdout) or writes (JSON, JSONL, CSV)."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

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


def parse_number(text: str) -> float:
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
            curves.loss.add(step if step is not None else len(curves.loss), parse_number(value))
        for match in metric_re.finditer(line):
            name = match.group("name") if "name" in metric_re.groupindex else "metric"
            if NOT_METRICS.search(name):
                continue
            evaluations[name] = evaluations.get(name, 0) + 1
            where = (
                step if step is not None else (curves.loss.steps[-1] if curves.loss.steps else evaluations[name] - 1)
            )
            curves.metric(name).add(where, parse_number(match.group("value")))
    return curves


def add_record(curves: RunCurves, record: dict, index: int) -> None:
    step = next(
        (int(record[k]) for k in ("step", "global_step", "iter", "iteration") if is_number(record.get(k))), None
    )
    for key in ("loss", "train_loss"):
        if is_number(record.get(key)):
            curves.loss.add(step if step is not None else len(curves.loss), float(record[key]))
            break
    for key, value in record.items():
        if key in NOT_METRIC_KEYS or NOT_METRICS.search(key) or not is_number(value):
            continue
        series = curves.metric(key)
        series.add(step if step is not None else (curves.loss.steps[-1] if curves.loss.steps else index), float(value))


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_log_file(path: Path, text: str | None = None) -> RunCurves:
    """Loss and metrics from a JSON, JSONL or CSV file the script wrote (`text`: its content, if already read);
    ValueError when it cannot be read."""
    text = path.read_text(encoding="utf-8") if text is None else text
    curves = RunCurves(source=str(path))
    if path.suffix.lower() == ".csv":
        for index, row in enumerate(csv.DictReader(io.StringIO(text))):
            add_record(curves, {k: csv_value(v) for k, v in row.items() if k}, index)
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
                add_record(curves, record, index)
        return curves
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object or a list of records")
    add_summary(curves, data)
    return curves


def add_summary(curves: RunCurves, data: dict) -> None:
    """{"loss": [...], "accuracy": 0.9, "evals": [{...}, ...]}: lists are per-step series, numbers final values."""
    for key, value in data.items():
        if key not in ("loss", "losses", "train_loss") and (key in NOT_METRIC_KEYS or NOT_METRICS.search(key)):
            continue
        if isinstance(value, list) and value and all(is_number(v) for v in value):
            series = curves.loss if key in ("loss", "losses", "train_loss") else curves.metric(key)
            for step, v in enumerate(value):
                series.add(step, float(v))
        elif isinstance(value, list):
            for index, record in enumerate(value):
                if isinstance(record, dict):
                    add_record(curves, record, index)
    last_step = curves.loss.steps[-1] + 1 if curves.loss.steps else 0
    for key, value in data.items():
        if is_number(value) and key not in NOT_METRIC_KEYS and not NOT_METRICS.search(key):
            curves.metric(key).add(max([last_step, *curves.metric(key).steps]), float(value))


def csv_value(text: str | None) -> float | str | None:
    if text is None or text.strip() == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text
