"""The one migration pipeline behind every front (CLI, HTTP service, MCP tool): one file, a tree, verify.

Steps, in order:

1. detect   — the kb rules find migration problems (`xlaport.kb.lint_source`);
2. fix      — rewrites are applied by applicability: safe always, unsafe only when asked (`fix_source`);
3. retrieve — every finding left is searched in the FAISS-indexed kb (`xlaport.kb.retrieval`);
4. propose  — a code model (any `xlaport.model.proposal.Proposer`) may rewrite the functions the rules
              could not fix; without one, what is left comes back as manual items with the retrieved fixes;
5. validate — the XLA execution check on the migrated script and the generated original-vs-migrated
              tests, both in sandboxed children (serve/checks.py); for a tree also `verify` (L0–L4 against
              a reference run of the original). When validation and verify are given the same command, the
              program runs once: validation reuses verify's execution check;
6. patch    — a unified diff plus evidence: codes applied, checks run, their results, the level reached;
              for a tree, the migrated copy (serve/tree.py), the reports (serve/report.py) and the trace.

A patch is "validated" only when every check ran and passed (serve/results.py `verdict`). One `Pipeline`
per process: the kb index is loaded once, on first use.
"""

from __future__ import annotations

import gc
import shlex
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from xlaport.kb import Finding, Rule, SourceError, all_rules, fix_source, get_rule, lint_source, select_rules
from xlaport.kb.docs import entry_dict, render_markdown
from xlaport.kb.parsing import RECURSION_LIMIT_HIT, parse
from xlaport.kb.retrieval import FixHit, FixIndex, finding_query
from xlaport.kb.tpu_pins import LibraryPinPredatesTpu, is_pin_file, lint_pins
from xlaport.model.proposal import Proposal, Proposer
from xlaport.model.proposer import load_proposer
from xlaport.model.spans import enclosing_function, function_spans

from xlaport.files import (
    BOM,
    REPORT_MODE,
    WriteFailed,
    check_writable,
    in_place_backups,
    quoting_mode,
    restrict_mode,
    writable_too,
)
from xlaport.paths import traces_path
from xlaport.targets import DEFAULT_TARGET, evidence_note
from xlaport.trace import TRACE_FILE, append_records

from .inputs import check_arguments, check_file_name, parse_command
from .isolated import FIX_WORKERS, fix_source_killable
from .lines import in_original_lines
from .project import ProjectSource
from .report import write_reports, write_verify_reports
from .results import (
    CheckOutcome,
    CheckRun,
    Evidence,
    FileOutcome,
    FixEntry,
    ManualItem,
    MigrateOptions,
    MigrationResult,
    Patch,
    SuggestOptions,
    Validation,
    VerifyOutcome,
    verdict,
)
from .source import unified_diff
from .tree import (
    GENERATED_TESTS_DIR,
    IN_PLACE_REPORT_DIR,
    Progress,
    check_destination,
    plan_tree,
    rewrite_configs,
    rewrite_files,
    trace_records,
    write_in_place,
    write_tree,
)
from .validation import check_in_project, validate_in_project

RULES_ONLY = "rules-only: no code model configured"
# migrate searches related kb fixes only when asked (the search model costs seconds and ~1 GB to load)
NOT_SEARCHED = "related kb fixes not searched (`--related 3` lists 3 per finding left)"
SNIPPET_NAME = "snippet.py"


def load_default_proposer() -> Proposer | None:
    """The code model of migrate, HTTP and MCP: only when `$XLAPORT_MODEL` names one (opt-in), else None
    (rules-only). A proposal costs ~9 s per function on a CPU and every migrate worker loads the model,
    so a trained adapter lying in the models dir is not picked up by itself; `xlaport suggest` does that."""
    return load_proposer(use_newest=False)


