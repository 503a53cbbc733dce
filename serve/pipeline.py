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
              for a tree, the migrated copy (serve/migration.py, serve/tree.py), the reports and the trace.

A patch is "validated" only when every check ran and passed (serve/results.py `verdict`). One `Pipeline`
per process: the kb index is loaded once, on first use.
"""

from __future__ import annotations

import gc
import shlex
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from xlaport.kb import Finding, Rule, SourceError, all_rules, fix_source, get_rule, lint_source, select_rules
from xlaport.kb.docs import entry_dict, render_markdown
from xlaport.kb.hits import FixHit, finding_query
from xlaport.kb.parsing import RECURSION_LIMIT_HIT, parse
from xlaport.model.proposal import Proposal, Proposer
from xlaport.model.proposer import load_proposer
from xlaport.model.spans import enclosing_function, function_spans

from xlaport.files import (
    BOM,
)
from xlaport.targets import DEFAULT_TARGET, evidence_note

from .inputs import check_arguments, check_file_name, module_command, parse_command
from .isolated import FIX_WORKERS, fix_source_killable
from .lines import in_original_lines
from .migration import TreeRun, finish_migration, library_pin_notes, optimize_copy, plan_migration, write_and_prove
from .phases import PhaseListener, PhaseTimer
from .project import ProjectSource
from .results import (
    CheckOutcome,
    Evidence,
    FileOutcome,
    FixEntry,
    ManualItem,
    MigrateOptions,
    MigrationResult,
    Patch,
    SuggestOptions,
    VerifyOutcome,
)
from .source import unified_diff
from .tree import rewrite_tree
from .validation import check_in_project, project_pair, validate_in_project

if TYPE_CHECKING:
    from xlaport.kb.retrieval import FixIndex

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
                from xlaport.kb.retrieval import FixIndex  # numpy and the embedding model: the [search] extra

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
        if command and module_command(command) is None:  # `python -m pkg.mod` runs as python -m does
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
        report = run_verify(
            Path(original), Path(migrated), command, cwd=cwd, loss_pattern=loss_pattern, migrated_args=migrated_args
        )
        return verify_outcome(report, command)

    def verify_in_project(
        self,
        project: ProjectSource,
        migrated: dict[str, str],
        command: str,
        *,
        original: dict[str, str] | None = None,
        cwd: str | None = None,
        loss_pattern: str | None = None,
        migrated_args: list[str] | None = None,
    ) -> VerifyOutcome:
        """`verify` of a project whose files `migrated` (relative path -> text) are the migration: the original is
        the project as it is (with `original`'s texts, when given), the migrated one the same with `migrated`'s;
        `command` runs in both copies from their folder `cwd`."""
        parse_command(command)
        for text in [*migrated.values(), *(original or {}).values()]:
            parse(text.removeprefix(BOM))
        texts = {rel: text.removeprefix(BOM) for rel, text in migrated.items()}
        before = {rel: text.removeprefix(BOM) for rel, text in (original or {}).items()}
        with project_pair(project, texts, before, cwd) as (original_root, migrated_root, folder):
            return self.verify(original_root, migrated_root, command, folder, loss_pattern, migrated_args)

    def verify_sources(self, original: str, migrated: str, args: list[str], name: str = "train.py") -> VerifyOutcome:
        """`verify` of a one-file program given as two texts (the HTTP service's form)."""
        with _program_pair(original, migrated, args, name, "xlaport-verify-") as tmp:
            return self.verify(tmp / "original", tmp / "migrated", shlex.join(["python", name, *args]))

    # -- optimize ----------------------------------------------------------------------------------------
    def optimize(
        self,
        tree: Path,
        validate_cmd: str | None = None,
        verify_cmd: str | None = None,
        original: Path | None = None,
        *,
        may_execute: bool = True,
        write: bool = True,
    ) -> dict:
        """The optimization stage on a migrated tree (serve/optimize.py); without permission to run code, or
        without a command, it only proposes."""
        from .optimize import optimize

        if not may_execute:
            validate_cmd = verify_cmd = None
        return optimize(Path(tree), validate_cmd, verify_cmd, original, write=write).to_dict()

    def optimize_sources(
        self, original: str, migrated: str, args: list[str], name: str = "train.py", *, run: bool = True
    ) -> dict:
        """`optimize` of a one-file program given as two texts (the HTTP service's form); `run=False` proposes."""
        with _program_pair(original, migrated, args, name, "xlaport-optimize-") as tmp:
            command = shlex.join(["python", name, *args]) if run else None
            return self.optimize(tmp / "migrated", command, command, tmp / "original", write=False)

    # -- a whole tree ------------------------------------------------------------------------------------
    def migrate(
        self,
        src: Path,
        dst: Path | None,
        options: MigrateOptions | None = None,
        progress: PhaseListener | None = None,
        *,
        may_execute: bool = True,
    ) -> MigrationResult:
        """Migrates a tree into `dst` (or in place), validates and verifies it, writes the reports and the trace.

        One record per file goes through the stages of serve/migration.py. With `in_place`, a migration that
        validation or verify rejects is not written at all. `progress` is told when each phase (and step) starts;
        the result records what each took (serve/phases.py).
        """
        options = options or MigrateOptions()
        # refuses before any work; the rules are those [tool.xlaport] and the options select
        run = plan_migration(src, dst, options, may_execute)
        run.timer = PhaseTimer(progress)
        run.timer.start("rewrite")
        rewrite_tree(run.src, run.files, run.rules, run.options.unsafe_fixes, options.jobs, run.timer.files)
        run.timer.start("related fixes" if options.k or self.proposer is not None else "findings left")
        self.finish_tree(run)
        run.notes += library_pin_notes(run)
        write_and_prove(run)
        optimize_copy(run)
        return finish_migration(run)

    def finish_tree(self, run: TreeRun) -> None:
        """Steps 3–4 for each rewritten file of a tree: related kb fixes for what the rules left and, for Python
        files, the code model; the migrated text and the file's outcome go into its record."""
        k = run.options.k
        for record in run.files:
            rel, result = str(record.rel), record.rules
            if result is None:  # a plain copy
                continue
            if result.error:
                record.outcome = FileOutcome(path=rel, status="error", error=result.error)
                continue
            if record.kind == "python":
                rules = [r for r in run.rules if r.code not in record.ignored]  # per-file-ignores
                text, manual, proposals, notes = self.finish_file(result.fixed, rel, result.findings, rules, k)
            else:  # config files: rules only, no model
                text, manual, proposals, notes = (
                    result.fixed,
                    self.manual_items(result.fixed, result.findings, k),
                    [],
                    [],
                )
            record.text = text
            record.outcome = FileOutcome(
                path=rel,
                status="changed" if text != result.source else "unchanged",
                diff=unified_diff(result.source, text, rel),
                codes_applied=[f.code for f in result.applied],
                manual=in_original_lines(manual, result.source, text),
                rewritten_functions=[p.function_name for p in proposals],
                model=proposals[0].model if proposals else None,
                notes=[n for n in notes if n != RULES_ONLY],
            )
            run.notes += [n for n in notes if n == RULES_ONLY]
        if k == 0 and any(record.outcome.manual for record in run.files if record.outcome):
            run.notes.append(NOT_SEARCHED)


@contextmanager
def _program_pair(original: str, migrated: str, args: list[str], name: str, prefix: str) -> Iterator[Path]:
    """A scratch folder the sandbox user can read, holding a one-file program's two texts as `original/NAME` and
    `migrated/NAME`, once the name, the arguments and both texts are checked (ValueError, SourceError)."""
    from xlaport.eval.sandbox import readable_scratch

    check_file_name(name)
    if not name.endswith(".py") or Path(name).name != name:
        raise ValueError(f"the script name must be a plain file name ending in .py: {name!r}")
    check_arguments(args)
    original, migrated = original.removeprefix(BOM), migrated.removeprefix(BOM)
    parse(original)
    parse(migrated)
    with readable_scratch(prefix) as tmp:
        for folder, text in (("original", original), ("migrated", migrated)):
            Path(tmp, folder).mkdir()
            Path(tmp, folder, name).write_text(text, encoding="utf-8")
        yield Path(tmp)


_DEFAULT: Pipeline | None = None
_DEFAULT_LOCK = threading.Lock()


def get_pipeline() -> Pipeline:
    """The process-wide pipeline (index loaded once, code model if one is available)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Pipeline(proposer=load_default_proposer())
        return _DEFAULT
