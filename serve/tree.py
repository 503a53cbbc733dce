"""A source tree on disk: which files to migrate, rewriting them in parallel, writing the migrated copy
(or the tree itself, in place) and the trace records of a run.

SRC is only read unless in place: then a dirty git tree is refused (`xlaport.files.in_place_backups`),
every write is atomic and `.xlaport.bak` copies are kept where git cannot restore a file. Files that
cannot be read or parsed are reported and copied byte for byte.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from xlaport.kb.batch import FileJob, FileResult, Progress, Tree, TreeTask, fix_file, run_files
from xlaport.kb.batch import auto_jobs as batch_auto_jobs
from xlaport.kb.configs import config_kind
from xlaport.kb.rule import Rule
from xlaport.model.spans import enclosing_function, function_sources, function_spans, module_level

from xlaport.files import (
    SKIP_DIRS,
    ChangedMeanwhile,
    atomic_write,
    copy_file,
    in_place_backups,
    is_own_output,
    one_file,
    write_with_backup,
)
from xlaport.trace import MODULE_LEVEL, TraceRecord, TraceValidation

from .isolated import WORKER_CONTEXT
from .results import FileOutcome, MigrationResult
from .source import unified_diff

IN_PLACE_REPORT_DIR = ".xlaport"  # with --in-place and no --out, reports go here inside SRC
GENERATED_TESTS_DIR = "tests_xla"  # the differential tests that validation generated, in the migrated tree

MAX_AUTO_JOBS = 8


class DestinationNotEmpty(FileExistsError):
    pass


@dataclass
class FileRecord:
    """One file of a migrated tree, from the plan to the trace: read and rewritten once, written once.

    `kind`: "python" (the rules, then related kb fixes and the code model for what they leave), "config" (a config
    file or run script that names a CUDA device or NCCL: the rules only), "copy" (copied byte for byte) or
    "excluded" (the lint configuration's `exclude`: never analysed, copied byte for byte).
    """

    rel: Path  # from the tree's root
    kind: Literal["python", "config", "copy", "excluded"]
    ignored: tuple[str, ...] = ()  # the codes the configuration's per-file-ignores turns off for this file
    rules: FileResult | None = None  # what the rules did: the original text, their rewrite, the findings left
    text: str | None = None  # the migrated text; None: the file is copied as it is (never written as migrated)
    outcome: FileOutcome | None = None  # what the reports say of it; None for a plain copy

    @property
    def original(self) -> str:
        return (self.rules.source if self.rules else None) or ""


def plan_records(python: list[Path], other: list[Path]) -> list[FileRecord]:
    """One record per file of `plan_tree`'s lists, Python files first."""
    return [FileRecord(rel, "python") for rel in python] + [FileRecord(rel, "copy") for rel in other]


# --- planning and rewriting -----------------------------------------------------------------------------
def plan_tree(src: Path, notes: list[str] | None = None) -> tuple[list[Path], list[Path]]:
    """(python files, other files) under `src`, relative to it, skipping VCS, cache and report folders.

    Symlinks are other files (copied as links, never rewritten through); FIFOs, sockets and devices are skipped:
    `notes` (when given) says which. Every other file is the user's, also one that looks like a temporary.
    """
    python, other, special = [], [], []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part in SKIP_DIRS or part == IN_PLACE_REPORT_DIR for part in rel.parts) or is_own_output(rel.name):
            continue
        if path.is_symlink():
            other.append(rel)
        elif path.is_file():
            (python if path.suffix == ".py" else other).append(rel)
        elif not path.is_dir():
            special.append(str(rel))
    if notes is not None:
        links = [str(rel) for rel in other if (src / rel).is_symlink()]
        if links:
            notes.append(
                f"symlinks kept as links, not migrated: {', '.join(links[:5])}" + (" ..." if len(links) > 5 else "")
            )
        if special:
            notes.append(f"skipped, not regular files: {', '.join(special[:5])}" + (" ..." if len(special) > 5 else ""))
    return python, other


