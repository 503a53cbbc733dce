"""The helpers the generated tests call: each side in its own worker child, compared with dtype-aware
tolerances."""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xlaport.eval.sandbox import read_child_file, run_sandboxed
from xlaport.eval.tied_weights import describe

from .inputs import copy_tree
from .worker.values import MARK  # the key of an input spec, both sides of the job file

DEFAULT_SEED = 0
SIDE_TIMEOUT_S = 300.0

# (rtol, atol) per dtype; a comparison uses the looser entry of the two sides' float dtypes
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-8),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (3e-2, 1e-2),
}


@dataclass(frozen=True)
class Side:
    """Where one side's code lives: `module` is imported from a copy of `root` (so nothing it writes lands in
    the tree), with that copy as the working directory, the script's folder first on sys.path and `argv`
    (the recorded command's script and arguments, e.g. ["train.py", "--steps=3"]) in sys.argv."""

    root: Path
    module: str
    argv: tuple[str, ...] = ()


@dataclass
class Inputs:
    """Arguments of the call (and of the module's constructor); tensors as randn()/randint() specs."""

    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    init_args: list = field(default_factory=list)
    init_kwargs: dict = field(default_factory=dict)
    recorded: str | None = None

    def to_spec(self) -> dict:
        return asdict(self)


def randn(*shape: int, dtype: str = "float32") -> dict:
    """A standard-normal float tensor of `shape`, drawn from the test's seed (the same on both sides)."""
    return {MARK: "randn", "shape": list(shape), "dtype": dtype}


def randint(low: int, high: int, shape: tuple[int, ...]) -> dict:
    """An int64 tensor with values in [low, high), drawn from the test's seed."""
    return {MARK: "randint", "low": low, "high": high, "shape": list(shape)}


def device() -> dict:
    """The side's device: "cuda" (the CPU, through the shim) for the original, torch_xla.device() for the migrated."""
    return {MARK: "device"}


def recorded(path: Path) -> Inputs:
    """Arguments saved from a real run (`xlaport testgen --record`)."""
    return Inputs(recorded=str(path))


@dataclass
class DifferentialResult:
    target: str
    original: dict  # {"outputs", "grads", "error"}
    migrated: dict

    def mismatches(
        self, tolerances: dict[str, tuple[float, float]] | None = None, precision: str = "float32"
    ) -> list[str]:
        """One line per value that differs (or side that failed); empty when the sides agree.

        `precision` is the least precise dtype the code computes in: no value gets a tighter tolerance.
        """
        tolerances = tolerances or TOLERANCES
        problems = []
        for side, data in (("ORIGINAL", self.original), ("MIGRATED", self.migrated)):
            if data.get("error"):
                return [f"{side} raised {data['error'].rstrip()}"]  # the original's error comes first
        sharing = self.original.get("sharing", []), self.migrated.get("sharing", [])
        tie_note = ""
        if sharing[0] != sharing[1]:
            tie_note = " — parameter sharing differs (tied weights?)"
            problems.append(
                f"parameter sharing differs (tied weights?): the original shares {describe(sharing[0])}, "
                f"the migrated code {describe(sharing[1])} (kb XLA314: tie them again after the move)"
            )
        for group in ("outputs", "grads"):
            a, b = self.original[group], self.migrated[group]
            note = tie_note if group == "grads" else ""
            for key in list(a) + [k for k in b if k not in a]:
                if key not in b:
                    problems.append(f"{key}: only the original produced it{note}")
                elif key not in a:
                    problems.append(f"{key}: only the migrated code produced it{note}")
                else:
                    problem = compare_values(a[key], b[key], tolerances, precision)
                    if problem:
                        problems.append(f"{key}: {problem}")
        return problems

    def assert_close(
        self, tolerances: dict[str, tuple[float, float]] | None = None, precision: str = "float32"
    ) -> None:
        problems = self.mismatches(tolerances, precision)
        if problems:
            shown = problems[:12] + ([f"... and {len(problems) - 12} more"] if len(problems) > 12 else [])
            raise AssertionError(
                f"`{self.target}`: the migrated code differs from the original in {len(problems)} value(s):\n  "
                + "\n  ".join(shown)
            )


def _tolerance(dtypes: list, tolerances: dict[str, tuple[float, float]]) -> tuple[float, float]:
    names = [str(d).removeprefix("torch.") for d in dtypes]
    candidates = [tolerances[n] for n in names if n in tolerances] or [tolerances.get("float32", (1e-4, 1e-5))]
    return max(c[0] for c in candidates), max(c[1] for c in candidates)


