"""The two runs: the migrated command under the XLA execution check, and the reference (the original
command here, cached by tree content, or a recorded GPU log); their logs, step times and curves."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xlaport.files import SKIP_DIRS, copier_inside

from ..check import run_check
from ..sandbox import read_child_file, run_sandboxed
from . import curves as cv
from .config import VerifyConfig, VerifyUsageError

CACHE_VERSION = 2  # 2: the reference's stderr is kept too
# the files a run writes that may hold its losses: JSON, JSON lines, CSV, and text logs (a `logging.FileHandler`'s
# train.log, a log.txt written by hand); bigger ones are data or checkpoints, not logs
LOG_SUFFIXES = (".json", ".jsonl", ".csv", ".log", ".txt")
MAX_LOG_BYTES = 8 * 1024 * 1024
HASH_WHOLE_FILE_BYTES = 16 * 1024 * 1024  # bigger files (data) are fingerprinted by size and mtime


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
    read: list[str] = field(default_factory=list)  # the streams and files the curves were looked for in
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
    # each file as opened (never through a link swapped in meanwhile): the copy is handed to the sandbox user
    ignore = shutil.ignore_patterns(*SKIP_DIRS, "*.egg-info")
    shutil.copytree(src, dst, symlinks=True, ignore=ignore, copy_function=copier_inside(src))


def _files_of(folder: Path) -> dict[str, float]:
    return {
        str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
    }


def _stamp_env(run_dir: Path, extra: dict[str, str]) -> tuple[dict[str, str], Path, Path]:
    """Environment that makes the child time-stamp its stdout and stderr lines (see curves.STAMP_SITECUSTOMIZE);
    (environment, stdout stamps, stderr stamps)."""
    hook_dir = run_dir / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(cv.STAMP_SITECUSTOMIZE, encoding="utf-8")
    stamps, stamps_err = run_dir / "stamps.txt", run_dir / "stamps-stderr.txt"
    python_path = os.pathsep.join(
        p for p in (str(hook_dir), extra.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))) if p
    )
    env = {**extra, "PYTHONPATH": python_path, "XLAPORT_STAMPS": str(stamps), "XLAPORT_STAMPS_ERR": str(stamps_err)}
    return env, stamps, stamps_err


def working_folder(original: Path, migrated: Path, cwd: Path | None = None) -> str:
    """Where in the trees the command runs, as a folder relative to their roots (the same in both): the caller's
    folder when it stands inside one of the trees (`verify` typed in proj/trainer/ runs `python train.py` in
    trainer/, as python would there), else the root. The whole tree is copied either way, so `../model` works."""
    here = Path(cwd or Path.cwd()).resolve()
    for tree in (Path(migrated).resolve(), Path(original).resolve()):
        if here.is_relative_to(tree):
            return "" if here == tree else str(here.relative_to(tree))
    return ""


def _written_logs(work: Path, before: dict[str, float], config: VerifyConfig, cwd: Path | None = None) -> list[Path]:
    """The log file the config names (relative to the run's working folder `cwd`), else the JSON/JSONL/CSV and
    .log/.txt files (up to MAX_LOG_BYTES) the run created or changed anywhere in its tree."""
    if config.log_file:
        path = (cwd or work) / config.log_file
        return [path] if path.is_file() else []
    after = _files_of(work)
    return [
        work / rel
        for rel, mtime in sorted(after.items())
        if rel.endswith(LOG_SUFFIXES) and before.get(rel) != mtime and (work / rel).stat().st_size <= MAX_LOG_BYTES
    ]


def capture_curves(
    streams: dict[str, tuple[str, cv.Timing]], logs: dict[str, str], config: VerifyConfig
) -> tuple[cv.RunCurves, cv.Timing, list[str], list[str]]:
    """Loss and metrics from the run's output streams (`streams`: "stdout"/"stderr" -> (text, timing from its
    stamps)) and its log files: the source with the most loss points wins the loss (the first on a tie: stdout,
    stderr, then the files), and the timing is that stream's (stdout's when a file wins); metrics are merged, a
    later source's value winning for the same name (stderr, stdout, files). (curves, timing, notes, read)."""
    notes, read = [], []
    parsed_streams = []
    for name, (text, _) in streams.items():
        read.append(f"{name} ({len(text.splitlines())} lines)")
        parsed = cv.parse_text(text, config.loss_pattern, config.metric_pattern)
        parsed.source = name
        parsed_streams.append(parsed)
    files = []
    for name, text in logs.items():
        read.append(name)
        try:
            parsed = cv.parse_log_file(Path(name), text, config.loss_pattern, config.metric_pattern)
        except ValueError as exc:
            notes.append(f"log file {name} ignored: {exc}")
            continue
        if len(parsed.loss) or parsed.metrics:
            files.append(parsed)
    if config.log_file and not logs:
        notes.append(f"the log file {config.log_file} was not written; curves come from the output")
    if not logs:
        read.append(f"no {'/'.join(LOG_SUFFIXES)} file written by the run" if not config.log_file else "no log_file")
    best = parsed_streams[0]
    for parsed in [*parsed_streams[1:], *files]:
        if len(parsed.loss) > len(best.loss):
            best = parsed
    timing = streams[best.source][1] if best.source in streams else next(iter(streams.values()))[1]
    merged = cv.RunCurves(loss=best.loss, source=best.source)
    for source in [*reversed(parsed_streams), *files]:
        for name, series in source.metrics.items():
            if len(series):
                merged.metrics[name] = series
    return merged, timing, notes, read


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