def check_destination(src: Path, dst: Path, force: bool) -> None:
    if not src.is_dir():
        raise NotADirectoryError(f"source is not a directory: {src}")
    if dst == src or src in dst.parents:
        raise ValueError("the destination must be outside the source tree")
    if dst.exists() and not dst.is_dir():
        raise NotADirectoryError(f"destination is not a directory: {dst}")
    if dst.exists() and any(dst.iterdir()) and not force:
        raise DestinationNotEmpty(f"destination exists and is not empty: {dst} (pass --force to write into it)")


def auto_jobs(files: int) -> int:
    """Worker processes for a tree of `files` Python files when none were asked for: one per core (at most
    MAX_AUTO_JOBS), for trees big enough to repay starting them."""
    return batch_auto_jobs(files, MAX_AUTO_JOBS)


def rewrite_files(
    src: Path,
    rels: list[Path],
    rules: list[type[Rule]] | None,
    unsafe: bool,
    jobs: int | None = 1,
    progress: Progress | None = None,
    ignored: dict[Path, tuple[str, ...]] | None = None,
) -> list[FileResult]:
    """The fixed text of every file (nothing is written), in the order of `rels`, without the codes `ignored` turns
    off for a file (per-file-ignores); `jobs` worker processes (None: `auto_jobs`). Each file is analysed as part
    of the tree: a training loop that calls another module's stepping helper gets its step barrier
    (kb/analysis/project.py). Workers fork from the forkserver that
    preloaded the kb (serve/isolated.py): they start in milliseconds and inherit no threads or torch state from
    a server process; each parses a file once, for the tree's summary and for its fix (kb/batch.py)."""
    codes = None if rules is None else tuple(r.code for r in rules)
    off = tuple((str(src / rel), ignored[rel]) for rel in rels if ignored and ignored.get(rel))  # FileJob.path
    task = TreeTask(fix=True, codes=codes, unsafe=unsafe, ignored=off)
    files = [FileJob(src / rel, str(rel), 0, rel) for rel in rels]
    jobs = auto_jobs(len(rels)) if jobs is None else jobs
    return run_files(files, [Tree(src, tuple(rels))], task, jobs, WORKER_CONTEXT, progress)


def rewrite_tree(
    src: Path,
    records: list[FileRecord],
    rules: list[type[Rule]] | None,
    unsafe: bool,
    jobs: int | None = 1,
    progress: Progress | None = None,
) -> None:
    """Fills in what the rules do to each record: the Python files in worker processes (`rewrite_files`), then the
    config files and run scripts that name a CUDA device or NCCL (kb/configs.py: rules only, safe fixes only;
    symlinks are never rewritten through). Other files, and files that are not text, stay plain copies."""
    python = [record for record in records if record.kind == "python"]
    ignored = {record.rel: record.ignored for record in python if record.ignored}
    results = rewrite_files(src, [record.rel for record in python], rules, unsafe, jobs, progress, ignored)
    for record, result in zip(python, results, strict=True):
        record.rules = result
    for record in records:
        if record.kind == "copy" and config_kind(record.rel) and not (src / record.rel).is_symlink():
            chosen = (
                rules if rules is None or not record.ignored else [r for r in rules if r.code not in record.ignored]
            )
            result = fix_file(src / record.rel, chosen, display=str(record.rel))
            if not result.error and (result.applied or result.findings):
                record.kind, record.rules = "config", result


def folders_of(src: Path) -> list[Path]:
    """The folders under `src` (relative, not through links) that plan_tree does not skip: a folder the program
    writes into (`logs/`, `checkpoints/`) may hold no file, and the migrated copy needs it as the original has it."""
    folders = []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part in SKIP_DIRS or part == IN_PLACE_REPORT_DIR for part in rel.parts):
            continue
        if path.is_dir() and not path.is_symlink():
            folders.append(rel)
    return folders


