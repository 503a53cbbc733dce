"""`xlaport verify`: the study's L0–L4 assessment of a migration, from a reference run and a migrated run.

    verify(original_dir, migrated_dir, ["python", "train.py", "--steps", "40"], config) -> VerifyReport

1. The migrated command runs on the XLA device under the execution check (eval/check/), which gives
   L0 (it ran) and L2 (no CPU fallback, no recompilation after warm-up, no per-step host syncs, no NaN,
   no stale optimizer parameters) plus per-step XLA metrics.
2. Fail fast: verify stops before spending a reference run when the migrated smoke test produced
   NaN/inf or its projected full run exceeds the time budget. Divergence and "loss is not falling"
   are judged only against the reference run's curve over the same steps and its noise band (a
   spike the original has too is no failure). Every gate is recorded in the report, stopped or not.
3. The original command runs unchanged as the reference: on CUDA when this machine has a GPU, else on
   the CPU with CUDA calls mapped to it (eval/cuda_to_cpu.py). Same seed and settings: same command.
4. Both runs' loss and metrics are captured (eval/curves.py) and compared: L1 numbers, then L3 (the goal
   still holds against the reference run and, if given, a stated claim), then L4 (faster and cheaper).

Both runs happen in throw-away copies of the two trees, so nothing the scripts write (checkpoints,
logs) lands in the user's folders. Levels are ordered none < L0 < L2 < L3 < L4; L1 is a measurement,
not a level. The outcome is "pass" when the claimed level reaches `require`, "inconclusive" when the
evidence could not decide (too few steps, differences within the noise, no reference), else "fail".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from xlaport.files import SKIP_DIRS

from . import curves as cv
from .check import run_check
from .sandbox import read_child_file, run_sandboxed

LEVELS = ("none", "L0", "L2", "L3", "L4")
EXIT_PASS, EXIT_FAIL, EXIT_INCONCLUSIVE = 0, 1, 3
CACHE_VERSION = 1
LOG_SUFFIXES = (".json", ".jsonl", ".csv")
HASH_WHOLE_FILE_BYTES = 16 * 1024 * 1024  # bigger files (data) are fingerprinted by size and mtime


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
    min_steps: int = 20
    explode_factor: float = 3.0
    warmup_steps: int = 2
    full_run_steps: int | None = None  # steps of the real run, to project its time from the smoke test
    budget_hours: float | None = None  # stop when the projected full migrated run exceeds this
    price_reference: float | None = None  # $/hour of the reference machine (e.g. 0.85 for an L4 GPU)
    price_migrated: float | None = None  # $/hour of the target (e.g. 1.20 for a TPU v5e-1)
    reference: str = "auto"  # "auto" (CUDA if present, else CPU), "cuda", "cpu", or "none" (only a reference log)
    reference_log: str | None = None  # JSON/JSONL/CSV of a GPU run of the original (cv.read_reference_log)
    reference_cache: str | None = None  # folder where reference runs are kept and reused
    timeout_s: float = 600.0  # per run
    memory_mb: int = 8192  # per run
    env: dict[str, str] = field(default_factory=dict)  # extra environment for both runs

    def thresholds(self) -> cv.Thresholds:
        return cv.Thresholds(
            loss_tolerance=self.loss_tolerance,
            initial_loss_tolerance=self.initial_loss_tolerance,
            metric_tolerance=self.metric_tolerance,
            noise_z=self.noise_z,
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
            if not _has_type(value, known[name]):
                raise VerifyUsageError(f"{origin}: {key} must be {known[name]}, not {value!r}")
            values[name] = value
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


def _has_type(value: Any, annotation: str) -> bool:
    """Whether a TOML value fits a field's annotation (a string under `from __future__ import annotations`)."""
    if value is None:
        return "None" in annotation
    if isinstance(value, bool):
        return False  # no setting is a boolean; `true` for a number is a mistake
    checks = {"float": (int, float), "int": (int,), "str": (str,), "dict": (dict,)}
    return any(kind in annotation and isinstance(value, types) for kind, types in checks.items())


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


# --- one run ------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One execution of the command: where and how it ran, and what it reported."""

    role: str  # "reference" or "migrated"
    device: str
    argv: list[str]
    returncode: int | None
    wall_s: float
    error: str | None
    curves: cv.RunCurves
    timing: cv.Timing
    stdout_tail: str = ""
    cached: bool = False
    log: str | None = None  # the recorded log this run comes from (verify --reference-log), None for a run here
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.error is None

    @property
    def steps_run(self) -> int:
        return (max(self.curves.loss.steps) + 1) if len(self.curves.loss) else 0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["curves"] = self.curves.to_dict()
        return data


