"""Bulk rewriting: the migrated copy of a whole source tree (or the tree itself, with --in-place).

`migrate_with_pipeline` is what `xlaport migrate`, the HTTP service and the MCP tool run (through
`Pipeline.migrate`). Files are rewritten in parallel (`jobs` processes, results in a stable order); the
parent then retrieves fixes for what is left, lets the code model propose, writes the tree, validates it,
and writes the reports and the trace. SRC is only read unless `in_place`: then a dirty git tree is refused
(`xlaport.files.check_in_place_allowed`), every write is atomic, and a migration that validation rejects
is not written at all. Files that cannot be read or parsed are counted as errors and copied byte for byte.

Migration trace (JSON Lines; one object per line). Each run appends to `DST/xlaport-trace.jsonl` (with
--in-place: the report folder) and to the global file `$XLAPORT_TRACES` (default
`$XLAPORT_CACHE_DIR/traces.jsonl`, i.e. `~/.cache/xlaport/traces.jsonl`). Schema `xlaport.trace/1`, one record per file and one per function
that changed or still has findings:

    schema          "xlaport.trace/1"
    run_id          str    one id per migrate run (shared by its records)
    time            str    ISO 8601 UTC, when the run finished
    src             str    absolute path of the migrated tree
    path            str    file path relative to src
    unit            "file" | "function"
    function        str | null   qualified name ("Trainer.step", "main"); "<module>" for top-level
                                 code; null for unit "file"
    original        str    source before (the whole file, or the function's text)
    migrated        str    source after ("" for a function that no longer exists)
    patch           str    unified diff original -> migrated ("" when unchanged)
    codes_applied   [str]  kb codes of the rewrites applied (a function's: those located in it)
    codes_left      [str]  kb codes of the findings left for a human
    proposed_by     [str]  "rules" and/or "model:<name>" — what produced the change
    validation      {"status": "validated" | "rejected" | "unvalidated", "level": str | null,
                     "reasons": [str], "command": str | null}   the run's validation verdict
    error           str | null   why the file was not migrated (unreadable, unparsable)
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from xlaport.kb import SourceError
from xlaport.kb.batch import FileResult, fix_file
from xlaport.kb.retrieval import cache_dir
from xlaport.kb.rule import Rule

from xlaport.files import SKIP_DIRS, UnreadableSource, atomic_write, backup_path, check_in_place_allowed, read_source

from .pipeline import (
    MODULE_LEVEL,
    RULES_ONLY,
    CheckRun,
    ManualItem,
    MigrateOptions,
    Pipeline,
    Status,
    compile_or_raise,
    enclosing_function,
    function_sources,
    function_spans,
    parse_command,
    run_generated_tests,
    run_xla_check,
    unified_diff,
    verdict,
)

TRACE_SCHEMA = "xlaport.trace/1"
TRACE_FILE = "xlaport-trace.jsonl"
IN_PLACE_REPORT_DIR = ".xlaport"  # with --in-place and no --out, reports go here inside SRC
GENERATED_TESTS_DIR = "tests_xla"  # the differential tests that validation generated, inside the migrated tree
REPORT_FILES = ("xlaport-report.json", "xlaport-report.md", "xlaport-report.html", TRACE_FILE)

Progress = Callable[[int, int, str], None]  # (files done, files in all, the file just done)


class DestinationNotEmpty(FileExistsError):
    pass


# --- typed results ------------------------------------------------------------------------------------
class FileOutcome(BaseModel):
    path: str
    status: Literal["changed", "unchanged", "error"]
    diff: str = ""
    codes_applied: list[str] = []
    manual: list[ManualItem] = []
    rewritten_functions: list[str] = []
    model: str | None = None  # the code model that rewrote functions of this file
    notes: list[str] = []
    error: str | None = None


class Validation(BaseModel):
    command: str | None = None
    checks: list[CheckRun] = []
    level: str | None = None
    validated: bool = False
    status: Status = "unvalidated"
    reason: str | None = None


class MigrationResult(BaseModel):
    run_id: str
    src: str
    dst: str | None
    in_place: bool
    written: bool  # False when --in-place and validation rejected the migration
    python_files: int
    files_changed: int
    other_files_copied: int
    errors: list[str]
    fixes_applied: dict[str, int]
    findings_left: dict[str, int]
    files: list[FileOutcome]
    validation: Validation
    notes: list[str] = []
    report_dir: str
    reports: dict[str, str] = {}
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The short form the CLI prints (same keys as before, plus validation and reports)."""
        return {
            "src": self.src,
            "dst": self.dst,
            "in_place": self.in_place,
            "written": self.written,
            "python_files": self.python_files,
            "files_changed": self.files_changed,
            "other_files_copied": self.other_files_copied,
            "fixes_applied": self.fixes_applied,
            "findings_left": self.findings_left,
            "errors": self.errors,
            "left_for_human": [m.finding.model_dump() for f in self.files for m in f.manual],
            "validation": {"status": self.validation.status, "level": self.validation.level, "reason": self.validation.reason},
            "notes": self.notes,
            "reports": self.reports,
            "wall_s": self.wall_s,
        }


