"""Capture: per-step loss and evaluation metrics from what a run prints (stdout, stderr) or writes (JSON, JSONL, CSV,
text logs)."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf(?:inity)?"

# The default capture reads `KEY VALUE` pairs out of each line (`loss: 1.2`, `loss 1.2`, `loss=1.2`, `'loss': 1.2`,
# `"train/loss": 1.2`, `train loss 1.2`, `loss: tensor(1.2, ...)`), then decides from the key what each value is.
# A key is one word or two (`train loss`, `Average loss`); a number followed by `/` is a count (`Step [100/600]`).
KEY_VALUE = re.compile(
    rf"(?<![\w./])['\"]?(?P<key>[A-Za-z][\w/\-]*(?: [A-Za-z][\w\-]*)?)['\"]?\s*[:=]?\s*(?:tensor\()?"
    rf"(?P<value>{NUMBER})(?![\w./])",
    re.I,
)
# Words that may qualify a training loss (`train_loss`, `loss_train`, `Avg Loss`, `running_loss`, `train/loss`).
TRAIN_WORDS = frozenset({"train", "training", "trn", "avg", "average", "mean", "running", "total", "batch"})
# Words that make a value an evaluation's (`val_loss`, `loss_val`, `test accuracy`, `Test set: Average loss`).
EVAL_WORDS = frozenset({"eval", "evaluation", "val", "valid", "validation", "test", "dev"})
EVAL_WORD = re.compile(r"\b(?:eval|evaluation|val|valid|validation|test|dev)\b", re.I)
TRAIN_WORD = re.compile(r"\b(?:train|training)\b", re.I)
# The training-loss formats the default capture reads, for the message when a run printed none of them.
LOSS_FORMATS = (
    "loss: 1.23",
    "loss 1.23",
    "loss=1.23",
    "Loss : 1.23",
    "train_loss=1.23",
    "loss_train: 1.23",
    "training loss: 1.23",
    "Avg Loss: 1.23",
    "'loss': 1.23 (printed dicts)",
    '{"step": 10, "loss": 1.23} (JSON lines)',
    "step 10 | loss 1.23",
    "iter 10: loss 1.23",
    "loss: tensor(1.23, ...)",
    "| loss 1.23 |",
    "Loss 1.23 (1.40) (value and running average)",
    "tqdm postfix `50/100 [00:01<00:01, loss=1.23]`",
    "a printed table: a header `Epoch | Train Loss | ...` and rows of numbers",
    "logging records (stderr, or the .log/.txt file a FileHandler writes)",
    "a CSV file with a loss column (train_loss, loss_train, ...)",
)
# Kept for callers that match one line at a time (a `value` group): the plain `loss` form only.
DEFAULT_LOSS_PATTERN = rf"(?<![\w.])['\"]?loss['\"]?\s*[:=]?\s*(?P<value>{NUMBER})(?![\w.])"
STEP_PATTERN = re.compile(r"(?<![\w.])['\"]?(?:global_step|step|iter|iteration)['\"]?\s*[:=]?\s*(?P<step>\d+)", re.I)
# tqdm's bar: `50%|#####     | 50/100 [00:01<00:01, 41.2it/s, loss=1.23]`; the count is the step, since the bar is
# redrawn on a timer (two runs show different steps) and several times at the same count
TQDM_COUNT = re.compile(r"\|\s*(?P<step>\d+)/(?P<total>\d+|\?)\s*\[")

METRIC_WORDS = (
    "accuracy|acc|top1|top5|f1|precision|recall|auc|bleu|rouge[\\w]*|exact_match|matthews_correlation"
    "|perplexity|ppl|mse|mae|wer|cer"
)
METRIC_NAME = re.compile(rf"(?:{METRIC_WORDS})", re.I)
# A known metric name, or any eval_/val_/valid_/test_ key (HF Trainer's evaluation dicts).
DEFAULT_METRIC_PATTERN = (
    rf"(?<![\w.])['\"]?(?P<name>(?:(?:eval|val|valid|validation|test)_[a-z0-9_]+|{METRIC_WORDS}))['\"]?"
    rf"\s*[:=]?\s*(?P<value>{NUMBER})(?![\w.])"
)
# Keys of evaluation dicts that describe the evaluation run or its settings, not the model: `eval_runtime`,
# `eval_samples_per_second`, and the settings a configuration echo prints (`eval_iters`, `eval_interval`,
# `val_batch_size`, `eval_every`, `test_size`).
NOT_METRICS = re.compile(
    r"(runtime|per_second|samples|_steps?|epoch|_time|_seconds|_iters?|_interval|_every|_freq|_frequency"
    r"|_batch_size|_batches|_size|_seed|_workers|_num|_count)$"
)
# Lines that echo the configuration (nanoGPT's configurator, argparse's Namespace, `--key=value`, a config dump):
# what they print are settings, not measurements.
CONFIG_LINE = re.compile(
    r"^\s*(?:overrid(?:e|ing)\b|namespace\(|(?:config|configuration|args|arguments|hparams|hyperparameters|"
    r"settings|options)\b\s*[:=({]?)|namespace\(|(?:^|\s)--[\w-]+=",
    re.I,
)
# `name = 3` alone on a line, printed before training logs anything: a printed config file or an argument echo.
ASSIGNMENT_LINE = re.compile(rf"^\s*[A-Za-z_][\w.]*\s*=\s*(?:{NUMBER})\s*(?:#.*)?$", re.I)
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


def normalize_key(key: str) -> str:
    """`Train Loss`, `train/loss`, `train-loss` → `train_loss`."""
    return re.sub(r"[\s/\-]+", "_", key.strip().strip("'\"").lower())


def classify_key(key: str, before: str) -> tuple[str, str] | None:
    """("loss", key) for a training loss, ("metric", name) for an evaluation metric, None for anything else.

    `before` is the text of the line before the key: an unqualified loss after `Test set:` or `val` is that
    evaluation's loss, not the training loss."""
    name = normalize_key(key)
    first, _, rest = name.partition("_") if " " in key.strip() else ("", "", name)
    if first and first not in TRAIN_WORDS | EVAL_WORDS:
        # `kl loss`, `aux loss`: a component of the loss, not the loss; `final accuracy`: the metric itself
        return None if re.search(r"(?:^|_)loss(?:$|_)", rest) else classify_key(rest, before)
    words = name.split("_")
    if "loss" in words:
        others = [w for w in words if w != "loss"]
        if words.count("loss") == 1 and all(w in TRAIN_WORDS for w in others):
            explicit_train = any(w in ("train", "training", "trn") for w in others)
            evaluation = EVAL_WORD.search(before)
            if evaluation and not explicit_train:
                return "metric", f"{evaluation.group(0).lower()}_loss"
            return "loss", name
        if any(w in EVAL_WORDS for w in others):
            return "metric", name
        return None
    if words[0] in EVAL_WORDS or words[-1] in EVAL_WORDS:
        return None if NOT_METRICS.search(name) or name in NOT_METRIC_KEYS else ("metric", name)
    if METRIC_NAME.fullmatch(name):
        # `(Validation) accuracy: 45.1` is the validation's; `(Training) accuracy: 44.0` is not an evaluation
        evaluation = EVAL_WORD.search(before)
        if evaluation:
            return "metric", f"{evaluation.group(0).lower()}_{name}"
        return None if TRAIN_WORD.search(before) else ("metric", name)
    return None


