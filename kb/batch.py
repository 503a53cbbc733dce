"""Lint and fix whole files (Python, and config files by their suffix): reading errors become results, never
exceptions or silent skips."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from xlaport.files import UnreadableSource, read_source

from .analysis.context import StepContextRule
from .analysis.project import ModuleSteps, ProjectSteps, module_name
from .analysis.steps import module_steps
from .configs import config_kind, fix_config, lint_config
from .engine import SourceError, fix_source, lint_source, parse, run_rules
from .rule import Finding, Rule


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


MAX_PROJECT_ROUNDS = 4  # a stepping helper calling another module's stepping helper: one round per link


def summarize_project(root: Path, rels: list[Path]) -> ProjectSteps:
    """Which of the tree's callables step once per call (analysis/project.py), from its Python files under
    `root`. Files that cannot be read or parsed are left out (their own migration reports them). A helper
    that calls another module's stepping helper steps too: rounds repeat until nothing new is found."""
    modules: dict[Path, cst.Module] = {}
    for rel in rels:
        source, error = _read(root / rel)
        if error:
            continue
        try:
            modules[rel] = parse(source)
        except SourceError:  # a file xlaport cannot analyse exports nothing
            continue
    project = ProjectSteps(modules=frozenset(module_name(rel) for rel in rels))
    summaries: dict[Path, ModuleSteps] = {}
    for _ in range(MAX_PROJECT_ROUNDS):
        for rel, module in modules.items():
            visitor = _Summary()
            run_rules(module, [visitor], project, str(rel))
            summaries[rel] = module_steps(visitor)
        found = ProjectSteps.combine(list(summaries.values()))
        found = ProjectSteps(project.modules, found.steppers, found.param_classes)
        if found == project:
            break
        project = found
    return project


class _Summary(StepContextRule):
    """A rule with no visits: the analysis context `module_steps` reads."""

    code = "summary"