def run_migrated(migrated: Path, script: str, args: list[str], config: VerifyConfig, scratch: Path, subdir: str = ""):
    """The migrated command under the XLA execution check, in a copy of the tree, in its folder `subdir`;
    (RunRecord, CheckReport)."""
    run_dir = scratch / "migrated"
    work = run_dir / "work"
    copy_tree(migrated, work)
    env, stamps, stamps_err = _stamp_env(run_dir, dict(config.env))
    before = _files_of(work)
    report = run_check(
        work / subdir / script,
        args,
        steps_warmup=config.warmup_steps,
        timeout_s=config.timeout_s,
        memory_mb=config.memory_mb,
        env=env,
        workdir=work / subdir,
        writable=[run_dir],
    )
    streams = _streams(_read(stamps), _read(stamps_err), config)
    logs = _written_logs(work, before, config, work / subdir)
    curves, timing, notes, read = capture_curves(streams, _log_texts(logs, work), config)
    steady = [s.wall_s for s in report.per_step[config.warmup_steps :]]
    if steady:  # the check times each XLA step; better than the time between printed lines
        timing.per_step_s = [s.wall_s for s in report.per_step]
        timing.step_s = float(sorted(steady)[len(steady) // 2])
    stdout = streams["stdout"][0]
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
        read=read,
    )
    return record, report


def _streams(stamps: str, stamps_err: str, config: VerifyConfig) -> dict[str, tuple[str, cv.Timing]]:
    """stdout and stderr from their stamp files: each one's text and the timing of its loss lines."""
    return {
        name: cv.parse_stamps(text, config.loss_pattern, config.warmup_steps)
        for name, text in (("stdout", stamps), ("stderr", stamps_err))
    }


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


# A call that fixes a global random generator's seed (torch.manual_seed, torch.cuda.manual_seed_all,
# torch_xla.manual_seed, np.random.seed, random.seed, transformers' set_seed, lightning's seed_everything); a
# generator's own `gen.manual_seed(1)` seeds only what draws from it
SEED_CALL = re.compile(
    r"(?<![\w.])(?:torch(?:_xla)?\.(?:cuda\.)?)?manual_seed(?:_all)?\s*\("
    r"|(?<![\w.])(?:(?:np|numpy)\.)?random\.seed\s*\("
    r"|(?<![\w.])(?:\w+\.)?(?:set_seed|seed_everything)\s*\("
)
MAX_SEED_SCAN_BYTES = 2 * 1024 * 1024  # a script's tree of sources; bigger files are data, not code


def source_fixes_seed(folder: Path) -> bool:
    """Whether any Python file of the tree calls a seeding function (a hint only: a seed may also come from a
    flag or a library; two runs of the original are what decides)."""
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts) or not path.is_file():
            continue
        if path.stat().st_size <= MAX_SEED_SCAN_BYTES and SEED_CALL.search(path.read_text("utf-8", errors="replace")):
            return True
    return False