def _line_step(line: str) -> int | None:
    match = STEP_PATTERN.search(line) or TQDM_COUNT.search(line)
    return int(match.group("step")) if match else None


def _last_per_redraw(points: list[tuple[int, int | None, float]], lines: list[str]):
    """One point per tqdm count: a bar redrawn at the same count keeps its latest value; a new bar (one per
    epoch: its count starts again) continues after the previous bar's total, so steps keep increasing."""
    kept: list[tuple[int, int | None, float]] = []
    offset, last_count, last_total = 0, None, None
    for index, step, value in points:
        bar = TQDM_COUNT.search(lines[index]) if not STEP_PATTERN.search(lines[index]) else None
        if bar is not None:
            count = int(bar.group("step"))
            if last_count is not None and count < last_count:
                offset += last_total or last_count
            last_count, last_total = count, int(bar.group("total")) if bar.group("total").isdigit() else None
            step = offset + count
            if kept and kept[-1][1] == step and TQDM_COUNT.search(lines[kept[-1][0]]):
                kept[-1] = (index, step, value)
                continue
        kept.append((index, step, value))
    return kept


def loss_lines(lines: list[str], loss_pattern: str | None = None) -> list[tuple[int, int | None, float]]:
    """(line index, step on that line or None, value) of every training-loss point in `lines`.

    With `loss_pattern` (a `value` group, or one group): its first match per line. Otherwise every key that
    names a training loss (`loss`, `train_loss`, `loss_train`, `training loss`, ...) is collected, and the one
    the run prints most often is the loss (HF's end-of-run `train_loss` loses to its per-step `loss`; nanoGPT's
    evaluation-time `train loss` to its per-iteration `loss`)."""
    if loss_pattern:
        loss_re = re.compile(loss_pattern, re.I)
        points = []
        for index, line in enumerate(lines):
            match = loss_re.search(line)
            if match:
                value = match.group("value") if "value" in loss_re.groupindex else match.group(1)
                points.append((index, _line_step(line), parse_number(value)))
        return _last_per_redraw(points, lines)
    by_key: dict[str, list[tuple[int, int | None, float]]] = {}
    for index, line in enumerate(lines):
        if CONFIG_LINE.search(line):
            continue
        seen = set()
        for match in KEY_VALUE.finditer(line):
            kind = classify_key(match.group("key"), line[: match.start()])
            if kind is None or kind[0] != "loss" or kind[1] in seen:
                continue
            seen.add(kind[1])
            by_key.setdefault(kind[1], []).append((index, _line_step(line), parse_number(match.group("value"))))
    if not by_key:
        return table_loss_lines(lines)
    return _last_per_redraw(max(by_key.items(), key=lambda item: (len(item[1]), item[0] == "loss"))[1], lines)