# --- planning and rewriting -----------------------------------------------------------------------------
def plan_tree(src: Path) -> tuple[list[Path], list[Path]]:
    """(python files, other files) under `src`, relative to it, skipping VCS, cache and report folders."""
    python, other = [], []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        skipped = any(part in SKIP_DIRS or part == IN_PLACE_REPORT_DIR for part in rel.parts)
        if skipped or not path.is_file() or path.is_symlink():
            continue
        (python if path.suffix == ".py" else other).append(rel)
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


def _fix_task(task: tuple[str, str, list[str] | None, bool]) -> FileResult:
    path, display, codes, unsafe = task
    from xlaport.kb import get_rule

    rules = None if codes is None else [get_rule(c) for c in codes]
    try:
        compile_or_raise(read_source(Path(path)), display)
    except SourceError as exc:
        return FileResult(display, error=f"{display}: {exc}")
    except (UnreadableSource, OSError):
        pass  # fix_file reports it
    try:
        return fix_file(Path(path), rules, unsafe=unsafe, display=display)
    except Exception as exc:  # one broken file must not end the run; it is reported and copied as is
        return FileResult(display, error=f"{display}: internal error while fixing ({type(exc).__name__}: {exc})")


def rewrite_files(
    src: Path,
    rels: list[Path],
    rules: list[type[Rule]] | None,
    unsafe: bool,
    jobs: int = 1,
    progress: Progress | None = None,
) -> list[FileResult]:
    """The fixed text of every file (nothing is written), in the order of `rels`; `jobs` worker processes."""
    codes = None if rules is None else [r.code for r in rules]
    tasks = [(str(src / rel), str(rel), codes, unsafe) for rel in rels]
    results: list[FileResult] = []

    def collect(iterator) -> None:
        for rel, result in zip(rels, iterator, strict=True):
            results.append(result)
            if progress:
                progress(len(results), len(tasks), str(rel))

    if jobs <= 1 or len(tasks) < 2:
        collect(map(_fix_task, tasks))
    else:
        # spawn: workers start clean (no threads or torch state inherited from a server process)
        with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=get_context("spawn")) as pool:
            collect(pool.map(_fix_task, tasks, chunksize=max(1, len(tasks) // (jobs * 4))))
    return results


def write_tree(src: Path, dst: Path, other: list[Path], results: dict[Path, FileResult], texts: dict[Path, str]) -> int:
    """Writes the migrated copy: migrated text where there is one, the original bytes otherwise."""
    for rel in other:
        _copy(src / rel, dst / rel)
    for rel, result in results.items():
        if result.error or rel not in texts:
            _copy(src / rel, dst / rel)  # never written as migrated
        else:
            atomic_write(dst / rel, texts[rel])
            shutil.copystat(src / rel, dst / rel)
    return len(other)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def write_in_place(src: Path, originals: dict[Path, str], texts: dict[Path, str], force: bool) -> list[str]:
    """Rewrites the changed files of `src` atomically; keeps `.xlaport.bak` copies when git cannot restore them."""
    changed = [rel for rel, text in texts.items() if text != originals[rel]]
    needs_backup = check_in_place_allowed([src / rel for rel in changed], force)
    backups = []
    for rel in changed:
        if needs_backup:
            atomic_write(backup_path(src / rel), originals[rel])
            backups.append(str(backup_path(src / rel)))
        atomic_write(src / rel, texts[rel])
    return backups


# --- validation of a migrated tree ------------------------------------------------------------------------
def validate_tree(original_root: Path, migrated_root: Path, command: str, options: MigrateOptions) -> Validation:
    """The execution check of the migrated entry script, then the generated original-vs-migrated tests."""
    script, args = parse_command(command)
    # run from the tree root, as the command is written (the recorded run and the tests do the same)
    checks = [run_xla_check(migrated_root / script, args, options.timeout_s, options.memory_mb, migrated_root)]
    record = shlex.join(["python", script, *args])
    # tests for every changed function of the tree, inputs recorded from the same command on the original;
    # kept in the migrated tree so they can be run again on a TPU host
    tests_dir = migrated_root / GENERATED_TESTS_DIR
    checks.append(run_generated_tests(original_root, migrated_root, tests_dir, record=record, timeout_s=options.timeout_s))
    status, reason, level = verdict(checks)
    return Validation(
        command=command, checks=checks, level=level, validated=status == "validated", status=status, reason=reason
    )


# --- the whole run ----------------------------------------------------------------------------------------
def migrate_with_pipeline(
    pipeline: Pipeline,
    src: Path,
    dst: Path | None,
    options: MigrateOptions,
    progress: Progress | None = None,
    *,
    may_execute: bool = True,
) -> MigrationResult:
    start = time.perf_counter()
    src = src.resolve()
    if not src.is_dir():
        raise NotADirectoryError(f"source is not a directory: {src}")
    python, other = plan_tree(src)
    if options.in_place:
        report_dir = dst.resolve() if dst else src / IN_PLACE_REPORT_DIR
        check_in_place_allowed([src / rel for rel in python], options.force)  # fail before any work
    else:
        if dst is None:
            raise ValueError("a destination (--out) is needed unless migrating in place")
        dst = dst.resolve()
        check_destination(src, dst, options.force)
        report_dir = dst
    if options.validate_cmd:
        script, _ = parse_command(options.validate_cmd)
        if not (src / script).is_file():
            raise ValueError(f"the validation command's script is not in the source tree: {script}")
    rules = pipeline.rules(options.select, options.ignore)

    results = rewrite_files(src, python, rules, options.unsafe_fixes, options.jobs, progress)
    by_rel = dict(zip(python, results, strict=True))
    outcomes, texts, originals, notes = [], {}, {}, []
    for rel, result in by_rel.items():
        if result.error:
            outcomes.append(FileOutcome(path=str(rel), status="error", error=result.error))
            continue
        text, manual, proposals, file_notes = pipeline.finish_file(result.fixed, str(rel), result.findings, rules, options.k)
        texts[rel], originals[rel] = text, result.source
        outcomes.append(
            FileOutcome(
                path=str(rel),
                status="changed" if text != result.source else "unchanged",
                diff=unified_diff(result.source, text, str(rel)),
                codes_applied=[f.code for f in result.applied],
                manual=manual,
                rewritten_functions=[p.function_name for p in proposals],
                model=proposals[0].model if proposals else None,
                notes=[n for n in file_notes if n != RULES_ONLY],
            )
        )
        notes += [n for n in file_notes if n == RULES_ONLY]

    validation = Validation(reason="validation was not requested (--validate)")
    if options.validate_cmd and not may_execute:
        validation = Validation(
            command=options.validate_cmd, reason="validation not allowed: running code needs permission"
        )
    written = True
    if options.in_place:
        if options.validate_cmd and may_execute:
            with tempfile.TemporaryDirectory(prefix="xlaport-stage-") as stage:
                write_tree(src, Path(stage), other, by_rel, texts)
                validation = validate_tree(src, Path(stage), options.validate_cmd, options)
        if validation.status == "rejected":
            written = False
            notes.append("source left unchanged: validation rejected the migration")
        else:
            backups = write_in_place(src, originals, texts, options.force)
            if backups:
                notes.append(f"backups kept: {len(backups)} file(s) *.xlaport.bak")
        copied = 0
    else:
        copied = write_tree(src, dst, other, by_rel, texts)
        if options.validate_cmd and may_execute:
            validation = validate_tree(src, dst, options.validate_cmd, options)

    migration = MigrationResult(
        run_id=uuid.uuid4().hex[:12],
        src=str(src),
        dst=None if options.in_place else str(dst),
        in_place=options.in_place,
        written=written,
        python_files=len(python),
        files_changed=sum(o.status == "changed" for o in outcomes),
        other_files_copied=copied,
        errors=[o.error for o in outcomes if o.error],
        fixes_applied=dict(sorted(Counter(c for o in outcomes for c in o.codes_applied).items())),
        findings_left=dict(sorted(Counter(m.finding.code for o in outcomes for m in o.manual).items())),
        files=outcomes,
        validation=validation,
        notes=list(dict.fromkeys(notes)),
        report_dir=str(report_dir),
    )
    from .report import write_reports

    migration.wall_s = round(time.perf_counter() - start, 3)
    migration.reports = write_reports(migration, report_dir)
    records = trace_records(migration, originals, texts, by_rel)
    migration.reports["trace"] = str(append_trace(records, report_dir / TRACE_FILE))
    global_trace = append_trace(records, global_trace_path())
    if global_trace is not None:
        migration.reports["trace_global"] = str(global_trace)
    return migration


# --- the migration trace ------------------------------------------------------------------------------------
def global_trace_path() -> Path:
    return Path(os.environ.get("XLAPORT_TRACES") or cache_dir() / "traces.jsonl")


def trace_records(
    migration: MigrationResult, originals: dict[Path, str], texts: dict[Path, str], results: dict[Path, FileResult]
) -> list[dict]:
    """The trace records of one run (schema in the module docstring)."""
    finished = datetime.now(UTC).isoformat(timespec="seconds")
    validation = {
        "status": migration.validation.status,
        "level": migration.validation.level,
        "reasons": [migration.validation.reason] if migration.validation.reason else [],
        "command": migration.validation.command,
    }
    base = {"schema": TRACE_SCHEMA, "run_id": migration.run_id, "time": finished, "src": migration.src}
    records = []
    for outcome in migration.files:
        rel = Path(outcome.path)
        original = originals.get(rel) or results[rel].source or ""
        migrated = texts.get(rel, "")
        by = (["rules"] if outcome.codes_applied else []) + ([f"model:{outcome.model}"] if outcome.model else [])
        records.append(
            {
                **base,
                "path": outcome.path,
                "unit": "file",
                "function": None,
                "original": original,
                "migrated": migrated,
                "patch": outcome.diff,
                "codes_applied": outcome.codes_applied,
                "codes_left": [m.finding.code for m in outcome.manual],
                "proposed_by": by,
                "validation": validation,
                "error": outcome.error,
            }
        )
        if outcome.error:
            continue
        records += _function_records(base, outcome, original, migrated, results[rel], validation)
    return records


def _function_records(base: dict, outcome: FileOutcome, original: str, migrated: str, result: FileResult, validation: dict) -> list[dict]:
    before, after = function_sources(original), function_sources(migrated)
    before[MODULE_LEVEL], after[MODULE_LEVEL] = _module_level(original), _module_level(migrated)
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
        by = (["rules"] if name in applied else []) + (
            [f"model:{outcome.model}"] if name in outcome.rewritten_functions else []
        )
        records.append(
            {
                **base,
                "path": outcome.path,
                "unit": "function",
                "function": name,
                "original": old,
                "migrated": new,
                "patch": unified_diff(old, new, f"{outcome.path}::{name}") if old != new else "",
                "codes_applied": applied.get(name, []),
                "codes_left": left.get(name, []),
                "proposed_by": by,
                "validation": validation,
                "error": None,
            }
        )
    return records


def _module_level(source: str) -> str:
    """The file's top-level code: every line outside functions and methods."""
    inside = set()
    for _, start, end in function_spans(source):
        inside.update(range(start, end + 1))
    return "".join(line for number, line in enumerate(source.splitlines(keepends=True), 1) if number not in inside)


def append_trace(records: list[dict], path: Path) -> Path | None:
    """Appends JSON lines to `path` in one write; None when it cannot be written (a read-only cache)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        return path
    except OSError:
        return None
