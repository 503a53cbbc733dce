"""Lint and fix whole files (Python, and config files by their suffix): reading errors become results, never
exceptions or silent skips."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from xlaport.files import UnreadableSource, read_source

from .analysis.context import StepContextRule
from .analysis.project import UNKNOWN, ModuleSteps, ProjectSteps, module_name, passes, star_exports
from .analysis.steps import module_steps
from .configs import config_kind, fix_config, lint_config
from .engine import fix_source, lint_source, run_rules
from .parsing import SourceError, parse_both
from .rule import Finding, Rule
from .tpu_pins import LibraryPinPredatesTpu, is_pin_file, lint_pins


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)  # what is left (after fixing, when fixing)
    applied: list[Finding] = field(default_factory=list)
    source: str | None = None
    fixed: str | None = None
    error: str | None = None  # unreadable or unparsable: the file was not analysed

    @property
    def changed(self) -> bool:
        return self.fixed is not None and self.source is not None and self.fixed != self.source


def _read(path: Path) -> tuple[str | None, str | None]:
    try:
        return read_source(path), None
    except UnreadableSource as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"{path}: cannot read ({exc.strerror})"


def _analysis_error(name: str, exc: Exception) -> str:
    """One file's failure as a message: the run goes on with the other files."""
    if isinstance(exc, SourceError):
        return f"{name}: {exc}"
    if isinstance(exc, RecursionError):
        return f"{name}: cannot parse: nested too deeply to analyse safely"
    return f"{name}: internal error while analysing ({type(exc).__name__}: {exc})"


def lint_file(
    path: Path, rules: list[type[Rule]] | None = None, display: str | None = None, project: ProjectSteps | None = None
) -> FileResult:
    """`project`: the tree `path` is part of, where `display` is its path from the tree's root."""
    name = display or str(path)
    source, error = _read(path)
    if error:
        return FileResult(name, error=error)
    if is_pin_file(path) and LibraryPinPredatesTpu.code in (_codes(rules) or ()):  # only the torch_tpu target has it
        found = lint_config(source, name, _codes(rules)) if config_kind(path) else []
        return FileResult(name, findings=found + lint_pins(source, name), source=source)
    if config_kind(path):
        return FileResult(name, findings=lint_config(source, name, _codes(rules)), source=source)
    try:
        return FileResult(name, findings=lint_source(source, name, rules, project), source=source)
    except Exception as exc:  # one bad file never stops a run
        return FileResult(name, source=source, error=_analysis_error(name, exc))


def fix_file(
    path: Path,
    rules: list[type[Rule]] | None = None,
    unsafe: bool = False,
    display: str | None = None,
    project: ProjectSteps | None = None,
) -> FileResult:
    """Computes the fixed text of `path`; writes nothing. `project`: the tree `path` is part of, where
    `display` is its path from the tree's root."""
    name = display or str(path)
    source, error = _read(path)
    if error:
        return FileResult(name, error=error)
    try:
        if config_kind(path):
            result = fix_config(source, name, _codes(rules))
        else:
            result = fix_source(source, name, rules, unsafe=unsafe, project=project)
    except Exception as exc:  # one bad file never stops a run
        return FileResult(name, source=source, error=_analysis_error(name, exc))
    return FileResult(name, findings=result.remaining, applied=result.applied, source=source, fixed=result.fixed)


def _codes(rules: list[type[Rule]] | None) -> set[str] | None:
    return None if rules is None else {r.code for r in rules}


CLASS_DEF = re.compile(r"^[ \t]*class[ \t]+(\w+)", re.MULTILINE)
MAX_PROJECT_ROUNDS = 4  # a stepping helper calling another module's stepping helper: one round per link


