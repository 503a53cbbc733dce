"""The one migration pipeline behind every front (CLI `migrate`, HTTP service, MCP tool).

Steps, in order:

1. detect   — the kb rules find migration problems (`xlaport.kb.lint_source`);
2. fix      — rewrites are applied by applicability: safe always, unsafe only when asked (`fix_source`);
3. retrieve — every finding left is searched in the FAISS-indexed kb (`xlaport.kb.retrieval`);
4. propose  — a code model (any `Proposer`) may rewrite the functions the rules could not fix; without
              one, what is left comes back as manual items with the retrieved fixes attached;
5. validate — the XLA execution check (`xlaport.eval.check.run_check`) on the migrated script and the
              generated original-vs-migrated tests (`xlaport.eval.testgen`), both in sandboxed children;
6. patch    — a unified diff plus evidence: codes applied, checks run, their results, the level reached.

A patch is "validated" only when every check ran and passed. A check that fails makes it "rejected"
(with the reason); a patch whose checks were not asked for, not allowed or not available says
"unvalidated" and why. One `Pipeline` per process: the kb index is loaded once, on first use.

A code model plugs in by providing `xlaport.model.proposer.load_proposer() -> Proposer | None`.
"""

from __future__ import annotations

import ast
import difflib
import shlex
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field
from xlaport.kb import Finding, Rule, SourceError, all_rules, fix_source, get_rule, lint_source, select_rules
from xlaport.kb.docs import entry_dict, render_markdown
from xlaport.kb.retrieval import FixHit, FixIndex, finding_query

RULES_ONLY = "rules-only: no code model configured"
MODULE_LEVEL = "<module>"
SNIPPET_NAME = "snippet.py"
Status = Literal["validated", "rejected", "unvalidated"]


# --- typed results ----------------------------------------------------------------------------------
class FindingOut(BaseModel):
    path: str
    line: int
    column: int
    code: str
    category: str
    title: str
    message: str
    fix: str
    fixable: bool

    @classmethod
    def of(cls, finding: Finding) -> FindingOut:
        return cls(**finding.to_dict())


class ManualItem(BaseModel):
    """A finding no rule (and no model) fixed, with the kb entries that fit it best."""

    finding: FindingOut
    function: str = Field(description="Qualified name of the enclosing function, or <module>.")
    retrieved: list[FixHit]


class Proposal(BaseModel):
    """A code model's rewrite of one function."""

    function_name: str
    source: str = Field(description="The whole file, with the function rewritten.")
    rationale: str = ""
    model: str = ""


@runtime_checkable
class Proposer(Protocol):
    """What the code model implements. `retrieved` holds FixHit dicts for the function's findings."""

    name: str

    def propose(
        self, source: str, function_name: str, findings: list[Finding], retrieved: list[dict]
    ) -> Proposal | None: ...


class CheckRun(BaseModel):
    """One validation step and what it found."""

    name: Literal["xla_check", "generated_tests"]
    passed: bool | None = Field(description="None: the check could not run (tool missing, nothing to test).")
    level: str | None = None
    reasons: list[str] = []
    report: dict[str, Any] = {}


class Evidence(BaseModel):
    codes_applied: list[str]
    codes_left: list[str]
    rewritten_functions: list[str] = Field([], description="Functions the code model rewrote.")
    checks: list[CheckRun] = []
    level: str | None = None
    validated: bool = False
    status: Status = "unvalidated"
    reason: str | None = Field(None, description="Why the patch is rejected or unvalidated.")


class Patch(BaseModel):
    path: str
    changed: bool
    diff: str
    migrated: str
    applied: list[FindingOut]
    manual: list[ManualItem]
    evidence: Evidence
    notes: list[str] = []


class SuggestOptions(BaseModel):
    unsafe_fixes: bool = Field(False, description="Also apply fixes that may change behaviour.")
    select: list[str] | None = Field(None, description="Codes, prefixes or categories (C1..C7) to use.")
    ignore: list[str] | None = Field(None, description="Codes, prefixes or categories to skip.")
    k: int = Field(3, ge=0, le=20, description="Fixes retrieved per finding left for a human.")
    validate_patch: bool = Field(False, description="Run the XLA execution check and generated tests.")
    args: list[str] = Field([], description="Arguments of the script for the execution check.")
    timeout_s: float = Field(300.0, gt=0, le=3600)
    memory_mb: int = Field(4096, ge=256, le=65536)