def _cells(line: str) -> list[str]:
    """A printed table row's cells: split at `|`, else at runs of two or more spaces or tabs."""
    parts = line.split("|") if "|" in line else re.split(r"\s{2,}|\t", line)
    return [cell.strip() for cell in parts if cell.strip()]


def _is_number(text: str) -> bool:
    return re.fullmatch(rf"(?:{NUMBER})%?", text, re.I) is not None


def table_loss_lines(lines: list[str]) -> list[tuple[int, int | None, float]]:
    """Loss points of a printed table: a header row naming its columns (`Epoch | Train Loss | Train Error`), then
    rows of numbers with as many cells; the loss column is the one whose name is a training loss, the step the
    `epoch`/`step`/`iter` column's value."""
    points: list[tuple[int, int | None, float]] = []
    loss_at = step_at = width = None
    for index, line in enumerate(lines):
        cells = _cells(line)
        if len(cells) >= 2 and not any(_is_number(c) for c in cells):
            kinds = [classify_key(c, "") if re.fullmatch(r"[A-Za-z][\w/\- ]*", c) else None for c in cells]
            losses = [i for i, kind in enumerate(kinds) if kind is not None and kind[0] == "loss"]
            if losses:
                loss_at, width = losses[0], len(cells)
                names = [normalize_key(c) for c in cells]
                step_at = next((i for i, n in enumerate(names) if n in ("epoch", "step", "iter", "iteration")), None)
            continue
        if loss_at is not None and len(cells) == width and all(_is_number(c) for c in cells):
            step = int(float(cells[step_at])) if step_at is not None else None
            points.append((index, step, parse_number(cells[loss_at].rstrip("%"))))
    return points


def parse_text(text: str, loss_pattern: str | None = None, metric_pattern: str | None = None) -> RunCurves:
    """Loss and metric points found in a run's output.

    `loss_pattern` must have a `value` group (or one group); `metric_pattern` a `value` group and
    optionally a `name` group (without one, the metric is called "metric"). Without them, see `loss_lines` and
    `classify_key`. Configuration echoes are not metrics: lines like `Overriding: eval_iters = 2`,
    `Namespace(...)`, `--key=value`, and a bare `name = 3` printed before the first loss point."""
    lines = text.splitlines()
    curves = RunCurves()
    loss_at = {}
    for index, step, value in loss_lines(lines, loss_pattern):
        loss_at[index] = len(curves.loss)
        curves.loss.add(step if step is not None else len(curves.loss), value)
    first_loss_line = min(loss_at, default=len(lines))
    metric_re = re.compile(metric_pattern, re.I) if metric_pattern else None
    evaluations: dict[str, int] = {}
    last_loss = None
    for index, line in enumerate(lines):
        if index in loss_at:
            last_loss = curves.loss.steps[loss_at[index]]
        if CONFIG_LINE.search(line) or (index < first_loss_line and ASSIGNMENT_LINE.match(line)):
            continue
        step = _line_step(line)
        for name, value in _metrics_of(line, metric_re):
            evaluations[name] = evaluations.get(name, 0) + 1
            where = step if step is not None else (last_loss if last_loss is not None else evaluations[name] - 1)
            curves.metric(name).add(where, parse_number(value))
    return curves