def compare_values(
    a: Any, b: Any, tolerances: dict[str, tuple[float, float]], precision: str = "float32"
) -> str | None:
    """None when `a` (original) and `b` (migrated) agree, else what differs."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return f"shape {tuple(a.shape)} (original) vs {tuple(b.shape)} (migrated)"
        floats = [t.dtype for t in (a, b) if t.is_floating_point() or t.is_complex()]
        if not floats:
            if a.dtype == torch.bool or b.dtype == torch.bool:
                if a.dtype != b.dtype:
                    return f"dtype {a.dtype} (original) vs {b.dtype} (migrated)"
            bad = a.to(torch.int64) != b.to(torch.int64)
            if bad.any():
                index = tuple(int(i) for i in bad.nonzero()[0])
                return (
                    f"{int(bad.sum())} of {a.numel()} integer values differ; first at {index}: "
                    f"{a[index].item()} (original) vs {b[index].item()} (migrated)"
                )
            return None
        rtol, atol = _tolerance([*floats, precision], tolerances)
        x, y = a.to(torch.float64), b.to(torch.float64)
        # A value far below the tensor's largest is often the difference of large terms (a gradient summed over
        # a batch): its rounding follows the terms, not itself. So each value is held to rtol of at least a
        # tenth of the tensor's largest finite magnitude; a wrong value is off by about its own size and fails.
        finite = x[x.isfinite()].abs()
        floor = float(finite.max()) / 10 if finite.numel() else 0.0
        allowed = atol + rtol * x.abs().clamp(min=floor)
        diff = (x - y).abs()
        same = (x == y) | (x.isnan() & y.isnan())  # equal infinities, NaN in the same places
        close = same | (diff <= allowed)
        if bool(close.all()):
            return None
        excess = torch.where(close, torch.zeros_like(diff), (diff / allowed).nan_to_num(float("inf")))
        flat = int(excess.argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), x.shape)) if x.dim() else ()
        dtype_note = f" {a.dtype}" if a.dtype == b.dtype else f" {a.dtype} (original) vs {b.dtype} (migrated)"
        return (
            f"{int((~close).sum())} of {x.numel()} values outside rtol={rtol:g}, atol={atol:g}{dtype_note}; "
            f"worst at {index}: {x[index].item():.6g} (original) vs {y[index].item():.6g} (migrated), "
            f"abs diff {float(diff[index]):.4g}"
        )
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return f"{type(a).__name__} (original) vs {type(b).__name__} (migrated)"
    if isinstance(a, float) or isinstance(b, float):
        rtol, atol = _tolerance([precision], tolerances)
        if (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and (abs(a - b) <= atol + rtol * abs(a) or (a != a and b != b))
        ):
            return None
        return f"{a!r} (original) vs {b!r} (migrated)"
    return None if a == b else f"{a!r} (original) vs {b!r} (migrated)"


@dataclass
class Case:
    """One differential test: which target, what kind ("function" or "module") and its inputs."""

    target: str
    kind: str
    inputs: Inputs


def run_cases(
    original: Side, migrated: Side, cases: dict[str, Case], seed: int = DEFAULT_SEED, timeout_s: float = SIDE_TIMEOUT_S
) -> dict[str, DifferentialResult]:
    """Runs every case on both sides: one sandboxed child process per side (ORIGINAL first, since the
    migrated modules load its weights). `timeout_s` is per case."""
    import torch

    with tempfile.TemporaryDirectory(prefix="xlaport-testgen-") as tmp:
        jobs = [
            {
                "name": name,
                "target": case.target,
                "kind": case.kind,
                "inputs": case.inputs.to_spec(),
                "weights": str(Path(tmp) / f"weights_{i}.pt"),
            }
            for i, (name, case) in enumerate(cases.items())
        ]
        results = {}
        for name, side in (("original", original), ("migrated", migrated)):
            copy = copy_tree(Path(side.root).resolve(), Path(tmp) / f"{name}_tree")
            job = {
                "side": name,
                "root": str(copy),
                "argv": list(side.argv),
                "module": side.module,
                "seed": seed,
                "cases": jobs,
                "result": str(Path(tmp) / f"{name}.pt"),
            }
            job_path = Path(tmp) / f"{name}.json"
            job_path.write_text(json.dumps(job))
            env = (
                {"USE_TORCH_XLA": "0"} if name == "original" else {"PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
            )
            env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ in the user's trees
            run = run_sandboxed(
                [sys.executable, "-m", "xlaport.eval.testgen.worker", "run", str(job_path)],
                timeout_s=timeout_s * max(1, len(jobs)),
                env=env,
                writable=[Path(tmp)],
                readable=[Path(original.root).resolve().parent, Path(migrated.root).resolve().parent],
                reveal=True,  # trees xlaport itself read to write the tests
            )
            if (saved := read_child_file(Path(job["result"]), limit_bytes=None)) is not None:
                results[name] = torch.load(io.BytesIO(saved), weights_only=True)
            else:
                error = f"the {name} child process failed: {run.describe_failure()}"
                results[name] = {n: {"outputs": {}, "grads": {}, "error": error} for n in cases}
    return {n: DifferentialResult(cases[n].target, results["original"][n], results["migrated"][n]) for n in cases}


def run_differential(
    original: Side,
    migrated: Side,
    target: str,
    kind: str,
    inputs: Inputs,
    seed: int = DEFAULT_SEED,
    timeout_s: float = SIDE_TIMEOUT_S,
) -> DifferentialResult:
    """Runs one target on both sides (see `run_cases`)."""
    return run_cases(original, migrated, {target: Case(target, kind, inputs)}, seed, timeout_s)[target]
