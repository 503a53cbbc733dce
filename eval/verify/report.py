"""`VerifyReport`: what verify found, as data (its JSON stays strict: NaN/inf become strings)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from xlaport.cliutil import EXIT_FAILED, EXIT_OK

from . import curves as cv
from .runs import RunRecord

EXIT_INCONCLUSIVE = 3  # beside cliutil's EXIT_OK (pass), EXIT_FAILED (fail) and EXIT_USAGE


@dataclass
class VerifyReport:
    original: str
    migrated: str
    command: list[str]
    level: str  # the highest level the evidence supports: none, L0, L2, L3 or L4
    required: str
    status: str  # "pass", "fail" or "inconclusive"
    reasons: list[str]  # every reason, tagged with the level it concerns
    improvements: list[str] = field(default_factory=list)  # better than the reference: reported, never failed
    stopped: str | None = None  # why verify stopped early (fail-fast), if it did
    stops: list[dict] = field(default_factory=list)  # every smoke gate (cv.Stop), whether it stopped or not
    loss: cv.LossComparison | None = None
    metrics: list[cv.MetricComparison] = field(default_factory=list)
    claim: dict | None = None
    performance: dict = field(default_factory=dict)
    reference_run: RunRecord | None = None  # the reference the verdict uses (a GPU log when given)
    fallback_run: RunRecord | None = None  # the run of the original here, when a GPU log is the reference
    repeat_runs: list[RunRecord] = field(default_factory=list)  # further runs of the original: its spread
    spread: cv.Spread | None = None  # the original's run-to-run noise (does it fix its seed?)
    capture: dict = field(default_factory=dict)  # per run: loss points found, formats tried when none
    references: list[dict] = field(default_factory=list)  # every reference, what it says and whether it decides
    migrated_run: RunRecord | None = None
    check: dict | None = None
    config: dict = field(default_factory=dict)
    config_file: str | None = None
    wall_s: float = 0.0

    @property
    def exit_code(self) -> int:
        return {"pass": EXIT_OK, "inconclusive": EXIT_INCONCLUSIVE}.get(self.status, EXIT_FAILED)

    def to_dict(self) -> dict:
        return {
            "original": self.original,
            "migrated": self.migrated,
            "command": self.command,
            "level": self.level,
            "required": self.required,
            "status": self.status,
            "exit_code": self.exit_code,
            "reasons": self.reasons,
            "improvements": self.improvements,
            "stopped": self.stopped,
            "stops": self.stops,
            "loss": self.loss.to_dict() if self.loss else None,
            "metrics": [m.to_dict() for m in self.metrics],
            "claim": self.claim,
            "performance": self.performance,
            "reference_run": self.reference_run.to_dict() if self.reference_run else None,
            "fallback_run": self.fallback_run.to_dict() if self.fallback_run else None,
            "references": self.references,
            "repeat_runs": [run.to_dict() for run in self.repeat_runs],
            "spread": self.spread.to_dict() if self.spread else None,
            "capture": self.capture,
            "migrated_run": self.migrated_run.to_dict() if self.migrated_run else None,
            "check": self.check,
            "config": self.config,
            "config_file": self.config_file,
            "wall_s": round(self.wall_s, 3),
        }

    def to_json(self) -> str:
        return json.dumps(_finite(self.to_dict()), indent=2)


def _finite(value: Any) -> Any:
    """NaN/inf become strings so that the JSON stays strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