def _metrics_of(line: str, metric_re: re.Pattern | None) -> list[tuple[str, str]]:
    """(name, value text) of the metrics on one line."""
    if metric_re is not None:
        found = []
        for match in metric_re.finditer(line):
            name = match.group("name") if "name" in metric_re.groupindex else "metric"
            if not NOT_METRICS.search(name):
                found.append((name, match.group("value")))
        return found
    found = []
    for match in KEY_VALUE.finditer(line):
        kind = classify_key(match.group("key"), line[: match.start()])
        if kind is not None and kind[0] == "metric" and kind[1] not in dict(found):
            found.append((kind[1], match.group("value")))
    return found


def loss_key(keys: list[str]) -> str | None:
    """The training loss's key among a record's or a CSV header's: `loss`, `train_loss`, else any key that names a
    training loss (`loss_train`, `Train Loss`, `train/loss`)."""
    for key in ("loss", "train_loss"):
        if key in keys:
            return key
    return next((k for k in keys if (classify_key(str(k), "") or ("",))[0] == "loss"), None)


def add_record(curves: RunCurves, record: dict, index: int, loss: str | None = None) -> None:
    """One record (a JSON object, a CSV row) of a log file; `loss` is its loss key (default: found in the record)."""
    step = next(
        (int(record[k]) for k in ("step", "global_step", "iter", "iteration") if is_number(record.get(k))), None
    )
    loss = loss or loss_key(list(record))
    if loss is not None and is_number(record.get(loss)):
        curves.loss.add(step if step is not None else len(curves.loss), float(record[loss]))
    for key, value in record.items():
        if key == loss or key in NOT_METRIC_KEYS or NOT_METRICS.search(key) or not is_number(value):
            continue
        series = curves.metric(key)
        series.add(step if step is not None else (curves.loss.steps[-1] if curves.loss.steps else index), float(value))


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_log_file(
    path: Path, text: str | None = None, loss_pattern: str | None = None, metric_pattern: str | None = None
) -> RunCurves:
    """Loss and metrics from a JSON, JSONL or CSV file the script wrote, or a text log (.log, .txt: read like the
    output, with the patterns); `text`: its content, if already read. ValueError when it cannot be read."""
    text = path.read_text(encoding="utf-8") if text is None else text
    if path.suffix.lower() in (".log", ".txt"):
        curves = parse_text(text, loss_pattern, metric_pattern)
        curves.source = str(path)
        return curves
    curves = RunCurves(source=str(path))
    if path.suffix.lower() == ".csv":
        rows = list(csv.reader(io.StringIO(text)))
        at = csv_header(rows)
        header = rows[at] if rows else []
        loss = loss_key(header)
        for index, row in enumerate(rows[at + 1 :]):
            add_record(curves, {k: csv_value(v) for k, v in zip(header, row, strict=False) if k}, index, loss)
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


def csv_header(rows: list[list[str]]) -> int:
    """The header's row: a logger may write its settings above the table (`lr,0.1` rows, a blank row). The first
    row of names (two or more, none a number) followed by a row as long with a number in it, one naming a loss
    column first; else the first row."""
    candidates = [
        at
        for at, (row, after) in enumerate(zip(rows, rows[1:], strict=False))
        if len([cell for cell in row if cell.strip()]) >= 2
        and len(after) == len(row)
        and not any(isinstance(csv_value(cell), float) for cell in row)
        and any(isinstance(csv_value(cell), float) for cell in after)
    ]
    with_loss = [at for at in candidates if loss_key(rows[at]) is not None]
    return (with_loss or candidates or [0])[0]


def csv_value(text: str | None) -> float | str | None:
    if text is None or text.strip() == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text
