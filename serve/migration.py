"""Migrating a tree, stage by stage, over one record per file (serve/tree.py `FileRecord`).

plan → rewrite (the rules, in worker processes: serve/tree.py) → related fixes (kb search and the code model:
`Pipeline.finish_tree`) → write (a copy; in place, only once the evidence allows it) → evidence (validation,
verify) → the result with its reports and trace. `Pipeline.migrate` is the list of these stages; each reads and
fills in one `TreeRun`.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from xlaport.kb import Rule, all_rules
from xlaport.kb.lint_config import (
    ConfigError,
    LintSettings,
    Selection,
    check_per_file_selectors,
    choose_rules,
    ignored_codes,
    is_excluded,
    load_settings,
)
from xlaport.kb.tpu_pins import LibraryPinPredatesTpu, is_pin_file, lint_pins

from xlaport.files import (
    WriteFailed,
    check_writable,
    in_place_backups,
    quoting_mode,
    restrict_mode,
    writable_too,
)
from xlaport.paths import traces_path
from xlaport.targets import evidence_note
from xlaport.trace import TRACE_FILE, append_records

from .inputs import parse_command
from .phases import PhaseTimer, Step
from .report import write_reports, write_verify_reports
from .results import CheckRun, MigrateOptions, MigrationResult, Validation, VerifyOutcome, verdict
from .tree import (
    GENERATED_TESTS_DIR,
    IN_PLACE_REPORT_DIR,
    FileRecord,
    check_destination,
    plan_records,
    plan_tree,
    trace_records,
    write_in_place,
    write_tree,
)

NOT_REQUESTED = "validation was not requested (--validate)"


@dataclass
class TreeRun:
    """One migration of a tree as it goes through the stages."""

    src: Path
    dst: Path | None  # None: in place
    report_dir: Path
    report_mode: int  # the reports and traces quote the sources: none is readable by more people than every source
    options: MigrateOptions
    may_execute: bool
    files: list[FileRecord]
    notes: list[str]
    start: float
    rules: list[type[Rule]] = field(default_factory=list)
    validation: Validation = field(default_factory=lambda: Validation(reason=NOT_REQUESTED))
    verification: VerifyOutcome | None = None
    written: bool = True  # False when in place and the evidence rejected the migration
    copied: int = 0  # files that are not Python, written into the copy
    optimization: dict | None = None  # the optimization stage's report (serve/optimize.py), with --optimize
    timer: PhaseTimer = field(default_factory=PhaseTimer)  # where the time goes (serve/phases.py)

    @property
    def python_files(self) -> int:
        return sum(record.kind == "python" for record in self.files)


def plan_migration(src: Path, dst: Path | None, options: MigrateOptions, may_execute: bool) -> TreeRun:
    """Which files, and where they and the reports go. Everything that would refuse the run (no source, a dirty
    file to rewrite in place, a destination inside the source or not empty, a command whose script is not in the
    tree) refuses it here, before any work."""
    start = time.perf_counter()
    src = Path(src).resolve()
    if not src.is_dir():
        raise NotADirectoryError(f"source is not a directory: {src}")
    settings, rules = configured_rules(src, options)
    if options.unsafe_fixes is None:
        options = options.model_copy(update={"unsafe_fixes": settings.unsafe_fixes})
    notes: list[str] = []
    python, other = plan_tree(src, notes)
    excluded = {rel for rel in [*python, *other] if is_excluded(src / rel, settings)}
    python = [rel for rel in python if rel not in excluded]
    if options.in_place:
        report_dir = dst.resolve() if dst else src / IN_PLACE_REPORT_DIR
        in_place_backups([src / rel for rel in python], options.force)
        dst = None
    else:
        if dst is None:
            raise ValueError("a destination (--out) is needed unless migrating in place")
        dst = Path(dst).resolve()
        check_destination(src, dst, options.force)
        report_dir = dst
    for command in filter(None, (options.validate_cmd, options.verify_cmd)):
        script, _ = parse_command(command)
        if not (src / script).is_file():
            raise ValueError(f"the command's script is not in the source tree: {script}")
    report_mode = quoting_mode(src / rel for rel in [*python, *other] if not (src / rel).is_symlink())
    files = plan_records(python, [rel for rel in other if rel not in excluded])
    files += [FileRecord(rel, "excluded") for rel in sorted(excluded)]
    for record in files:
        record.ignored = ignored_codes(src / record.rel, settings, rules)
    if excluded:
        notes.append(f"{len(excluded)} file(s) excluded by {settings.source}: copied as they are")
    run = TreeRun(src, dst, report_dir, report_mode, options, may_execute, files, notes, start)
    run.rules = rules
    return run


def configured_rules(src: Path, options: MigrateOptions) -> tuple[LintSettings, list[type[Rule]]]:
    """The lint configuration of the tree (`[tool.xlaport]` found from `src` up, as `xlaport lint SRC` finds it;
    kb/lint_config.py) and the rules it and the options select: the options are the command line's layer on top.
    Raises ValueError for a configuration or a selection that cannot be used."""
    try:
        settings = load_settings([src], Path(options.config) if options.config else None, options.isolated)
        available = all_rules(options.target)
        chosen = choose_rules(available, [settings.selection])  # a typo in the file is named with the file
        check_per_file_selectors(settings, available)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    except KeyError as exc:
        raise ValueError(f"{settings.source}: {exc.args[0]}") from None
    given = Selection(
        select=None if options.select is None else tuple(options.select),
        ignore=tuple(options.ignore or ()),
    )
    try:
        chosen = choose_rules(available, [settings.selection, given])
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    return settings, chosen


def library_pin_notes(run: TreeRun) -> list[str]:
    """The torch_tpu target's library-version trap (kb/tpu_pins.py) in the tree's requirements files and
    pyproject.toml, one note per pin: nothing to rewrite, a human checks the release."""
    if LibraryPinPredatesTpu not in run.rules:
        return []
    notes = []
    for record in run.files:
        path = run.src / record.rel
        if record.kind in ("config", "copy") and is_pin_file(record.rel) and not path.is_symlink():
            if path.stat().st_size < 1_000_000:
                found = lint_pins(path.read_text(encoding="utf-8", errors="replace"), str(record.rel))
                notes += [f"{f.path}:{f.line}: {f.code} {f.message}" for f in found]
    return notes


# --- write and evidence ---------------------------------------------------------------------------------------
def write_and_prove(run: TreeRun) -> None:
    """Writes the migration and gathers the evidence asked for: a copy is written, then run; in place, the evidence
    comes from a staged copy first, and a migration it rejects is not written at all."""
    may_execute = _evidence_allowed(run)
    if run.options.in_place:
        _write_in_place(run, may_execute)
    else:
        _write_copy(run, may_execute)


def _evidence_allowed(run: TreeRun) -> bool:
    """Whether the migrated code may run here; when not, the validation and the notes say why."""
    options = run.options
    if options.validate_cmd and not run.may_execute:
        run.validation = Validation(
            command=options.validate_cmd, reason="validation not allowed: running code needs permission"
        )
    if options.verify_cmd and not run.may_execute:
        run.notes.append("verify not run: running code needs permission")
    no_evidence = evidence_note(options.target)
    if no_evidence is not None:  # nothing of this target runs here: no run, and the label says so
        run.validation = Validation(command=options.validate_cmd, reason=f"{no_evidence}; the migration is unvalidated")
        run.notes.append(f"{options.target}: {no_evidence}; validate/verify not run, the migration is unvalidated")
        return False
    return run.may_execute


def _write_in_place(run: TreeRun, may_execute: bool) -> None:
    options = run.options
    if may_execute and (options.validate_cmd or options.verify_cmd):
        with tempfile.TemporaryDirectory(prefix="xlaport-stage-") as stage, writable_too(Path(stage)):
            run.timer.start("write")
            write_tree(run.src, Path(stage), run.files)
            gather_evidence(run, Path(stage))
    rejected_by = "validation" if run.validation.status == "rejected" else None
    if run.verification is not None and run.verification.status == "fail":
        rejected_by = rejected_by or "verify"
    if rejected_by:
        run.written = False
        run.notes.append(f"source left unchanged: {rejected_by} rejected the migration")
        return
    run.timer.start("write")
    backups, skipped = write_in_place(run.src, run.files, options.force)
    if backups:
        run.notes.append(f"backups kept: {len(backups)} file(s) *.xlaport.bak")
    run.notes += [f"not written: {reason}" for reason in skipped]


def _write_copy(run: TreeRun, may_execute: bool) -> None:
    assert run.dst is not None
    created = not run.dst.exists()
    run.timer.start("write")
    try:
        run.copied = write_tree(run.src, run.dst, run.files)
    except WriteFailed:
        if created:  # no partial copy left behind
            shutil.rmtree(run.dst, ignore_errors=True)
        raise
    if may_execute:
        gather_evidence(run, run.dst)


def gather_evidence(run: TreeRun, migrated_root: Path) -> None:
    """Validation (execution check + generated tests) and verify of a migrated tree, as asked.

    The same command for both: verify runs first and its execution check is validation's, so the program runs once
    for both. Verify's HTML and JSON go to the report folder.
    """
    options = run.options
    if not (options.verify_cmd or options.validate_cmd):
        return
    from .checks import check_run_of_verify, run_verify, verify_outcome

    shared = None
    if options.verify_cmd:
        run.timer.start("verify")
        report = run_verify(run.src, migrated_root, options.verify_cmd, run.timer.step)
        run.verification = verify_outcome(report, options.verify_cmd)
        run.verification.reports = write_verify_reports(report, run.report_dir, run.report_mode)
        if options.validate_cmd and parse_command(options.validate_cmd) == parse_command(options.verify_cmd):
            shared = check_run_of_verify(run.verification.report)
    if options.validate_cmd:
        run.timer.start("validate")
        run.validation = validate_tree(run.src, migrated_root, options.validate_cmd, options, shared, run.timer.step)


def validate_tree(
    original_root: Path,
    migrated_root: Path,
    command: str,
    options: MigrateOptions,
    xla_check: CheckRun | None = None,
    step: Step | None = None,
) -> Validation:
    """The execution check of the migrated entry script (unless given), then the generated tests. `step` is told
    when each starts (serve/phases.py)."""
    from .checks import run_generated_tests, run_xla_check

    step = step or (lambda name: None)
    script, args = parse_command(command)
    if xla_check is None:
        step("the migrated run (execution check)")
    # run from the tree root, as the command is written (the recorded run and the tests do the same)
    checks = [
        xla_check or run_xla_check(migrated_root / script, args, options.timeout_s, options.memory_mb, migrated_root)
    ]
    record = shlex.join(["python", script, *args])
    # tests for every changed file's functions and modules, inputs recorded from the same command on the
    # original; kept in the migrated tree, to run again on a TPU host
    tests_dir = migrated_root / GENERATED_TESTS_DIR
    checks.append(
        run_generated_tests(
            original_root, migrated_root, tests_dir, record=record, timeout_s=options.timeout_s, step=step
        )
    )
    status, reason, level = verdict(checks)
    return Validation(
        command=command, checks=checks, level=level, validated=status == "validated", status=status, reason=reason
    )


def optimize_copy(run: TreeRun) -> None:
    """The optimization stage on the migrated copy (serve/optimize.py), when asked and the copy was proven."""
    options = run.options
    if not options.optimize:
        return
    if run.dst is None or not run.may_execute or not (options.validate_cmd or options.verify_cmd):
        run.notes.append("optimize not run: it needs a migrated copy (--out), a command and permission to run it")
        return
    from .optimize import optimize

    run.timer.start("optimize")
    report = optimize(
        run.dst,
        options.validate_cmd,
        options.verify_cmd,
        original=run.src,
        timeout_s=options.timeout_s,
        memory_mb=options.memory_mb,
    )
    run.optimization = report.to_dict()
    run.notes.append(f"optimize: {report.status}: {report.reason}")


# --- the result -------------------------------------------------------------------------------------------------
def finish_migration(run: TreeRun) -> MigrationResult:
    """The result of the run, with its reports written and, when asked, its trace kept."""
    outcomes = [record.outcome for record in run.files if record.outcome is not None]
    migration = MigrationResult(
        run_id=uuid.uuid4().hex[:12],
        src=str(run.src),
        dst=None if run.dst is None else str(run.dst),
        in_place=run.options.in_place,
        written=run.written,
        python_files=run.python_files,
        files_changed=sum(o.status == "changed" for o in outcomes),
        other_files_copied=run.copied,
        errors=[o.error for o in outcomes if o.error],
        fixes_applied=dict(sorted(Counter(c for o in outcomes for c in o.codes_applied).items())),
        findings_left=dict(sorted(Counter(m.finding.code for o in outcomes for m in o.manual).items())),
        files=outcomes,
        validation=run.validation,
        verification=run.verification,
        optimization=run.optimization,
        notes=list(dict.fromkeys(run.notes)),
        report_dir=str(run.report_dir),
    )
    run.timer.start("reports")  # what it takes is in the result, not in the files it writes
    migration.wall_s = round(time.perf_counter() - run.start, 3)
    migration.phases = list(run.timer.timings)
    migration.reports = write_reports(migration, run.report_dir, run.report_mode)
    if run.options.keep_trace:  # opt-in: the records quote the user's source
        keep_trace(migration, run)
    run.timer.stop()
    migration.phases = list(run.timer.timings)
    return migration


def keep_trace(migration: MigrationResult, run: TreeRun) -> None:
    """Appends the run's trace records beside the reports and to the training trace file."""
    records = trace_records(migration, run.files)
    local = run.report_dir / TRACE_FILE
    check_writable(local)  # appended to, not replaced: checked here, not in atomic_write
    migration.reports["trace"] = str(append_records(records, local))
    global_trace = append_records(records, traces_path())
    for trace in (local, global_trace):  # they quote the sources too
        if trace is not None:
            restrict_mode(trace, run.report_mode)
    if global_trace is not None:
        migration.reports["trace_global"] = str(global_trace)