def write_tree(src: Path, dst: Path, records: list[FileRecord]) -> int:
    """Writes the migrated copy: migrated text where there is one, the original bytes otherwise, and every folder
    of the original, empty ones too. Returns the number of files that are not Python (copied, or config files
    rewritten)."""
    for rel in folders_of(src):
        (dst / rel).mkdir(parents=True, exist_ok=True)
    for record in records:
        if record.text is None:
            copy_file(src / record.rel, dst / record.rel)  # never written as migrated
        else:
            with one_file():  # a stop waits for the times too
                atomic_write(dst / record.rel, record.text, like=src / record.rel)
                shutil.copystat(src / record.rel, dst / record.rel)
    return sum(record.kind != "python" for record in records)


def write_in_place(src: Path, records: list[FileRecord], force: bool) -> tuple[list[str], list[str]]:
    """Rewrites the changed files of `src` atomically; keeps `.xlaport.bak` copies where git cannot restore them.
    (backups, files left as they were because they were edited while the tree was analysed, with the reason)."""
    changed = [record for record in records if record.text is not None and record.text != record.original]
    needs_backup = in_place_backups([src / record.rel for record in changed], force)
    backups, skipped = [], []
    for record in changed:
        path = src / record.rel
        try:
            backup = write_with_backup(path, record.text, path in needs_backup, expected=record.original)
        except ChangedMeanwhile as exc:
            skipped.append(str(exc))
            continue
        if backup is not None:
            backups.append(str(backup))
    return backups, skipped


# --- the migration trace ------------------------------------------------------------------------------------
def trace_records(migration: MigrationResult, records: list[FileRecord]) -> list[TraceRecord]:
    """The trace records of one run: one per file, one per function that changed or has findings left."""
    v = migration.validation
    validation = TraceValidation(
        status=v.status, level=v.level, reasons=[v.reason] if v.reason else [], command=v.command
    )
    run = {"run_id": migration.run_id, "time": datetime.now(UTC).isoformat(timespec="seconds"), "src": migration.src}
    traces = []
    for record in records:
        outcome = record.outcome
        if outcome is None:  # a plain copy
            continue
        common = {**run, "path": outcome.path, "validation": validation}
        original, migrated = record.original, record.text or ""
        left = [m.finding.code for m in outcome.manual]
        by = _proposed_by(bool(outcome.codes_applied), outcome.model)
        traces.append(
            TraceRecord(
                **common,
                unit="file",
                function=None,
                original=original,
                migrated=migrated,
                patch=outcome.diff,
                codes_applied=outcome.codes_applied,
                codes_left=left,
                proposed_by=by,
                error=outcome.error,
            )
        )
        # a file left as it was, with nothing applied or left, has no function records: not parsed again
        if record.kind == "python" and not outcome.error and (migrated != original or record.rules.applied or left):
            traces += _function_records(common, outcome, original, migrated, record.rules)
    return traces


def _function_records(
    common: dict, outcome: FileOutcome, original: str, migrated: str, result: FileResult
) -> list[TraceRecord]:
    before, after = function_sources(original), function_sources(migrated)
    before[MODULE_LEVEL], after[MODULE_LEVEL] = module_level(original), module_level(migrated)
    spans = function_spans(original)
    applied: dict[str, list[str]] = {}
    for finding in result.applied:
        applied.setdefault(enclosing_function(spans, finding.line), []).append(finding.code)
    left: dict[str, list[str]] = {}
    for item in outcome.manual:
        left.setdefault(item.function, []).append(item.finding.code)
    records = []
    for name in list(dict.fromkeys([*before, *after])):
        old, new = before.get(name, ""), after.get(name, "")
        if old == new and name not in applied and name not in left:
            continue
        patch = unified_diff(old, new, f"{outcome.path}::{name}") if old != new else ""
        by = _proposed_by(name in applied, outcome.model if name in outcome.rewritten_functions else None)
        records.append(
            TraceRecord(
                **common,
                unit="function",
                function=name,
                original=old,
                migrated=new,
                patch=patch,
                codes_applied=applied.get(name, []),
                codes_left=left.get(name, []),
                proposed_by=by,
            )
        )
    return records


def _proposed_by(rules: bool, model: str | None) -> list[str]:
    return (["rules"] if rules else []) + ([f"model:{model}"] if model else [])
