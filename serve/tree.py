"""A source tree on disk: which files to migrate, rewriting them in parallel, writing the migrated copy
(or the tree itself, in place) and the trace records of a run.

SRC is only read unless in place: then a dirty git tree is refused (`xlaport.files.in_place_backups`),
every write is atomic and `.xlaport.bak` copies are kept where git cannot restore a file. Files that
cannot be read or parsed are reported and copied byte for byte.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path

from xlaport.kb import get_rule
from xlaport.kb.analysis.project import ProjectSteps
from xlaport.kb.batch import FileResult, fix_file, summarize_project
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
    write_with_backup,
)
from xlaport.trace import MODULE_LEVEL, TraceRecord, TraceValidation

from .isolated import WORKER_CONTEXT
from .results import FileOutcome, MigrationResult
from .source import unified_diff

IN_PLACE_REPORT_DIR = ".xlaport"  # with --in-place and no --out, reports go here inside SRC
GENERATED_TESTS_DIR = "tests_xla"  # the differential tests that validation generated, in the migrated tree

MIN_FILES_FOR_PROCESSES = 8  # smaller trees take about as long as starting the workers
MAX_AUTO_JOBS = 8
Progress = Callable[[int, int, str], None]  # (files done, files in all, the file just done)


class DestinationNotEmpty(FileExistsError):
    pass


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


def _fix_task(task: tuple[str, str, list[str] | None, bool, ProjectSteps]) -> FileResult:
    path, display, codes, unsafe, project = task
    rules = None if codes is None else [get_rule(c) for c in codes]
    # one broken file must not end the run: fix_file reports it (and it is copied as is); kb's parse refuses
    # what would crash libcst (see xlaport.kb.parsing.parse)
    return fix_file(Path(path), rules, unsafe=unsafe, display=display, project=project)


def auto_jobs(files: int) -> int:
    """Worker processes for a tree of `files` Python files when none were asked for: one per core, for trees
    big enough to repay starting them."""
    return min(os.cpu_count() or 1, MAX_AUTO_JOBS) if files >= MIN_FILES_FOR_PROCESSES else 1


def rewrite_files(
    src: Path,
    rels: list[Path],
    rules: list[type[Rule]] | None,
    unsafe: bool,
    jobs: int | None = 1,
    progress: Progress | None = None,
) -> list[FileResult]:
    """The fixed text of every file (nothing is written), in the order of `rels`; `jobs` worker processes
    (None: `auto_jobs`). Each file is analysed as part of the tree: a training loop that calls another module's
    stepping helper gets its step barrier (kb/analysis/project.py)."""
    codes = None if rules is None else [r.code for r in rules]
    project = summarize_project(src, rels)
    tasks = [(str(src / rel), str(rel), codes, unsafe, project) for rel in rels]
    jobs = auto_jobs(len(tasks)) if jobs is None else jobs
    results: list[FileResult | None] = [None] * len(tasks)

    def done(index: int, result: FileResult) -> None:
        results[index] = result
        if progress:
            progress(sum(r is not None for r in results), len(tasks), str(rels[index]))

    if jobs <= 1 or len(tasks) < 2:
        for index, task in enumerate(tasks):
            done(index, _fix_task(task))
    else:
        # largest files first, one at a time: no worker is left with the big ones at the end; results keep the
        # order of `rels`. Workers fork from the forkserver that preloaded the kb (serve/isolated.py): they start
        # in milliseconds and inherit no threads or torch state from a server process.
        order = sorted(range(len(tasks)), key=lambda i: -_size(tasks[i][0]))
        with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=WORKER_CONTEXT) as pool:
            futures = {pool.submit(_fix_task, tasks[i]): i for i in order}
            for future in as_completed(futures):
                index = futures[future]
                try:
                    result = future.result()
                except Exception as exc:  # a worker that died (a native crash): that file is reported, not the run
                    result = FileResult(str(rels[index]), error=f"{rels[index]}: the analysis process died ({exc})")
                done(index, result)
    return [r for r in results if r is not None]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def rewrite_configs(src: Path, other: list[Path], rules: list[type[Rule]] | None) -> dict[Path, FileResult]:
    """The config files and run scripts among `other` that name a CUDA device or NCCL (kb/configs.py), fixed;
    the others, and files that are not text, are copied as they are."""
    results = {rel: fix_file(src / rel, rules, display=str(rel)) for rel in other if config_kind(rel)}
    return {rel: r for rel, r in results.items() if not r.error and (r.applied or r.findings)}


def write_tree(src: Path, dst: Path, other: list[Path], results: dict[Path, FileResult], texts: dict[Path, str]) -> int:
    """Writes the migrated copy: migrated text where there is one, the original bytes otherwise."""
    for rel in other:
        copy_file(src / rel, dst / rel)
    for rel, result in results.items():
        if result.error or rel not in texts:
            copy_file(src / rel, dst / rel)  # never written as migrated
        else:
            atomic_write(dst / rel, texts[rel], like=src / rel)
            shutil.copystat(src / rel, dst / rel)
    return len(other)


def write_in_place(
    src: Path, originals: dict[Path, str], texts: dict[Path, str], force: bool
) -> tuple[list[str], list[str]]:
    """Rewrites the changed files of `src` atomically; keeps `.xlaport.bak` copies where git cannot restore them.
    (backups, files left as they were because they were edited while the tree was analysed, with the reason)."""
    changed = [rel for rel, text in texts.items() if text != originals[rel]]
    needs_backup = in_place_backups([src / rel for rel in changed], force)
    backups, skipped = [], []
    for rel in changed:
        try:
            backup = write_with_backup(src / rel, texts[rel], src / rel in needs_backup, expected=originals[rel])
        except ChangedMeanwhile as exc:
            skipped.append(str(exc))
            continue
        if backup is not None:
            backups.append(str(backup))
    return backups, skipped


# --- the migration trace ------------------------------------------------------------------------------------
def trace_records(
    migration: MigrationResult, originals: dict[Path, str], texts: dict[Path, str], results: dict[Path, FileResult]
) -> list[TraceRecord]:
    """The trace records of one run: one per file, one per function that changed or has findings left."""
    v = migration.validation
    validation = TraceValidation(
        status=v.status, level=v.level, reasons=[v.reason] if v.reason else [], command=v.command
    )
    run = {"run_id": migration.run_id, "time": datetime.now(UTC).isoformat(timespec="seconds"), "src": migration.src}
    records = []
    for outcome in migration.files:
        rel = Path(outcome.path)
        common = {**run, "path": outcome.path, "validation": validation}
        original = originals.get(rel) or results[rel].source or ""
        migrated = texts.get(rel, "")
        left = [m.finding.code for m in outcome.manual]
        by = _proposed_by(bool(outcome.codes_applied), outcome.model)
        records.append(
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
        if not outcome.error and not config_kind(rel) and (migrated != original or results[rel].applied or left):
            records += _function_records(common, outcome, original, migrated, results[rel])
    return records


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