def reference_from_log(config: VerifyConfig, path: str | None = None) -> tuple[RunRecord, float | None]:
    """The recorded GPU run of `path` (default `config.reference_log`) as a reference run, and the price per hour
    it states; VerifyUsageError when it cannot be read."""
    try:
        log = cv.read_reference_log(Path(path or config.reference_log), config.warmup_steps)
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


def run_reference(
    original: Path,
    script: str,
    args: list[str],
    config: VerifyConfig,
    scratch: Path,
    subdir: str = "",
    repeat: int = 0,
    timeout_s: float | None = None,
) -> RunRecord:
    """The original command, unchanged: on CUDA, or on the CPU with CUDA mapped to it, in a copy of the tree, in
    its folder `subdir`. Reused from the cache when the same tree, command and settings already ran. `repeat` > 0
    is another run of the same command (its run-to-run spread), cut at `timeout_s`: what it logged until then is
    kept."""
    mode = reference_mode(config)
    device = "cuda" if mode == "cuda" else "cpu (CUDA calls mapped to the CPU)"
    key_data = [CACHE_VERSION, tree_digest(original), script, args, mode, sorted(config.env.items()), config.log_file]
    key_data += [subdir] if subdir else []
    if repeat:
        key_data += ["repeat", repeat, timeout_s]
    key = hashlib.sha256(json.dumps(key_data).encode()).hexdigest()[:32]
    cache_file = Path(config.reference_cache) / f"reference-{key}.json" if config.reference_cache else None
    if cache_file is not None and cache_file.is_file():
        try:
            saved = json.loads(cache_file.read_text(encoding="utf-8"))
            return _reference_record(saved, script, args, device, config, cached=True)
        except (json.JSONDecodeError, KeyError, OSError):
            pass  # a damaged cache entry is simply run again
    run_dir = scratch / ("reference" if not repeat else f"reference-{repeat + 1}")
    work = run_dir / "work"
    copy_tree(original, work)
    env, stamps, stamps_err = _stamp_env(run_dir, dict(config.env))
    if mode == "cpu":
        argv = [sys.executable, "-m", "xlaport.eval.cuda_to_cpu", str(work / subdir / script), *args]
        env.setdefault("USE_TORCH_XLA", "0")
    else:
        argv = [sys.executable, str(work / subdir / script), *args]
    before = _files_of(work)
    result = run_sandboxed(
        argv,
        cwd=work / subdir,
        timeout_s=timeout_s or config.timeout_s,
        memory_mb=config.memory_mb,
        env=env,
        writable=[run_dir],
    )
    cut = bool(repeat and result.timed_out)  # a repeat stopped at its time budget, on purpose
    saved = {
        "returncode": 0 if cut else None if result.timed_out or result.memory_exceeded else result.returncode,
        "error": None if cut else result.describe_failure(),
        "cut_at_s": timeout_s if cut else None,
        "wall_s": result.wall_s,
        "stamps": _read(stamps) or "\n".join(f"0\t{line}" for line in result.stdout.splitlines()),
        "stamps_err": _read(stamps_err) or "\n".join(f"0\t{line}" for line in result.stderr.splitlines()),
        "logs": _log_texts(_written_logs(work, before, config, work / subdir), work),
    }
    if cache_file is not None and saved["returncode"] == 0:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps(saved), encoding="utf-8")
    return _reference_record(saved, script, args, device, config, cached=False)


def _reference_record(saved: dict, script: str, args: list[str], device: str, config: VerifyConfig, cached: bool):
    streams = _streams(saved["stamps"], saved.get("stamps_err", ""), config)
    curves, timing, notes, read = capture_curves(streams, saved["logs"], config)
    stdout = streams["stdout"][0]
    if timing.step_s is not None and timing.step_s < 1e-4:
        timing.step_s = None  # all loss lines were printed at once: the stamps say nothing about step time
        notes.append("the loss lines were printed all at once; the reference's step time is unknown")
    if saved.get("cut_at_s"):
        notes.append(f"this run of the original was stopped after {saved['cut_at_s']:g} s (repeat_reference_s)")
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
        read=read,
    )
