"""Training curves: capturing per-step loss and evaluation metrics from a run, and comparing two runs.

Capture reads what a training script already prints or writes (no changes to the script):
- stdout lines such as `loss 0.123`, `loss=0.123`, `Loss: 0.123`, `train_loss=0.123`, `loss_train: 0.123`,
  `training loss: 0.123`, `'loss': 0.123` (HF Trainer log dicts), JSON lines, `eval_accuracy=0.91`,
  `accuracy: 0.91`, `val loss 0.4`, `{'eval_loss': 0.4, ...}` (`LOSS_FORMATS` lists the loss forms); a `step N`
  or `iter N` on the same line gives the step, otherwise points are numbered in order. Configuration echoes
  (`Overriding: eval_iters = 2`, `Namespace(...)`, `--key=value`) are not metrics;
- or a JSON / JSONL / CSV file the script writes (records with `step`, `loss` and metric columns,
  or `{"loss": [...], "accuracy": 0.9, "evals": [{"step": 20, "val_loss": 1.2}]}`).

Comparison is deliberately asymmetric: a migrated run whose loss ends lower, or whose metric ends
better, than the reference is reported as an improvement, never as a failure. A difference is only
called a regression when it is larger than both the tolerance and the noise (for the loss: the
standard error of the paired per-step difference over the last 25% of steps; for a metric: the
reference's own evaluation-to-evaluation noise or a given one); when the tolerance is exceeded but the
noise could explain it, the verdict is "inconclusive". The first logged loss is the exception: it is
computed before any update, so a difference there is never an improvement (a different objective).
A program that does not fix its seed differs from itself between runs: with a second run of the original
(`measure_spread`), the migrated run is held against the center of the original's runs and their spread,
and only a difference far beyond it (`spread_z`) is the migration's. Fewer points than `min_steps` give the
L1 numbers with a low confidence; they pass only when the curves agree point by point.

The smoke gates (divergence, "loss is not falling") are relative too: the migrated curve is held against
the reference's curve over the same steps, widened by the reference's own noise (`reference_band`), so a
spike the original has as well is not a failure. Only NaN/inf stops a run on its own.

Files: `capture.py` (stdout and log files), `reference_log.py` (a recorded GPU run), `stamps.py` (step time),
`measures.py` (thresholds, result types), `gates.py` (the smoke gates), `compare.py` (L1 comparisons),
`spread.py` (the original's run-to-run spread: does it fix its seed?),
`claims.py` (stated claims).
"""

from .capture import (
    DEFAULT_LOSS_PATTERN,
    DEFAULT_METRIC_PATTERN,
    LOSS_FORMATS,
    LOWER_IS_BETTER,
    METRIC_WORDS,
    MIN_NOISE_EVALS,
    NOT_METRIC_KEYS,
    NOT_METRICS,
    NUMBER,
    STEP_PATTERN,
    RunCurves,
    Series,
    add_record,
    add_summary,
    classify_key,
    csv_value,
    higher_is_better,
    is_number,
    loss_lines,
    parse_log_file,
    parse_number,
    parse_text,
)
from .claims import CLAIM_RE, Claim, find_metric, parse_claim, primary_metric
from .compare import MOST_RUNS, WHAT_WOULD_DECIDE, compare_loss, compare_metric
from .gates import BAND_WINDOW, Band, Stop, band_at, divergence_gate, falling_gate, reference_band, stays_outside_from
from .measures import LossComparison, MetricComparison, Thresholds, align, first_bad_value, spearman, step_noise
from .reference_log import DEVICE_KEYS, PRICE_KEYS, STEP_TIME_KEYS, ReferenceLog, read_reference_log
from .spread import SAME_FIRST_LOSS, AgainstRuns, Spread, against_runs, measure_spread
from .stamps import STAMP_SITECUSTOMIZE, STAMP_START, Timing, parse_stamps

__all__ = [
    "AgainstRuns",
    "BAND_WINDOW",
    "Band",
    "CLAIM_RE",
    "Claim",
    "DEFAULT_LOSS_PATTERN",
    "DEFAULT_METRIC_PATTERN",
    "DEVICE_KEYS",
    "LOSS_FORMATS",
    "MOST_RUNS",
    "LOWER_IS_BETTER",
    "LossComparison",
    "METRIC_WORDS",
    "MIN_NOISE_EVALS",
    "MetricComparison",
    "NOT_METRICS",
    "NOT_METRIC_KEYS",
    "NUMBER",
    "PRICE_KEYS",
    "ReferenceLog",
    "RunCurves",
    "SAME_FIRST_LOSS",
    "STAMP_SITECUSTOMIZE",
    "STAMP_START",
    "STEP_PATTERN",
    "STEP_TIME_KEYS",
    "Series",
    "Spread",
    "Stop",
    "Thresholds",
    "Timing",
    "WHAT_WOULD_DECIDE",
    "add_record",
    "against_runs",
    "add_summary",
    "classify_key",
    "align",
    "band_at",
    "compare_loss",
    "compare_metric",
    "csv_value",
    "divergence_gate",
    "falling_gate",
    "find_metric",
    "first_bad_value",
    "higher_is_better",
    "is_number",
    "loss_lines",
    "measure_spread",
    "parse_claim",
    "parse_log_file",
    "parse_number",
    "parse_stamps",
    "parse_text",
    "primary_metric",
    "read_reference_log",
    "reference_band",
    "spearman",
    "stays_outside_from",
    "step_noise",
]