class MigrateOptions(BaseModel):
    unsafe_fixes: bool = False
    select: list[str] | None = None
    ignore: list[str] | None = None
    k: int = Field(3, ge=0, le=20)
    jobs: int = Field(1, ge=1, le=64)
    validate_cmd: str | None = Field(None, description='Entry command in the migrated tree, e.g. "python train.py --steps 20".')
    in_place: bool = False
    force: bool = False
    timeout_s: float = Field(600.0, gt=0, le=7200)
    memory_mb: int = Field(8192, ge=256, le=131072)


class CheckOutcome(BaseModel):
    script: str
    check: CheckRun


class FixEntry(BaseModel):
    entry: dict[str, Any]
    markdown: str


# --- helpers ------------------------------------------------------------------------------------------
def unified_diff(original: str, migrated: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True), migrated.splitlines(keepends=True), f"a/{path}", f"b/{path}"
        )
    )


def function_spans(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line incl. decorators, last line) of every function and method."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    spans: list[tuple[str, int, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    spans.append((name, first, child.end_lineno or child.lineno))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return spans


def enclosing_function(spans: list[tuple[str, int, int]], line: int) -> str:
    inside = [(end - start, name) for name, start, end in spans if start <= line <= end]
    return min(inside)[1] if inside else MODULE_LEVEL


def function_sources(source: str) -> dict[str, str]:
    lines = source.splitlines(keepends=True)
    return {name: "".join(lines[start - 1 : end]) for name, start, end in function_spans(source)}