def summarize_project(root: Path, rels: list[Path], named_from: Path | None = None) -> ProjectSteps:
    """Which of the tree's callables step once per call (analysis/project.py), from its Python files under
    `root`. Files that cannot be read or parsed are left out (their own migration reports them).
    `named_from`: the files will be analysed as `named_from / rel` (default: as `rel`).

    Name resolution is the cost (about a lint of the module), so a module is analysed only when its text can
    matter: it names a step or backward (it may define a stepping callable), or a class defined next to one
    (it may pass an instance of it). A helper that calls another module's stepping callable steps too: the
    next rounds analyse the modules that name a callable found in the round before, until nothing is new."""
    sources = {rel: text for rel in rels if (text := _read(root / rel)[0]) is not None}
    may_step = {rel for rel, text in sources.items() if "step" in text or "backward" in text}
    classes = {name for rel in may_step for name in CLASS_DEF.findall(sources[rel])}
    exports = star_exports({module_name(rel): text for rel, text in sources.items()})
    project = ProjectSteps(modules=frozenset(module_name(rel) for rel in rels), exports=exports)
    visitors: dict[Path, _Summary | None] = {}
    summaries: dict[Path, ModuleSteps] = {}
    linked: set[Path] = set()
    todo = set(sources)
    for _ in range(MAX_PROJECT_ROUNDS):
        for rel in sorted(todo):
            visitor = _summary_visitor(visitors, rel, sources[rel], project)
            if visitor is None:
                continue
            first = rel not in summaries
            links = first and any(re.search(rf"\b{name}\b", sources[rel]) for name in classes)
            try:
                found = module_steps(visitor, with_passes=links)
            except Exception:  # noqa: BLE001  (one module the analysis fails on exports nothing; its own fix reports it)
                visitors[rel] = None
                summaries.pop(rel, None)
                continue
            if links:
                linked.add(rel)
            if not first:
                found = ModuleSteps(found.module, found.steppers, summaries[rel].signatures, summaries[rel].passes)
            summaries[rel] = found
        unread = _link_all_callers(summaries, linked, visitors, sources)
        combined = ProjectSteps.combine(list(summaries.values()))
        bound = frozenset(b for b in combined.param_classes if b[0].rsplit(".", 1)[-1] not in unread)
        found = ProjectSteps(project.modules, combined.steppers, bound, exports=exports)
        if found == project:
            break
        words = {part for name in found.steppers - project.steppers for part in name.split(".")[-2:]}
        bound = {f for f, _, klass in found.param_classes if any(s.startswith(klass + ".") for s in found.steppers)}
        todo = {
            rel
            for rel, text in sources.items()
            if any(re.search(rf"\b{re.escape(w)}\b", text) for w in words if w != "__call__")
            or any(f.startswith(module_name(rel) + ".") for f in bound)
        }
        project = found
    if named_from is not None:
        project = replace(project, paths=frozenset((str(named_from / rel), module_name(rel)) for rel in rels))
    return project


def _link_all_callers(
    summaries: dict[Path, ModuleSteps], linked: set[Path], visitors: dict[Path, _Summary | None], sources: dict
) -> set[str]:
    """A parameter's class is certain only when every caller of its function was read: read what each module
    that names such a function passes (once). Returns the names of the functions named by a module that
    could not be read: their parameters stay unknown."""
    functions = {f.rsplit(".", 1)[-1] for s in summaries.values() for f, _, k in s.passes if k != UNKNOWN}
    unread: set[str] = set()
    for rel, text in sources.items():
        named = {name for name in functions if re.search(rf"\b{re.escape(name)}\b", text)}
        if rel in linked or not named:
            continue
        visitor = visitors.get(rel)
        try:
            if visitor is None or rel not in summaries:
                raise ValueError(rel)
            summaries[rel] = replace(summaries[rel], passes=passes(visitor))
        except Exception:  # noqa: BLE001  (as in summarize_project)
            unread |= named
            continue
        linked.add(rel)
    return unread


def _summary_visitor(
    visitors: dict[Path, _Summary | None], rel: Path, source: str, project: ProjectSteps
) -> _Summary | None:
    """The analysis of one module, made once and kept for the next rounds (its names stay resolved)."""
    if rel not in visitors:
        try:
            module, tree = parse_both(source)
        except SourceError:  # a file xlaport cannot analyse exports nothing
            visitors[rel] = None
            return None
        visitor = _Summary()
        try:
            run_rules(module, [visitor], project, str(rel), tree)
        except Exception:  # noqa: BLE001  (as in summarize_project)
            visitors[rel] = None
            return None
        visitors[rel] = visitor
    visitor = visitors[rel]
    if visitor is not None:
        visitor.analysis.project = project
    return visitor


class _Summary(StepContextRule):
    """A rule with no visits: the analysis context `module_steps` reads."""

    code = "summary"
