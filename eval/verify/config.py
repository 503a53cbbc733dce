"""Verify's settings: `[tool.xlaport.verify]` in pyproject.toml or xlaport.toml, and the levels they name."""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import ConfigDict, TypeAdapter, ValidationError

from . import curves as cv

LEVELS = ("none", "L0", "L2", "L3", "L4")


class VerifyUsageError(ValueError):
    """Bad arguments or configuration: the command cannot start."""


@dataclass
class VerifyConfig:
    """Settings from `[tool.xlaport.verify]` (pyproject.toml) or `xlaport.toml`, overridable on the command line."""

    require: str = "L3"  # the level the migration must reach
    claim: str | None = None  # e.g. "accuracy>=0.95": the project's stated goal
    metric: str | None = None  # the evaluation metric that stands for the goal (default: the first one seen)
    metric_directions: dict[str, str] = field(default_factory=dict)  # name -> "higher" | "lower"
    log_file: str | None = None  # JSON/JSONL/CSV the script writes, relative to its working directory
    loss_pattern: str | None = None  # regex with a `value` group
    metric_pattern: str | None = None  # regex with `value` and optionally `name` groups
    loss_tolerance: float = 0.05
    initial_loss_tolerance: float = 0.03
    metric_tolerance: float = 0.01
    metric_noise: float | None = None  # known evaluation noise (e.g. binomial standard error)
    noise_z: float = 2.0
    # without a fixed seed: a difference is the migration's only beyond this many of the original's run-to-run
    # deviations (measured from two runs); between noise_z and spread_z it is inconclusive
    spread_z: float = 5.0
    # a second run of the original measures its run-to-run spread (does it fix its seed?): the whole run when it
    # takes less than this many seconds, the steps it logs in that time otherwise; 0 = never
    repeat_reference_s: float = 120.0
    min_steps: int = 20
    explode_factor: float = 3.0
    warmup_steps: int = 2
    full_run_steps: int | None = None  # steps of the real run, to project its time from the smoke test
    budget_hours: float | None = None  # stop when the projected full migrated run exceeds this
    price_reference: float | None = None  # $/hour of the reference machine (e.g. 0.85 for an L4 GPU)
    price_migrated: float | None = None  # $/hour of the target (e.g. 1.20 for a TPU v5e-1)
    reference: str = "auto"  # "auto" (CUDA if present, else CPU), "cuda", "cpu", or "none" (only a reference log)
    reference_log: str | None = None  # JSON/JSONL/CSV of a GPU run of the original (cv.read_reference_log)
    # further recorded runs of the original (other seeds, or the same command again): their spread is its noise
    reference_log_repeats: list[str] = field(default_factory=list)
    reference_cache: str | None = None  # folder where reference runs are kept and reused
    timeout_s: float = 600.0  # per run
    memory_mb: int = 8192  # per run
    env: dict[str, str] = field(default_factory=dict)  # extra environment for both runs
    # appended to the migrated run's arguments only: `--device xla` where the device comes from the command line
    # (kb XLA233; argparse keeps the last value, so it overrides a `--device cuda` of the shared command)
    migrated_args: list[str] = field(default_factory=list)

    def thresholds(self) -> cv.Thresholds:
        return cv.Thresholds(
            loss_tolerance=self.loss_tolerance,
            initial_loss_tolerance=self.initial_loss_tolerance,
            metric_tolerance=self.metric_tolerance,
            noise_z=self.noise_z,
            spread_z=self.spread_z,
            min_steps=self.min_steps,
            explode_factor=self.explode_factor,
        )

    def validate(self) -> VerifyConfig:
        if self.require not in LEVELS[1:]:
            raise VerifyUsageError(f"require must be one of L0, L2, L3, L4, not {self.require!r}")
        if self.reference not in ("auto", "cuda", "cpu", "none"):
            raise VerifyUsageError(f"reference must be auto, cuda, cpu or none, not {self.reference!r}")
        if self.reference == "none" and not self.reference_log:
            raise VerifyUsageError("reference = none needs a reference_log (a recorded run of the original)")
        if self.claim:
            try:
                cv.parse_claim(self.claim)
            except ValueError as exc:
                raise VerifyUsageError(str(exc)) from None
        for name, direction in self.metric_directions.items():
            if direction not in ("higher", "lower"):
                raise VerifyUsageError(f"metric_directions.{name} must be 'higher' or 'lower', not {direction!r}")
        if self.spread_z < self.noise_z or self.repeat_reference_s < 0:
            raise VerifyUsageError("spread_z must be >= noise_z and repeat_reference_s >= 0")
        if self.reference_log_repeats and not self.reference_log:
            raise VerifyUsageError("reference_log_repeats needs a reference_log (the recorded run that decides)")
        if self.min_steps < 2 or self.warmup_steps < 0:
            raise VerifyUsageError("min_steps must be >= 2 and warmup_steps >= 0")
        if (self.budget_hours is None) != (self.full_run_steps is None) and self.budget_hours is not None:
            raise VerifyUsageError("budget_hours needs full_run_steps (the length of the real run) to project its time")
        return self

    @classmethod
    def from_mapping(cls, data: dict[str, Any], origin: str = "configuration") -> VerifyConfig:
        """A config from a TOML table; keys may use dashes; unknown keys are an error (typos must not pass silently)."""
        known = {f.name: str(f.type) for f in fields(cls)}
        values = {}
        for key, value in data.items():
            name = key.replace("-", "_")
            if name not in known:
                raise VerifyUsageError(f"{origin}: unknown key {key!r} (known: {', '.join(sorted(known))})")
            try:
                values[name] = _field_adapter(name).validate_python(value)
            except ValidationError:
                raise VerifyUsageError(f"{origin}: {key} must be {known[name]}, not {value!r}") from None
        return cls(**values).validate()

    def with_overrides(self, **overrides: Any) -> VerifyConfig:
        """A copy with every override that is not None applied."""
        data = asdict(self)
        for key, value in overrides.items():
            if value is None:
                continue
            if key not in data:
                raise VerifyUsageError(f"unknown setting {key!r}")
            data[key] = value
        return VerifyConfig(**data).validate()


@cache
def _field_adapter(name: str) -> TypeAdapter:
    """Validates a TOML value against the field's declared type, strictly: `true` is no number, `"10"` no int, a
    string no list; an int is a float."""
    return TypeAdapter(get_type_hints(VerifyConfig)[name], config=ConfigDict(strict=True))


def load_config(*project_dirs: Path) -> tuple[VerifyConfig, str | None]:
    """The first `[tool.xlaport.verify]` found in xlaport.toml (also `[verify]`) or pyproject.toml of the given
    folders, in order; (defaults, None) when there is none. The second value names the file used."""
    for folder in project_dirs:
        for name in ("xlaport.toml", "pyproject.toml"):
            path = Path(folder) / name
            if not path.is_file():
                continue
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise VerifyUsageError(f"{path}: not valid TOML ({exc})") from None
            table = data.get("tool", {}).get("xlaport", {}).get("verify")
            if table is None and name == "xlaport.toml":
                table = data.get("verify")
            if table is not None:
                return VerifyConfig.from_mapping(table, origin=str(path)), str(path)
    return VerifyConfig(), None


def level_at_least(level: str, required: str) -> bool:
    return LEVELS.index(level) >= LEVELS.index(required)