def split_command(command: list[str]) -> tuple[str, list[str]]:
    """`python train.py --steps 40` (or `train.py --steps 40`) → ("train.py", ["--steps", "40"])."""
    if not command:
        raise VerifyUsageError("no command: give it after `--`, e.g. `-- python train.py --steps 40`")
    rest = command[1:] if Path(command[0]).name.startswith("python") else command
    if not rest or not rest[0].endswith(".py"):
        raise VerifyUsageError(
            f"cannot run {' '.join(command)!r}: verify runs a Python script, `python SCRIPT.py [ARGS]` "
            "(interpreter options and `-m` are not supported)"
        )
    return rest[0], rest[1:]


def copy_tree(src: Path, dst: Path) -> None:
    """A working copy the run may scribble in (VCS folders, caches and virtual environments are left out)."""
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(*SKIP_DIRS, "*.egg-info"))


def _files_of(folder: Path) -> dict[str, float]:
    return {
        str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
    }


def _stamp_env(run_dir: Path, extra: dict[str, str]) -> tuple[dict[str, str], Path]:
    """Environment that makes the child time-stamp its stdout lines (see curves.STAMP_SITECUSTOMIZE)."""
    hook_dir = run_dir / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(cv.STAMP_SITECUSTOMIZE, encoding="utf-8")
    stamps = run_dir / "stamps.txt"
    python_path = os.pathsep.join(
        p for p in (str(hook_dir), extra.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))) if p
    )
    return {**extra, "PYTHONPATH": python_path, "XLAPORT_STAMPS": str(stamps)}, stamps


def _written_logs(work: Path, before: dict[str, float], config: VerifyConfig) -> list[Path]:
    """The log file the config names, else the JSON/JSONL/CSV files the run created or changed."""
    if config.log_file:
        path = work / config.log_file
        return [path] if path.is_file() else []
    after = _files_of(work)
    return [
        work / rel for rel, mtime in sorted(after.items()) if rel.endswith(LOG_SUFFIXES) and before.get(rel) != mtime
    ]


def capture_curves(stdout: str, logs: dict[str, str], config: VerifyConfig) -> tuple[cv.RunCurves, list[str]]:
    """Loss and metrics from the run's log files and its stdout: the source with the most loss points wins the loss,
    metrics are merged (a log file's value wins over stdout's for the same name)."""
    notes = []
    from_stdout = cv.parse_text(stdout, config.loss_pattern, config.metric_pattern)
    best = from_stdout
    files = []
    for name, text in logs.items():
        try:
            parsed = cv.parse_log_file(Path(name), text)
        except ValueError as exc:
            notes.append(f"log file {name} ignored: {exc}")
            continue
        if len(parsed.loss) or parsed.metrics:
            files.append(parsed)
    if config.log_file and not logs:
        notes.append(f"the log file {config.log_file} was not written; curves come from stdout")
    for parsed in files:
        if len(parsed.loss) > len(best.loss):
            best = parsed
    merged = cv.RunCurves(loss=best.loss, source=best.source)
    for source in [from_stdout, *files]:
        for name, series in source.metrics.items():
            if len(series):
                merged.metrics[name] = series
    return merged, notes


