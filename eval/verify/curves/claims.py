"""Stated claims (`accuracy>=0.95`) and finding the metric they name."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .capture import LOWER_IS_BETTER, NUMBER, RunCurves, Series, parse_number

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
    return Claim(match.group("name"), match.group("op"), parse_number(match.group("value")))


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