def parse_command(command: str) -> tuple[str, list[str]]:
    """`python train.py --steps 20` -> ("train.py", ["--steps", "20"]); the interpreter word is optional."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"cannot parse the command {command!r}: {exc}") from None
    if words and Path(words[0]).name.startswith("python") and not words[0].endswith(".py"):
        words = words[1:]
    if not words or words[0].startswith("-"):
        raise ValueError(f"the command must name a Python script, e.g. 'python train.py --steps 20': {command!r}")
    return words[0], words[1:]


def verdict(checks: list[CheckRun]) -> tuple[Status, str | None, str | None]:
    """(status, reason, level) of a list of check runs."""
    if not checks:
        return "unvalidated", "validation was not requested", None
    failed = [c for c in checks if c.passed is False]
    if failed:
        reasons = "; ".join(f"{c.name}: {', '.join(c.reasons) or 'failed'}" for c in failed)
        return "rejected", reasons, _level(checks)
    missing = [c for c in checks if c.passed is None]
    if missing:
        reasons = "; ".join(f"{c.name}: {', '.join(c.reasons) or 'did not run'}" for c in missing)
        return "unvalidated", reasons, _level(checks)
    return "validated", None, _level(checks)


def _level(checks: list[CheckRun]) -> str | None:
    return next((c.level for c in checks if c.name == "xla_check" and c.level), None)


# --- validation: thin adapters over xlaport.eval ----------------------------------------------------------
def run_xla_check(
    script: Path, args: list[str], timeout_s: float, memory_mb: int, workdir: Path | None = None
) -> CheckRun:
    """The execution check on `script` (in a sandboxed child, by xlaport.eval.check): passed means L2.
    `workdir`: the directory the command runs from (a project reading files by relative path needs it)."""
    from xlaport.eval.check import run_check

    report = run_check(script, args, timeout_s=timeout_s, memory_mb=memory_mb, workdir=workdir)
    return CheckRun(
        name="xla_check", passed=report.ok, level=report.level, reasons=list(report.reasons), report=report.to_dict()
    )


def run_generated_tests(
    original: Path, migrated: Path, out: Path, record: str | None = None, timeout_s: float = 600.0
) -> CheckRun:
    """Differential tests generated from the original, run against the migration (xlaport.eval.testgen).

    `passed` is None when no test could be generated (nothing drivable changed): no evidence either way.
    """
    from xlaport.eval import testgen

    try:
        # every public function and module of a changed file: a change also affects what calls into it
        generated = testgen.generate_tests(original, migrated, out, record=record, changed_files=True)
    except testgen.TestgenError as exc:
        return CheckRun(name="generated_tests", passed=None, reasons=[f"no tests generated: {exc}"])
    if not generated.tests:
        why = generated.notes + [f"{u.source}:{u.target}: {u.reason}" for u in generated.undrivable]
        return CheckRun(
            name="generated_tests",
            passed=None,
            reasons=["no test could be generated" + (f" ({'; '.join(why[:3])})" if why else "")],
            report={"generated": generated.to_dict()},
        )
    run = testgen.run_generated_tests(out, timeout_s=timeout_s)
    reasons = [f"{f.test}: {_first_lines(f.message)}" for f in run.failures]
    if run.timed_out:
        reasons.append(f"the generated tests timed out after {run.wall_s:.0f} s")
    elif not run.ok and not reasons:
        reasons.append(f"pytest exited with code {run.returncode}")
    reasons = reasons[:10] + [
        f"{run.passed} of {len(generated.tests)} generated test(s) passed; kept in {out} "
        f"(README.md there lists them and what was not tested; run them again with `pytest {out}`)"
    ]
    return CheckRun(
        name="generated_tests",
        passed=run.ok,
        level=None,
        reasons=reasons,
        report={"generated": generated.to_dict(), "run": run.to_dict()},
    )


def _first_lines(message: str, lines: int = 2, limit: int = 400) -> str:
    """The head of a failure message (what differed, and how), on one line."""
    head = " / ".join(line.strip() for line in message.strip().splitlines()[:lines] if line.strip())
    return (head[: limit - 1] + "…" if len(head) > limit else head) or "failed"


# --- the pipeline -----------------------------------------------------------------------------------------
def load_default_proposer() -> Proposer | None:
    """The code model, when xlaport.model provides one and has a trained adapter; else None."""
    try:
        from xlaport.model.proposer import load_proposer  # type: ignore[import-not-found]
    except ImportError:
        return None
    return load_proposer()


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
        """Loads the index and the embedding model now rather than on the first request."""
        self.index.search("warm up", 1)

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
        self, source: str, path: str | None = None, options: SuggestOptions | None = None, *, may_execute: bool = True
    ) -> Patch:
        """A patch for one file's text. Raises SourceError (unparsable) or ValueError (bad options)."""
        options = options or SuggestOptions()
        name = path or SNIPPET_NAME
        rules = self.rules(options.select, options.ignore)
        compile_or_raise(source, name)
        fixed = fix_source(source, name, rules, unsafe=options.unsafe_fixes)
        migrated, manual, proposals, notes = self.finish_file(
            fixed.fixed, name, fixed.remaining, rules, options.k
        )
        evidence = Evidence(
            codes_applied=[f.code for f in fixed.applied],
            codes_left=[m.finding.code for m in manual],
            rewritten_functions=[p.function_name for p in proposals],
        )
        if migrated == source:
            evidence.reason = "nothing to validate: no changes"
        elif not options.validate_patch:
            evidence.reason = "validation was not requested"
        elif not may_execute:
            evidence.reason = "validation not allowed: running submitted code needs the server's token"
        else:
            evidence = self.validate_file(source, migrated, name, options, evidence)
        return Patch(
            path=name,
            changed=migrated != source,
            diff=unified_diff(source, migrated, name),
            migrated=migrated,
            applied=[FindingOut.of(f) for f in fixed.applied],
            manual=manual,
            evidence=evidence,
            notes=notes,
        )

    def rules(self, select: list[str] | None = None, ignore: list[str] | None = None) -> list[type[Rule]]:
        try:
            return select_rules(select, ignore)
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
        lines = source.splitlines()
        queries = [finding_query(f, lines[f.line - 1] if 0 < f.line <= len(lines) else "") for f in findings]
        unique = list(dict.fromkeys(queries))
        hits = dict(zip(unique, self.index.search_many(unique, k), strict=True)) if k > 0 else {}
        spans = function_spans(source)
        return [
            ManualItem(finding=FindingOut.of(f), function=enclosing_function(spans, f.line), retrieved=hits.get(q, []))
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
            findings = [Finding(**item.finding.model_dump()) for item in items]
            retrieved = [hit.model_dump() for item in items for hit in item.retrieved]
            try:
                proposal = self.proposer.propose(source, function, findings, retrieved)
            except Exception as exc:  # a model failure must not lose the rules' work
                notes.append(f"{function}: no proposal from the code model ({type(exc).__name__}: {exc})")
                continue
            if proposal is None:
                continue
            try:
                compile_or_raise(proposal.source, path)
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
        self, original: str, migrated: str, name: str, options: SuggestOptions, evidence: Evidence
    ) -> Evidence:
        """Runs the checks on a temporary copy of both versions and fills in the verdict."""
        file_name = Path(name).name if name.endswith(".py") else SNIPPET_NAME
        with tempfile.TemporaryDirectory(prefix="xlaport-validate-") as tmp:
            original_path = Path(tmp, "original", file_name)
            migrated_path = Path(tmp, "migrated", file_name)
            for target, text in ((original_path, original), (migrated_path, migrated)):
                target.parent.mkdir(parents=True)
                target.write_text(text, encoding="utf-8")
            checks = [
                run_xla_check(migrated_path, options.args, options.timeout_s, options.memory_mb),
                run_generated_tests(original_path, migrated_path, Path(tmp, "tests")),
            ]
        return with_verdict(evidence, checks)

    # -- running code ------------------------------------------------------------------------------------
    def check(
        self,
        source: str | None = None,
        path: Path | None = None,
        args: list[str] | None = None,
        timeout_s: float = 300.0,
        memory_mb: int = 4096,
    ) -> CheckOutcome:
        """The XLA execution check of a script given as text or as a path."""
        if (source is None) == (path is None):
            raise ValueError("give either the script's source or its path")
        if path is not None:
            if not path.is_file():
                raise ValueError(f"no such script: {path}")
            return CheckOutcome(script=str(path), check=run_xla_check(path, args or [], timeout_s, memory_mb))
        compile_or_raise(source, SNIPPET_NAME)
        with tempfile.TemporaryDirectory(prefix="xlaport-check-") as tmp:
            script = Path(tmp, "script.py")
            script.write_text(source, encoding="utf-8")
            return CheckOutcome(script="script.py", check=run_xla_check(script, args or [], timeout_s, memory_mb))

    # -- a whole tree ------------------------------------------------------------------------------------
    def migrate(
        self,
        src: Path,
        dst: Path | None,
        options: MigrateOptions | None = None,
        progress: Callable[[str], None] | None = None,
        *,
        may_execute: bool = True,
    ):
        """Migrates a tree (see serve/bulk.py); returns a bulk.MigrationResult and writes its reports."""
        from .bulk import migrate_with_pipeline

        return migrate_with_pipeline(self, src, dst, options or MigrateOptions(), progress, may_execute=may_execute)


def with_verdict(evidence: Evidence, checks: list[CheckRun]) -> Evidence:
    status, reason, level = verdict(checks)
    return evidence.model_copy(
        update={"checks": checks, "status": status, "reason": reason, "level": level, "validated": status == "validated"}
    )


def compile_or_raise(source: str, name: str) -> None:
    """Raises SourceError when `source` is not valid Python.

    CPython's own compiler goes first: it refuses pathological nesting (a few thousand brackets or
    operators) with an error, where libcst's native parser crashes the whole process.
    """
    try:
        compile(source, name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise SourceError(f"cannot parse: {exc.msg} (line {exc.lineno})") from None
    except (RecursionError, MemoryError):
        raise SourceError("cannot parse: the source is nested too deeply") from None
    except ValueError as exc:  # e.g. NUL bytes
        raise SourceError(f"cannot parse: {exc}") from None


_DEFAULT: Pipeline | None = None
_DEFAULT_LOCK = threading.Lock()


def get_pipeline() -> Pipeline:
    """The process-wide pipeline (index loaded once, code model if one is available)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Pipeline(proposer=load_default_proposer())
        return _DEFAULT


def elapsed(start: float) -> float:
    return round(time.perf_counter() - start, 3)