def _log_texts(paths: list[Path], work: Path) -> dict[str, str]:
    texts = {}
    for path in paths:
        try:
            texts[str(path.relative_to(work))] = (read_child_file(path) or b"").decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_migrated(migrated: Path, script: str, args: list[str], config: VerifyConfig, scratch: Path):
    """The migrated command under the XLA execution check; (RunRecord, CheckReport)."""
    run_dir = scratch / "migrated"
    work = run_dir / "work"
    copy_tree(migrated, work)
    env, stamps = _stamp_env(run_dir, dict(config.env))
    before = _files_of(work)
    report = run_check(
        work / script,
        args,
        steps_warmup=config.warmup_steps,
        timeout_s=config.timeout_s,
        memory_mb=config.memory_mb,
        env=env,
        workdir=work,
        writable=[run_dir],
    )
    stdout, timing = cv.parse_stamps(_read(stamps), config.loss_pattern, config.warmup_steps)
    steady = [s.wall_s for s in report.per_step[config.warmup_steps :]]
    if steady:  # the check times each XLA step; better than the time between printed lines
        timing.per_step_s = [s.wall_s for s in report.per_step]
        timing.step_s = float(sorted(steady)[len(steady) // 2])
    curves, notes = capture_curves(stdout, _log_texts(_written_logs(work, before, config), work), config)
    record = RunRecord(
        role="migrated",
        device=f"xla ({report.pjrt_device})",
        argv=["python", script, *args],
        returncode=report.exit_code,
        wall_s=report.wall_s,
        error=report.error,
        curves=curves,
        timing=timing,
        stdout_tail=_tail(stdout) or report.stdout_tail,
        notes=notes,
    )
    return record, report


def _read(path: Path) -> str:
    return (read_child_file(path) or b"").decode("utf-8", errors="replace")


def cuda_present() -> bool:
    """Whether this machine really has a CUDA GPU (asked in a child, so torch is not imported here)."""
    probe = run_sandboxed(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        timeout_s=120,
        env={"USE_TORCH_XLA": "0"},
    )
    return probe.ok and probe.stdout.strip().endswith("True")


def reference_mode(config: VerifyConfig) -> str:
    if config.reference != "auto":
        return config.reference
    return "cuda" if cuda_present() else "cpu"


def tree_digest(folder: Path) -> str:
    """Content hash of a source tree (what a cached reference run depends on)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts) or not path.is_file():
            continue
        digest.update(str(rel).encode() + b"\0")
        stat = path.stat()
        if stat.st_size > HASH_WHOLE_FILE_BYTES:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
        else:
            digest.update(path.read_bytes())
    return digest.hexdigest()


def reference_from_log(config: VerifyConfig) -> tuple[RunRecord, float | None]:
    """The recorded GPU run of `config.reference_log` as a reference run, and the price per hour it states;
    VerifyUsageError when it cannot be read."""
    try:
        log = cv.read_reference_log(Path(config.reference_log), config.warmup_steps)
    except ValueError as exc:
        raise VerifyUsageError(str(exc)) from None
    notes = [] if log.step_s is not None else ["the log has no step times: speed and cost (L4) cannot be compared"]
    return RunRecord(
        role="reference",
        device=f"cuda: {log.label}",
        argv=[],
        returncode=0,
        wall_s=sum(log.per_step_s),
        error=None,
        curves=log.curves,
        timing=cv.Timing(step_s=log.step_s, per_step_s=log.per_step_s),
        log=log.path,
        notes=notes,
    ), log.price_per_hour


def run_reference(original: Path, script: str, args: list[str], config: VerifyConfig, scratch: Path) -> RunRecord:
    """The original command, unchanged: on CUDA, or on the CPU with CUDA mapped to it. Reused from the cache when
    the same tree, command and settings already ran."""
    mode = reference_mode(config)
    device = "cuda" if mode == "cuda" else "cpu (CUDA calls mapped to the CPU)"
    key_data = [CACHE_VERSION, tree_digest(original), script, args, mode, sorted(config.env.items()), config.log_file]
    key = hashlib.sha256(json.dumps(key_data).encode()).hexdigest()[:32]
    cache_file = Path(config.reference_cache) / f"reference-{key}.json" if config.reference_cache else None
    if cache_file is not None and cache_file.is_file():
        try:
            saved = json.loads(cache_file.read_text(encoding="utf-8"))
            return _reference_record(saved, script, args, device, config, cached=True)
        except (json.JSONDecodeError, KeyError, OSError):
            pass  # a damaged cache entry is simply run again
    run_dir = scratch / "reference"
    work = run_dir / "work"
    copy_tree(original, work)
    env, stamps = _stamp_env(run_dir, dict(config.env))
    if mode == "cpu":
        argv = [sys.executable, "-m", "xlaport.eval.cuda_to_cpu", str(work / script), *args]
        env.setdefault("USE_TORCH_XLA", "0")
    else:
        argv = [sys.executable, str(work / script), *args]
    before = _files_of(work)
    result = run_sandboxed(
        argv, cwd=work, timeout_s=config.timeout_s, memory_mb=config.memory_mb, env=env, writable=[run_dir]
    )
    saved = {
        "returncode": None if result.timed_out or result.memory_exceeded else result.returncode,
        "error": result.describe_failure(),
        "wall_s": result.wall_s,
        "stamps": _read(stamps) or "\n".join(f"0\t{line}" for line in result.stdout.splitlines()),
        "logs": _log_texts(_written_logs(work, before, config), work),
    }
    if cache_file is not None and saved["returncode"] == 0:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps(saved), encoding="utf-8")
    return _reference_record(saved, script, args, device, config, cached=False)


def _reference_record(saved: dict, script: str, args: list[str], device: str, config: VerifyConfig, cached: bool):
    stdout, timing = cv.parse_stamps(saved["stamps"], config.loss_pattern, config.warmup_steps)
    curves, notes = capture_curves(stdout, saved["logs"], config)
    if timing.step_s is not None and timing.step_s < 1e-4:
        timing.step_s = None  # all loss lines were printed at once: the stamps say nothing about step time
        notes.append("the loss lines were printed all at once; the reference's step time is unknown")
    return RunRecord(
        role="reference",
        device=device,
        argv=["python", script, *args],
        returncode=saved["returncode"],
        wall_s=saved["wall_s"],
        error=saved["error"],
        curves=curves,
        timing=timing,
        stdout_tail=_tail(stdout),
        cached=cached,
        notes=notes,
    )


# --- the report ---------------------------------------------------------------------------------


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
    references: list[dict] = field(default_factory=list)  # every reference, what it says and whether it decides
    migrated_run: RunRecord | None = None
    check: dict | None = None
    config: dict = field(default_factory=dict)
    config_file: str | None = None
    wall_s: float = 0.0

    @property
    def exit_code(self) -> int:
        return {"pass": EXIT_PASS, "inconclusive": EXIT_INCONCLUSIVE}.get(self.status, EXIT_FAIL)

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


def level_at_least(level: str, required: str) -> bool:
    return LEVELS.index(level) >= LEVELS.index(required)


def _status(level: str, required: str, undecided: bool) -> str:
    if level_at_least(level, required):
        return "pass"
    return "inconclusive" if undecided else "fail"


# --- the assessment -----------------------------------------------------------------------------


def projected_seconds(run: RunRecord, full_steps: int) -> float | None:
    """Fixed cost of the smoke test (start-up, compilation) plus the full run's steps at the steady step time."""
    if run.timing.step_s is None or not run.steps_run:
        return None
    overhead = max(run.wall_s - run.steps_run * run.timing.step_s, 0.0)
    return overhead + full_steps * run.timing.step_s


def absolute_gates(mig: RunRecord, check, config: VerifyConfig) -> list[cv.Stop]:
    """The gates that need no reference: NaN/inf (the only stop on the loss alone) and the user's time budget
    (a cost ceiling on the migrated run, not a judgment of its numbers). Both come before the reference run."""
    bad = cv.first_bad_value(mig.curves.loss)
    if bad is not None:
        gates = [cv.Stop("nan", True, f"the migrated smoke test diverged: loss {bad[1]} at step {bad[0]}", step=bad[0])]
    elif check.nan:
        gates = [cv.Stop("nan", True, "the migrated smoke test produced NaN/Inf: " + "; ".join(check.nan_details[:3]))]
    else:
        gates = [cv.Stop("nan", False, "no NaN/inf in the migrated loss or parameters")]
    if config.budget_hours is not None and config.full_run_steps:
        projected = projected_seconds(mig, config.full_run_steps)
        if projected is None:
            gates.append(cv.Stop("budget", False, "the migrated step time is unknown: the budget is not judged"))
        else:
            over = projected > config.budget_hours * 3600
            gates.append(
                cv.Stop(
                    "budget",
                    over,
                    f"the projected full run takes {projected / 3600:.2f} h, "
                    f"{'over' if over else 'within'} the budget of {config.budget_hours:g} h "
                    f"({config.full_run_steps} steps at {mig.timing.step_s:.3g} s/step after warm-up, plus "
                    f"{projected - config.full_run_steps * mig.timing.step_s:.0f} s of start-up and compilation)",
                    against=f"budget_hours = {config.budget_hours:g}",
                )
            )
    return gates


def relative_gates(ref: RunRecord | None, mig: RunRecord, config: VerifyConfig) -> list[cv.Stop]:
    """Divergence and "loss is not falling", judged against the reference's curve over the same steps and its noise."""
    if ref is None or not ref.ok or not len(ref.curves.loss) or not len(mig.curves.loss):
        return [
            cv.Stop(
                "divergence",
                False,
                "no reference loss curve to hold the migrated one against: divergence and 'not falling' are not "
                "judged (only NaN/inf stops a run on its own)",
            )
        ]
    limits = config.thresholds()
    gates = [cv.divergence_gate(ref.curves.loss, mig.curves.loss, limits)]
    gates.append(cv.falling_gate(ref.curves.loss, mig.curves.loss, limits))
    for gate in gates:
        gate.against = f"{ref.role} on {ref.device}: {gate.against}"
    return gates


def judge_claim(claim: cv.Claim, ref: RunRecord | None, mig: RunRecord, metric_verdicts: dict[str, str]) -> dict:
    """Whether the stated claim holds on the migrated run; a claim the original misses too is inherited, not a
    migration failure, as long as the migrated run matches the reference (the study's ‡ rule)."""

    def observed(run: RunRecord | None) -> float | None:
        if run is None:
            return None
        series = cv.find_metric(run.curves, claim.name)
        if series is None:
            return None
        if series is run.curves.loss:  # a loss claim is judged on the last-25% mean, not one noisy step
            tail = max(1, math.ceil(len(series) * 0.25))
            return sum(series.values[-tail:]) / tail
        return series.final

    mig_value, ref_value = observed(mig), observed(ref)
    result = {"claim": str(claim), "migrated": mig_value, "reference": ref_value, "holds": None, "inherited": False}
    if mig_value is None:
        result["verdict"] = "inconclusive"
        result["reason"] = f"the migrated run reported no `{claim.name}`, so the claim {claim} cannot be checked"
        return result
    result["holds"] = claim.holds(mig_value)
    if result["holds"]:
        result["verdict"] = "pass"
        result["reason"] = f"claim {claim} holds: migrated {claim.name} = {mig_value:.4g}"
        return result
    ref_misses = ref_value is not None and not claim.holds(ref_value)
    name = cv.find_metric(mig.curves, claim.name)
    matches = metric_verdicts.get(name.name if name is not None else claim.name) in ("same", "better")
    if ref_misses and matches:
        result.update(verdict="pass", inherited=True)
        result["reason"] = (
            f"claim {claim} is missed by the original code too (reference {ref_value:.4g}, migrated {mig_value:.4g}); "
            "the migration preserves the original's behaviour (inherited, not migration-induced)"
        )
        return result
    result["verdict"] = "fail"
    where = f"; the reference reaches {ref_value:.4g}" if ref_value is not None and not ref_misses else ""
    result["reason"] = f"claim {claim} does not hold: migrated {claim.name} = {mig_value:.4g}{where}"
    return result


def assess(
    ref: RunRecord | None, mig: RunRecord, check, config: VerifyConfig
) -> tuple[str, list[str], list[str], bool, cv.LossComparison | None, list[cv.MetricComparison], dict | None, dict]:
    """(level, reasons, improvements, undecided, loss comparison, metric comparisons, claim, performance)."""
    reasons: list[str] = []
    improvements: list[str] = []
    limits = config.thresholds()

    # L0 and L2 come from the execution check of the migrated run.
    if getattr(check, "stopped", None):  # the execution check stopped a run that could never reach L2
        reasons.extend(f"L2: stopped by the execution check: {reason}" for reason in check.reasons)
        return "L0", reasons, improvements, False, None, [], None, {}
    if not mig.ok:
        reasons.append("L0: the migrated run did not finish: " + "; ".join(check.reasons or [mig.error or "?"]))
        return "none", reasons, improvements, False, None, [], None, {}
    level = "L0"
    if check.level == "L2":
        level = "L2"
    else:
        reasons.extend(f"L2: {reason}" for reason in check.reasons)

    # L1 measurements and the L3 judgment against the reference run (and the claim).
    failures: list[str] = []
    undecided: list[str] = []
    loss_cmp = None
    metric_cmps: list[cv.MetricComparison] = []
    if ref is None or not ref.ok:
        why = "no reference run" if ref is None else f"the reference run failed ({(ref.error or '').splitlines()[0]})"
        undecided.append(f"L3: {why}: nothing to compare against")
    else:
        if len(ref.curves.loss) and len(mig.curves.loss):
            loss_cmp = cv.compare_loss(ref.curves.loss, mig.curves.loss, limits)
            if loss_cmp.ref_tail_mean is not None:
                reasons.append(f"L1: {loss_summary(loss_cmp)}")
            tag = {"worse": failures, "diverged": failures, "inconclusive": undecided}.get(loss_cmp.verdict)
            for reason in loss_cmp.reasons:
                if loss_cmp.verdict == "better":
                    improvements.append(f"L1: {reason}")
                elif tag is not None:
                    tag.append(f"L3: training loss: {reason}")
                else:
                    reasons.append(f"L1: {reason}")
        else:
            side = "reference" if not len(ref.curves.loss) else "migrated run"
            reasons.append(f"L1: no training loss found in the {side}'s output (set loss_pattern or log_file)")
        # the reference defines the goal: its metric is the one the migrated run must keep
        preferred = config.metric or (cv.parse_claim(config.claim).name if config.claim else None)
        primary = cv.primary_metric(ref.curves, preferred)
        for name in _metric_names(ref, mig, primary):
            cmp = cv.compare_metric(
                cv.find_metric(ref.curves, name) or cv.Series(name),
                cv.find_metric(mig.curves, name) or cv.Series(name),
                name,
                cv.higher_is_better(name, config.metric_directions),
                limits,
                noise=config.metric_noise,
            )
            metric_cmps.append(cmp)
            is_primary = name == primary
            for reason in cmp.reasons:
                if cmp.verdict == "better":
                    improvements.append(f"L1: {reason}")
                elif is_primary and cmp.verdict == "worse":
                    failures.append(f"L3: evaluation metric: {reason}" + _metric_hint(loss_cmp))
                elif is_primary and cmp.verdict == "missing" and len(cmp_ref(ref, name)):
                    failures.append(f"L3: evaluation metric: {reason}, the reference did: evaluation coverage changed")
                elif is_primary and cmp.verdict in ("inconclusive", "missing"):
                    undecided.append(f"L3: evaluation metric: {reason}")
                else:
                    reasons.append(f"L1: {reason}")
        if primary is None:
            reasons.append("L1: no evaluation metric found; L3 is judged on the training loss alone")
            if loss_cmp is None:
                undecided.append("L3: neither a loss nor a metric was captured from both runs")

    claim_result = None
    if config.claim:
        verdicts = {m.name: m.verdict for m in metric_cmps}
        claim_result = judge_claim(cv.parse_claim(config.claim), ref if ref and ref.ok else None, mig, verdicts)
        bucket = {"fail": failures, "inconclusive": undecided}.get(claim_result["verdict"], reasons)
        bucket.append(f"L3: {claim_result['reason']}")
        if claim_result["verdict"] == "pass" and undecided and all("reference run" in u for u in undecided):
            undecided.clear()  # no reference, but the stated claim decides L3 on its own
            reasons.append("L3: judged on the stated claim alone (no usable reference run)")

    reasons.extend(failures)
    reasons.extend(undecided)
    goal_holds = not failures and not undecided
    if goal_holds and level == "L2":
        level = "L3"
        reasons.append("L3: the goal holds against the reference run" + (" and the claim" if config.claim else ""))
    elif goal_holds:
        reasons.append("L3: the goal holds, but L3 is not claimed because L2 failed")

    performance, l4_reason, l4_undecided = assess_performance(ref, mig, check, config)
    if level == "L3":
        if l4_reason is None:
            level = "L4"
            reasons.append("L4: the migrated run is faster" + (" and cheaper" if performance.get("cost_ratio") else ""))
        else:
            reasons.append(f"L4: {l4_reason}")
    # a failure settles it; only without one can missing evidence make the outcome inconclusive
    l4_open = level == "L3" and l4_undecided and config.require == "L4"
    undecided_overall = not failures and (bool(undecided) or l4_open)
    return level, reasons, improvements, undecided_overall, loss_cmp, metric_cmps, claim_result, performance


def cmp_ref(ref: RunRecord, name: str) -> cv.Series:
    return cv.find_metric(ref.curves, name) or cv.Series(name)


def _metric_names(ref: RunRecord, mig: RunRecord, primary: str | None) -> list[str]:
    """The primary metric first, then every other metric both runs reported."""
    names = [primary] if primary else []
    for name in mig.curves.metrics:
        if name not in names and name in ref.curves.metrics:
            names.append(name)
    return names


def loss_summary(c: cv.LossComparison) -> str:
    """The L1 numbers of the loss in one line (reference vs migrated)."""
    trend = (
        f"; trend (Spearman vs step) {c.ref_trend:+.2f} vs {c.mig_trend:+.2f}"
        if c.ref_trend is not None and c.mig_trend is not None
        else ""
    )
    return (
        f"loss over {c.steps_compared} aligned steps, reference vs migrated: first {c.ref_initial:.4g} vs "
        f"{c.mig_initial:.4g}, final {c.ref_final:.4g} vs {c.mig_final:.4g}, last-25% mean {c.ref_tail_mean:.4g} vs "
        f"{c.mig_tail_mean:.4g} ({c.tail_rel_diff:+.1%}); mean relative curve distance {c.curve_distance:.1%}{trend}"
    )


def _metric_hint(loss_cmp: cv.LossComparison | None) -> str:
    if loss_cmp is not None and loss_cmp.verdict in ("same", "better"):
        return (
            "; the training curves agree, so look at what happens after training: checkpoint save/reload "
            "(which weights are evaluated), evaluation mode, or the evaluation code itself"
        )
    return ""


def assess_performance(
    ref: RunRecord | None, mig: RunRecord, check, config: VerifyConfig
) -> tuple[dict, str | None, bool]:
    """L4 numbers; (numbers, why L4 is not reached or None, whether that is for lack of evidence)."""
    ref_step = ref.timing.step_s if ref is not None else None
    mig_step = mig.timing.step_s
    perf: dict[str, Any] = {
        "reference_device": ref.device if ref is not None else None,
        "migrated_device": mig.device,
        "reference_step_s": ref_step,
        "migrated_step_s": mig_step,
        "speedup": (ref_step / mig_step) if ref_step and mig_step else None,
        "price_reference_per_h": config.price_reference,
        "price_migrated_per_h": config.price_migrated,
        "cost_ratio": None,
        "full_run_steps": config.full_run_steps,
        "reference_full_run_s": None,
        "migrated_full_run_s": None,
    }
    if ref_step and mig_step and config.price_reference and config.price_migrated:
        perf["cost_ratio"] = (mig_step * config.price_migrated) / (ref_step * config.price_reference)
    if config.full_run_steps:
        perf["migrated_full_run_s"] = projected_seconds(mig, config.full_run_steps)
        perf["reference_full_run_s"] = projected_seconds(ref, config.full_run_steps) if ref else None
        for side in ("reference", "migrated"):
            seconds = perf[f"{side}_full_run_s"]
            price = config.price_reference if side == "reference" else config.price_migrated
            perf[f"{side}_full_run_cost"] = seconds / 3600 * price if seconds is not None and price else None
    if ref is None or not (ref.device.startswith("cuda") or ref.log):
        return perf, "not assessable here: the reference did not run on a GPU, so its step time is not the GPU's", True
    if "CPU" in mig.device:
        return perf, "not assessable here: the migrated run used XLA on the CPU, not a TPU", True
    if perf["speedup"] is None:
        return perf, "step times unknown (the runs' steps could not be timed)", True
    if perf["speedup"] <= 1.0:
        return perf, f"not faster: {perf['speedup']:.2f}x the reference's speed", False
    if perf["cost_ratio"] is not None and perf["cost_ratio"] >= 1.0:
        return perf, f"faster ({perf['speedup']:.2f}x) but not cheaper: a run costs {perf['cost_ratio']:.2f}x", False
    return perf, None, False


def verify(original: Path, migrated: Path, command: list[str], config: VerifyConfig | None = None) -> VerifyReport:
    """Runs the migrated and (unless fail-fast stops first) the reference command and grades the migration."""
    started = time.perf_counter()
    config = (config or VerifyConfig()).validate()
    original, migrated = Path(original).resolve(), Path(migrated).resolve()
    for folder in (original, migrated):
        if not folder.is_dir():
            raise VerifyUsageError(f"not a directory: {folder}")
    script, args = split_command(list(command))
    for folder in (original, migrated):
        if not (folder / script).is_file():
            raise VerifyUsageError(f"{script} not found in {folder}")

    report = VerifyReport(
        original=str(original),
        migrated=str(migrated),
        command=list(command),
        level="none",
        required=config.require,
        status="fail",
        reasons=[],
        config=asdict(config),
    )
    log_ref, log_price = reference_from_log(config) if config.reference_log else (None, None)
    if log_price is not None and config.price_reference is None:
        config = config.with_overrides(price_reference=log_price)
        report.config = asdict(config)
    with tempfile.TemporaryDirectory(prefix="xlaport-verify-") as tmp:
        scratch = Path(tmp)
        mig, check = run_migrated(migrated, script, args, config, scratch)
        report.migrated_run, report.check = mig, check.to_dict()
        gates = absolute_gates(mig, check, config) if mig.ok else []
        ran = None
        if mig.ok and not any(g.stopped for g in gates) and config.reference != "none":
            ran = run_reference(original, script, args, config, scratch)
        ref = log_ref or ran  # a recorded GPU run decides; the run here is the fallback
        if mig.ok and not any(g.stopped for g in gates):
            gates += relative_gates(ref, mig, config)
        report.reference_run = ref
    if log_ref is not None and log_ref.steps_run > mig.steps_run > 0:
        log_ref.notes.append(
            f"the log runs to step {log_ref.steps_run - 1}, the migrated run to step {mig.steps_run - 1}: losses are "
            "compared over the common steps, final metrics at the end of each run"
        )

    level, reasons, improvements, undecided, loss_cmp, metric_cmps, claim, perf = assess(ref, mig, check, config)
    if ref is not None:
        report.references.append(reference_summary(ref, level, loss_cmp, metric_cmps, config, decides=True))
    if log_ref is not None and ran is not None:
        fb_level, _, _, _, fb_loss, fb_metrics, *_ = assess(ran, mig, check, config)
        report.fallback_run = ran
        report.references.append(reference_summary(ran, fb_level, fb_loss, fb_metrics, config, decides=False))
        reasons.append(
            f"L1: also held against the run of the original on {ran.device} (fallback reference, not deciding): "
            + _verdicts_line(fb_level, fb_loss, fb_metrics)
        )
    report.stops = [g.to_dict() for g in gates]
    stops = [g for g in gates if g.stopped]
    if stops:
        report.stopped = "; ".join(g.reason for g in stops)
        for gate in stops:
            after = f" (held against {gate.against})" if gate.against else ""
            if ran is None and config.reference != "none":
                after += "; the reference run was not started"
            reasons.append(f"stopped ({gate.gate}): {gate.reason}{after}")
        undecided = False
        if level_at_least(level, "L3"):
            level = "L2"
    for run in (ref, report.fallback_run, mig):
        if run is not None:
            role = "fallback reference" if run is report.fallback_run else run.role
            reasons.extend(f"note ({role}): {note}" for note in run.notes)
    report.level, report.reasons, report.improvements = level, reasons, improvements
    report.loss, report.metrics, report.claim, report.performance = loss_cmp, metric_cmps, claim, perf
    report.status = "fail" if stops else _status(level, config.require, undecided)
    report.wall_s = time.perf_counter() - started
    return report


def reference_summary(
    run: RunRecord,
    level: str,
    loss_cmp: cv.LossComparison | None,
    metric_cmps: list[cv.MetricComparison],
    config: VerifyConfig,
    decides: bool,
) -> dict:
    """What one reference is and what the migration reaches against it (the report's "references" table)."""
    if run.log:
        kind = "recorded GPU run (log)"
    elif run.device.startswith("cuda"):
        kind = "run of the original on CUDA here"
    else:
        kind = "run of the original here, CUDA mapped to the CPU"
    band = cv.reference_band(run.curves.loss, config.noise_z)
    return {
        "kind": kind,
        "device": run.device,
        "source": run.log or " ".join(run.argv),
        "cached": run.cached,
        "decides": decides,
        "ok": run.ok,
        "level": level,
        "loss_points": len(run.curves.loss),
        "loss_verdict": loss_cmp.verdict if loss_cmp else None,
        "metric_verdicts": {m.name: m.verdict for m in metric_cmps},
        "step_s": run.timing.step_s,
        "noise": {"step_noise": band.noise, "z": band.z, "window": band.window},
    }


def _verdicts_line(level: str, loss_cmp: cv.LossComparison | None, metric_cmps: list[cv.MetricComparison]) -> str:
    parts = [f"level {level}", f"loss {loss_cmp.verdict if loss_cmp else 'not compared'}"]
    parts += [f"{m.name} {m.verdict} ({_fmt_num(m.mig_final)} vs {_fmt_num(m.ref_final)})" for m in metric_cmps]
    return ", ".join(parts)


def _fmt_num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def verify_tree(
    original_dir: Path, migrated_dir: Path, command: list[str], config: VerifyConfig | None = None
) -> VerifyReport:
    """For `xlaport migrate --verify`: the settings come from the project's config (migrated tree first, then the
    original), with `config`'s non-default fields on top."""
    found, path = load_config(Path(migrated_dir), Path(original_dir))
    if config is not None:
        defaults = asdict(VerifyConfig())
        found = found.with_overrides(**{k: v for k, v in asdict(config).items() if v != defaults[k]})
    report = verify(original_dir, migrated_dir, command, found)
    report.config_file = path
    return report
