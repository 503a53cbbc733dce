"""A recorded reference run (verify --reference-log): loss, metrics, step times, device and price of a GPU run."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .capture import RunCurves, csv_value, is_number, parse_log_file

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
        return [{k: csv_value(v) for k, v in row.items() if k} for row in csv.DictReader(io.StringIO(text))]
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
    price = next((float(r[k]) for r in records for k in PRICE_KEYS if is_number(r.get(k))), None)
    per_step: list[float] = []
    for record in records:
        for key in STEP_TIME_KEYS:
            value = record.get(key)
            if isinstance(value, list):
                per_step += [float(v) for v in value if is_number(v)]
            elif is_number(value):  # per record, or one number for the whole run
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