class Pipeline:
    """detect → fix → retrieve → propose → validate → patch. Thread-safe; create one per process."""

    def __init__(self, index: FixIndex | None = None, proposer: Proposer | None = None) -> None:
        self._index = index
        self._index_lock = threading.Lock()
        self.proposer = proposer

    @property
    def index(self) -> FixIndex:
        with self._index_lock:
            if self._index is None:
                self._index = FixIndex.load_or_build()
            return self._index

    def warm_up(self) -> None:
        """Loads the index and the embedding model, and starts a fix worker, now rather than on the first request.

        What is loaded then lives as long as the server: frozen, no garbage collection walks it again (with the
        model and the index, ~600k objects: a full collection in the middle of a request took ~0.4 s)."""
        FIX_WORKERS.warm(1)
        self.index.search("warm up", 1)
        gc.collect()
        gc.freeze()

    # -- the knowledge base ----------------------------------------------------------------------------
    def fixes(self) -> list[dict]:
        """Every kb entry (no index needed)."""
        return [entry_dict(rule) for rule in all_rules()]

    def explain(self, code: str) -> FixEntry:
        """One kb entry in full. Raises KeyError for an unknown code."""
        rule = get_rule(code)
        return FixEntry(entry=entry_dict(rule), markdown=render_markdown(rule))

    def search(self, text: str, k: int = 5) -> list[FixHit]:
        if not text.strip():
            raise ValueError("the search text is empty")
        return self.index.search(text, k)

    # -- one file ----------------------------------------------------------------------------------------
    def suggest(
        self,
        source: str,
        path: str | None = None,
        options: SuggestOptions | None = None,
        *,
        may_execute: bool = True,
        fix_time_limit_s: float | None = None,
        project: ProjectSource | None = None,
    ) -> Patch:
        """A patch for one file's text. Raises SourceError (unparsable) or ValueError (bad options).

        With `fix_time_limit_s` the fix step runs in a child process killed at that limit (AnalysisTimeout):
        a service's timed-out request stops its work instead of holding a slot until it ends. `project`: the
        project the file lives in at `path` (relative to its root), where validation runs it (serve/validation.py).
        """
        options = options or SuggestOptions()
        name = path or SNIPPET_NAME
        check_file_name(name)
        check_arguments(options.args)
        if options.command:
            parse_command(options.command)  # refused before any work
        if project is not None and path is None:
            raise ValueError("`path` is needed with a project: where the file lies in it, e.g. 'train.py'")
        source = source.removeprefix(BOM)  # a file's encoding mark, not its text (a BOM kept would not parse)
        rules = self.rules(options.select, options.ignore, options.target)
        try:
            if fix_time_limit_s is None:
                fixed = fix_source(source, name, rules, unsafe=options.unsafe_fixes)
            else:
                fixed = fix_source_killable(source, name, rules, options.unsafe_fixes, fix_time_limit_s)
        except RecursionError:  # kb's parse limits should prevent it; every front gets the reason if not
            raise SourceError(RECURSION_LIMIT_HIT) from None
        migrated, manual, proposals, notes = self.finish_file(fixed.fixed, name, fixed.remaining, rules, options.k)

        def evidence_of(text: str, left: list[ManualItem], rewrites: list[Proposal]) -> Evidence:
            evidence = Evidence(
                codes_applied=[f.code for f in fixed.applied],
                codes_left=[m.finding.code for m in left],
                rewritten_functions=[p.function_name for p in rewrites],
                model=rewrites[0].model if rewrites else None,
            )
            if text == source:
                evidence.reason = "nothing to validate: no changes"
            elif not options.validate_patch:
                evidence.reason = "validation was not requested"
            elif evidence_note(options.target) is not None:
                evidence.reason = f"{evidence_note(options.target)}; the patch is unvalidated"
            elif not may_execute:
                evidence.reason = "validation not allowed: running submitted code needs the server's token"
            else:
                evidence = self.validate_file(source, text, name, options, evidence, project)
            return evidence

        evidence = evidence_of(migrated, manual, proposals)
        if proposals and evidence.status == "rejected":
            # the model's rewrites must never cost the rules' work: the rules' patch alone, if it fares better
            rules_manual = self.manual_items(fixed.fixed, fixed.remaining, options.k)
            rules_evidence = evidence_of(fixed.fixed, rules_manual, [])
            if rules_evidence.status != "rejected":
                notes.append(
                    f"code model {evidence.model}: rewrite of {', '.join(evidence.rewritten_functions)} dropped, "
                    f"validation rejected it ({evidence.reason}); the rules' patch alone is kept"
                )
                migrated, manual, evidence = fixed.fixed, rules_manual, rules_evidence
        return Patch(
            path=name,
            changed=migrated != source,
            diff=unified_diff(source, migrated, name),
            migrated=migrated,
            applied=list(fixed.applied),
            manual=in_original_lines(manual, source, migrated),
            evidence=evidence,
            notes=notes,
        )

    def rules(
        self, select: list[str] | None = None, ignore: list[str] | None = None, target: str = DEFAULT_TARGET
    ) -> list[type[Rule]]:
        try:
            return select_rules(select, ignore, target)
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None

    def finish_file(
        self, source: str, path: str, remaining: list[Finding], rules: list[type[Rule]], k: int
    ) -> tuple[str, list[ManualItem], list[Proposal], list[str]]:
        """Steps 3–4 on already-fixed text: (text, manual items, accepted proposals, notes)."""
        manual = self.manual_items(source, remaining, k)
        if not remaining:
            return source, manual, [], []
        if self.proposer is None:
            return source, manual, [], [RULES_ONLY]
        source, proposals, notes = self.propose(source, path, manual, rules)
        if proposals:
            manual = self.manual_items(source, lint_source(source, path, rules), k)
        return source, manual, proposals, notes

    def manual_items(self, source: str, findings: list[Finding], k: int) -> list[ManualItem]:
        """Each finding with its enclosing function and the `k` kb entries that fit it best."""
        if not findings:
            return []
        queries = [finding_query(f) for f in findings]
        unique = list(dict.fromkeys(queries))
        hits = dict(zip(unique, self.index.search_many(unique, k), strict=True)) if k > 0 else {}
        spans = function_spans(source)
        return [
            ManualItem(finding=f, function=enclosing_function(spans, f.line), retrieved=hits.get(q, []))
            for f, q in zip(findings, queries, strict=True)
        ]

    def propose(
        self, source: str, path: str, manual: list[ManualItem], rules: list[type[Rule]]
    ) -> tuple[str, list[Proposal], list[str]]:
        """Asks the code model for one rewrite per function with findings; keeps those that parse and help."""
        assert self.proposer is not None
        accepted: list[Proposal] = []
        notes: list[str] = []
        findings_left = len(manual)
        by_function: dict[str, list[ManualItem]] = {}
        for item in manual:
            by_function.setdefault(item.function, []).append(item)
        for function, items in by_function.items():
            findings = [item.finding for item in items]
            retrieved = [hit.model_dump() for item in items for hit in item.retrieved]
            try:
                proposal = self.proposer.propose(source, function, findings, retrieved)
            except Exception as exc:  # a model failure must not lose the rules' work
                notes.append(f"{function}: no proposal from the code model ({type(exc).__name__}: {exc})")
                continue
            if proposal is None:
                continue
            try:
                left = lint_source(proposal.source, path, rules)
            except SourceError as exc:
                notes.append(f"{function}: proposal dropped, it does not parse ({exc})")
                continue
            if len(left) >= findings_left:
                notes.append(f"{function}: proposal dropped, it fixes no finding")
                continue
            proposal.model = proposal.model or self.proposer.name
            accepted.append(proposal)
            source, findings_left = proposal.source, len(left)  # later proposals build on this one
        if accepted:
            notes.append(f"code model {self.proposer.name}: rewrote {', '.join(p.function_name for p in accepted)}")
        return source, accepted, notes

    def validate_file(
        self,
        original: str,
        migrated: str,
        name: str,
        options: SuggestOptions,
        evidence: Evidence,
        project: ProjectSource | None = None,
    ) -> Evidence:
        """Runs the checks on copies of the project (or of the file alone) and fills in the verdict."""
        return validate_in_project(project, original, migrated, name, options, evidence)

    # -- running code ------------------------------------------------------------------------------------
    def check(
        self,
        source: str | None = None,
        path: Path | None = None,
        args: list[str] | None = None,
        timeout_s: float = 300.0,
        memory_mb: int = 4096,
        *,
        workdir: Path | None = None,
        project: ProjectSource | None = None,
        rel_path: str | None = None,
        cwd: str | None = None,
        command: str | None = None,
    ) -> CheckOutcome:
        """The XLA execution check of a script given as text or as a path (run from `workdir`, default a private
        folder). With `project`: the script `rel_path` (its text `source`, else the project's) runs in a copy of
        the project, from its folder `cwd`, or `command` does (serve/validation.py)."""
        from xlaport.eval.sandbox import readable_scratch

        from .checks import run_xla_check

        check_arguments(args or [])
        if command:
            parse_command(command)
        if project is not None:
            if rel_path is None:
                raise ValueError("`path` is needed with a project: the script's path in it, e.g. 'train.py'")
            check_file_name(rel_path)
            if source is not None:
                parse(source.removeprefix(BOM))
            text = None if source is None else source.removeprefix(BOM)
            run = check_in_project(project, text, rel_path, args or [], cwd, command, timeout_s, memory_mb)
            return CheckOutcome(script=rel_path, check=run)
        if (source is None) == (path is None):
            raise ValueError("give either the script's source or its path")
        if path is not None:
            if not path.is_file():
                raise ValueError(f"no such script: {path}")
            return CheckOutcome(
                script=str(path), check=run_xla_check(path, args or [], timeout_s, memory_mb, workdir, reveal=False)
            )
        source = source.removeprefix(BOM)
        parse(source)  # refuse what is not Python before running it
        with readable_scratch("xlaport-check-") as tmp:
            script = Path(tmp, "script.py")
            script.write_text(source, encoding="utf-8")
            return CheckOutcome(script="script.py", check=run_xla_check(script, args or [], timeout_s, memory_mb))

    # -- verify ------------------------------------------------------------------------------------------
    def verify(
        self,
        original: Path,
        migrated: Path,
        command: str,
        cwd: str | None = None,
        loss_pattern: str | None = None,
        migrated_args: list[str] | None = None,
    ) -> VerifyOutcome:
        """L0–L4 of the migrated tree against a reference run of the original (xlaport.eval.verify), the command
        run in their folder `cwd` (default: their roots); `loss_pattern` finds the loss in a log format of its own;
        `migrated_args` are given to the migrated run alone (`--device xla`)."""
        from .checks import run_verify, verify_outcome

        for folder in (original, migrated):
            if not Path(folder).is_dir():
                raise ValueError(f"not a directory: {folder}")
        check_arguments(migrated_args or [])
        report = run_verify(Path(original), Path(migrated), command, cwd, loss_pattern, migrated_args)
        return verify_outcome(report, command)

    def verify_sources(self, original: str, migrated: str, args: list[str], name: str = "train.py") -> VerifyOutcome:
        """`verify` of a one-file program given as two texts (the HTTP service's form)."""
        from xlaport.eval.sandbox import readable_scratch

        check_file_name(name)
        if not name.endswith(".py") or Path(name).name != name:
            raise ValueError(f"the script name must be a plain file name ending in .py: {name!r}")
        check_arguments(args)
        original, migrated = original.removeprefix(BOM), migrated.removeprefix(BOM)
        parse(original)
        parse(migrated)
        with readable_scratch("xlaport-verify-") as tmp:
            for folder, text in (("original", original), ("migrated", migrated)):
                Path(tmp, folder).mkdir()
                Path(tmp, folder, name).write_text(text, encoding="utf-8")
            return self.verify(Path(tmp, "original"), Path(tmp, "migrated"), shlex.join(["python", name, *args]))

    # -- a whole tree ------------------------------------------------------------------------------------
    def migrate(
        self,
        src: Path,
        dst: Path | None,
        options: MigrateOptions | None = None,
        progress: Progress | None = None,
        *,
        may_execute: bool = True,
    ) -> MigrationResult:
        """Migrates a tree into `dst` (or in place), validates and verifies it, writes the reports and the trace.

        With `in_place`, a migration that validation or verify rejects is not written at all.
        """
        start = time.perf_counter()
        options = options or MigrateOptions()
        src = Path(src).resolve()
        if not src.is_dir():
            raise NotADirectoryError(f"source is not a directory: {src}")
        tree_notes: list[str] = []
        python, other = plan_tree(src, tree_notes)
        if options.in_place:
            report_dir = dst.resolve() if dst else src / IN_PLACE_REPORT_DIR
            in_place_backups([src / rel for rel in python], options.force)  # refuse before any work
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
        rules = self.rules(options.select, options.ignore, options.target)
        # the reports and traces quote the sources: none is readable by more people than every source is
        report_mode = quoting_mode(src / rel for rel in [*python, *other] if not (src / rel).is_symlink())

        results = rewrite_files(src, python, rules, options.unsafe_fixes, options.jobs, progress)
        by_rel = dict(zip(python, results, strict=True))
        outcomes, texts, originals, notes = [], {}, {}, tree_notes
        for rel, result in by_rel.items():
            if result.error:
                outcomes.append(FileOutcome(path=str(rel), status="error", error=result.error))
                continue
            text, manual, proposals, file_notes = self.finish_file(
                result.fixed, str(rel), result.findings, rules, options.k
            )
            texts[rel], originals[rel] = text, result.source
            outcomes.append(
                FileOutcome(
                    path=str(rel),
                    status="changed" if text != result.source else "unchanged",
                    diff=unified_diff(result.source, text, str(rel)),
                    codes_applied=[f.code for f in result.applied],
                    manual=in_original_lines(manual, result.source, text),
                    rewritten_functions=[p.function_name for p in proposals],
                    model=proposals[0].model if proposals else None,
                    notes=[n for n in file_notes if n != RULES_ONLY],
                )
            )
            notes += [n for n in file_notes if n == RULES_ONLY]
        if options.k == 0 and any(o.manual for o in outcomes):
            notes.append(NOT_SEARCHED)
        for rel, result in rewrite_configs(src, other, rules).items():  # rules only, no model
            by_rel[rel], texts[rel], originals[rel] = result, result.fixed, result.source
            outcomes.append(
                FileOutcome(
                    path=str(rel),
                    status="changed" if result.changed else "unchanged",
                    diff=unified_diff(result.source, result.fixed, str(rel)),
                    codes_applied=[f.code for f in result.applied],
                    manual=in_original_lines(
                        self.manual_items(result.fixed, result.findings, options.k), result.source, result.fixed
                    ),
                )
            )

        notes += library_pin_notes(src, other, rules)

        validation = Validation(reason="validation was not requested (--validate)")
        verification = None
        if options.validate_cmd and not may_execute:
            validation = Validation(
                command=options.validate_cmd, reason="validation not allowed: running code needs permission"
            )
        if options.verify_cmd and not may_execute:
            notes.append("verify not run: running code needs permission")
        no_evidence = evidence_note(options.target)
        if no_evidence is not None:  # nothing of this target runs here: no run, and the label says so
            validation = Validation(command=options.validate_cmd, reason=f"{no_evidence}; the migration is unvalidated")
            notes.append(f"{options.target}: {no_evidence}; validate/verify not run, the migration is unvalidated")
            may_execute = False
        written = True
        if options.in_place:
            if may_execute and (options.validate_cmd or options.verify_cmd):
                with tempfile.TemporaryDirectory(prefix="xlaport-stage-") as stage, writable_too(Path(stage)):
                    write_tree(src, Path(stage), other, by_rel, texts)
                    validation, verification = self.evidence(
                        src, Path(stage), options, validation, report_dir, report_mode
                    )
            if validation.status == "rejected" or (verification is not None and verification.status == "fail"):
                written = False
                notes.append(
                    "source left unchanged: "
                    + ("validation" if validation.status == "rejected" else "verify")
                    + " rejected the migration"
                )
            else:
                backups, skipped = write_in_place(src, originals, texts, options.force)
                if backups:
                    notes.append(f"backups kept: {len(backups)} file(s) *.xlaport.bak")
                notes += [f"not written: {reason}" for reason in skipped]
            copied = 0
        else:
            created = not dst.exists()
            try:
                copied = write_tree(src, dst, other, by_rel, texts)
            except WriteFailed:
                if created:  # no partial copy left behind
                    shutil.rmtree(dst, ignore_errors=True)
                raise
            if may_execute:
                validation, verification = self.evidence(src, dst, options, validation, report_dir, report_mode)

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
            verification=verification,
            notes=list(dict.fromkeys(notes)),
            report_dir=str(report_dir),
        )
        migration.wall_s = round(time.perf_counter() - start, 3)
        migration.reports = write_reports(migration, report_dir, report_mode)
        if options.keep_trace:  # opt-in: the records quote the user's source
            records = trace_records(migration, originals, texts, by_rel)
            check_writable(report_dir / TRACE_FILE)  # appended to, not replaced: checked here, not in atomic_write
            migration.reports["trace"] = str(append_records(records, report_dir / TRACE_FILE))
            global_trace = append_records(records, traces_path())
            for trace in (report_dir / TRACE_FILE, global_trace):  # they quote the sources too
                if trace is not None:
                    restrict_mode(trace, report_mode)
            if global_trace is not None:
                migration.reports["trace_global"] = str(global_trace)
        return migration

    def evidence(
        self,
        original_root: Path,
        migrated_root: Path,
        options: MigrateOptions,
        validation: Validation,
        report_dir: Path,
        report_mode: int = REPORT_MODE,
    ) -> tuple[Validation, VerifyOutcome | None]:
        """Validation (execution check + generated tests) and verify of a migrated tree, as asked.

        The same command for both: verify runs first and its execution check is validation's, so the
        program runs once for both. Verify's HTML and JSON go to `report_dir`.
        """
        if not (options.verify_cmd or options.validate_cmd):
            return validation, None
        from .checks import check_run_of_verify, run_verify, verify_outcome

        verification = None
        shared = None
        if options.verify_cmd:
            report = run_verify(original_root, migrated_root, options.verify_cmd)
            verification = verify_outcome(report, options.verify_cmd)
            verification.reports = write_verify_reports(report, report_dir, report_mode)
            if options.validate_cmd and parse_command(options.validate_cmd) == parse_command(options.verify_cmd):
                shared = check_run_of_verify(verification.report)
        if options.validate_cmd:
            validation = self.validate_tree(original_root, migrated_root, options.validate_cmd, options, shared)
        return validation, verification

    def validate_tree(
        self,
        original_root: Path,
        migrated_root: Path,
        command: str,
        options: MigrateOptions,
        xla_check: CheckRun | None = None,
    ) -> Validation:
        """The execution check of the migrated entry script (unless given), then the generated tests."""
        from .checks import run_generated_tests, run_xla_check

        script, args = parse_command(command)
        # run from the tree root, as the command is written (the recorded run and the tests do the same)
        checks = [
            xla_check
            or run_xla_check(migrated_root / script, args, options.timeout_s, options.memory_mb, migrated_root)
        ]
        record = shlex.join(["python", script, *args])
        # tests for every changed file's functions and modules, inputs recorded from the same command on the
        # original; kept in the migrated tree, to run again on a TPU host
        tests_dir = migrated_root / GENERATED_TESTS_DIR
        checks.append(
            run_generated_tests(original_root, migrated_root, tests_dir, record=record, timeout_s=options.timeout_s)
        )
        status, reason, level = verdict(checks)
        return Validation(
            command=command, checks=checks, level=level, validated=status == "validated", status=status, reason=reason
        )


_DEFAULT: Pipeline | None = None
_DEFAULT_LOCK = threading.Lock()


def get_pipeline() -> Pipeline:
    """The process-wide pipeline (index loaded once, code model if one is available)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Pipeline(proposer=load_default_proposer())
        return _DEFAULT


def library_pin_notes(src: Path, files: list[Path], rules: list[type[Rule]]) -> list[str]:
    """The torch_tpu target's library-version trap (kb/tpu_pins.py) in the tree's requirements files and
    pyproject.toml, one note per pin: nothing to rewrite, a human checks the release."""
    if LibraryPinPredatesTpu not in rules:
        return []
    notes = []
    for rel in files:
        path = src / rel
        if is_pin_file(rel) and not path.is_symlink() and path.stat().st_size < 1_000_000:
            found = lint_pins(path.read_text(encoding="utf-8", errors="replace"), str(rel))
            notes += [f"{f.path}:{f.line}: {f.code} {f.message}" for f in found]
    return notes
