"""Lint and fix whole files (Python, and config files by their suffix): reading errors become results, never
exceptions or silent skips. Trees are analysed as one project (`run_files`): the tree summary
(analysis/project.py) first, then each file's lint or fix, in worker processes when asked for, each file parsed
once for both."""

from __future__ import annotations

import gc
import multiprocessing
import os
import re
import signal
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from pathlib import Path

from xlaport.files import UnreadableSource, read_source

from .analysis.devices import DeviceAnalysis
from .analysis.devices import analysed as analysed_devices
from .analysis.devices import remember as remember_devices
from .analysis.module import ModuleAnalysis
from .analysis.project import passes, star_exports, star_torch_imports
from .analysis.project_steps import UNKNOWN, ModuleSteps, ProjectSteps, module_name
from .analysis.steps import module_steps
from .configs import config_kind, fix_config, lint_config
from .engine import fix_source, lint_source, run_rules, without_cycle_collection
from .finding import Finding
from .parsing import SourceError, max_source_bytes, parse_both
from .registry import get_rule
from .rule import Rule
from .step_rule import StepContextRule
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
        return read_source(path, max_source_bytes()), None
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
    path: Path,
    rules: list[type[Rule]] | None = None,
    display: str | None = None,
    project: ProjectSteps | None = None,
    *,
    source: str | None = None,
    analysis: ModuleAnalysis | None = None,
    edits: bool = False,
) -> FileResult:
    """`project`: the tree `path` is part of, where `display` is its path from the tree's root. `source` (its text,
    read here when not given) and `analysis` (of that text, by the tree summary) spare a read and a parse.
    `edits`: each fixable finding of a Python file carries its fix as text replacements."""
    name = display or str(path)
    if source is None:
        source, error = _read(path)
        if error:
            return FileResult(name, error=error)
    if is_pin_file(path) and LibraryPinPredatesTpu.code in (_codes(rules) or ()):  # only the torch_tpu target has it
        found = lint_config(source, name, _codes(rules), edits) if config_kind(path) else []
        return FileResult(name, findings=found + lint_pins(source, name), source=source)
    if config_kind(path):
        return FileResult(name, findings=lint_config(source, name, _codes(rules), edits), source=source)
    try:
        found = lint_source(source, name, rules, project, analysis, edits=edits)
        return FileResult(name, findings=found, source=source)
    except Exception as exc:  # one bad file never stops a run
        return FileResult(name, source=source, error=_analysis_error(name, exc))


def fix_file(
    path: Path,
    rules: list[type[Rule]] | None = None,
    unsafe: bool = False,
    display: str | None = None,
    project: ProjectSteps | None = None,
    *,
    source: str | None = None,
    analysis: ModuleAnalysis | None = None,
) -> FileResult:
    """Computes the fixed text of `path`; writes nothing. `project`: the tree `path` is part of, where
    `display` is its path from the tree's root; `source` and `analysis` as in `lint_file`."""
    name = display or str(path)
    if source is None:
        source, error = _read(path)
        if error:
            return FileResult(name, error=error)
    try:
        if config_kind(path):
            result = fix_config(source, name, _codes(rules))
        else:
            result = fix_source(source, name, rules, unsafe=unsafe, project=project, analysis=analysis)
    except Exception as exc:  # one bad file never stops a run
        return FileResult(name, source=source, error=_analysis_error(name, exc))
    return FileResult(name, findings=result.remaining, applied=result.applied, source=source, fixed=result.fixed)


def _codes(rules: list[type[Rule]] | None) -> set[str] | None:
    return None if rules is None else {r.code for r in rules}


# --- trees: what the caller asks for ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Tree:
    """Python files analysed as one project: `rels` under `root`; `named_from`: the files are linted as
    `named_from / rel` (`xlaport lint DIR` names them `DIR/...`), default as `rel`."""

    root: Path
    rels: tuple[Path, ...]
    named_from: Path | None = None


@dataclass(frozen=True)
class FileJob:
    """One file to lint or fix: `tree` is the index of its Tree (where it is `rel`), None for a file analysed
    alone (a file named on the command line, a config file)."""

    path: Path
    display: str
    tree: int | None = None
    rel: Path | None = None


@dataclass(frozen=True)
class TreeTask:
    """What is done to each file once its tree is summarized: a lint, or a fix (the fixed text; nothing is written)."""

    fix: bool = False
    codes: tuple[str, ...] | None = None  # None: every rule
    unsafe: bool = False
    keep_source: bool = True  # FileResult.source filled in (a lint's caller may not need the text back)
    edits: bool = False  # a lint's fixable findings carry their fix as text replacements (JSON, SARIF)
    # (a file's path as its FileJob has it, codes turned off there): `per-file-ignores` (kb/lint_config.py)
    ignored: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def rules(self) -> list[type[Rule]] | None:
        return None if self.codes is None else [get_rule(c) for c in self.codes]

    def codes_for(self, path: str) -> tuple[str, ...] | None:
        """The codes to run on the file at `path`: `codes` less what per-file-ignores turns off there."""
        off = dict(self.ignored).get(path)
        if not off:
            return self.codes
        if self.codes is None:
            raise ValueError("per-file ignores need the codes to run (TreeTask.codes)")
        return tuple(c for c in self.codes if c not in off)


Progress = Callable[[int, int, str], None]  # (files done, files in all, the file just done)
MIN_FILES_FOR_PROCESSES = 8  # smaller runs take about as long as starting the workers


def auto_jobs(files: int, most: int | None = None) -> int:
    """Worker processes for `files` files when none were asked for: one per core (at most `most`), for runs big
    enough to repay starting them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, most or cores) if files >= MIN_FILES_FOR_PROCESSES else 1


def run_files(
    files: list[FileJob],
    trees: list[Tree],
    task: TreeTask,
    jobs: int = 1,
    context: multiprocessing.context.BaseContext | None = None,
    progress: Progress | None = None,
) -> list[FileResult]:
    """Lints or fixes `files` (results in their order): the summary of each tree first, then every file with its
    tree's summary. With `jobs` > 1, worker processes of `context` (default: fork where there is one) do the
    per-file work; each keeps the modules it parsed for the summary, and lints or fixes them without a second
    parse. Same results as `jobs` = 1."""
    with without_cycle_collection(), _executor(jobs, context) as executor:
        projects = _summarize(trees, executor)
        items = [
            _Item(_key(job), str(job.path), job.display, job.tree if job.tree is not None and job.rel else None)
            for job in files
        ]
        results: dict[tuple, FileResult] = {}

        def done(key: tuple, result: FileResult) -> None:
            results[key] = result
            if progress:
                progress(len(results), len(items), result.path)

        found = executor.map("run", _largest_first(items), projects, task, done)
        return [found[item.key] for item in items]


def summarize_project(root: Path, rels: list[Path], named_from: Path | None = None) -> ProjectSteps:
    """Which of the tree's callables step once per call (analysis/project.py), from its Python files under
    `root`. Files that cannot be read or parsed are left out (their own migration reports them).
    `named_from`: the files will be analysed as `named_from / rel` (default: as `rel`)."""
    with without_cycle_collection():
        return _summarize([Tree(root, tuple(rels), named_from)], _Local())[0]


def _key(job: FileJob) -> tuple:
    return (job.tree, str(job.rel)) if job.tree is not None and job.rel is not None else (None, str(job.path))


# --- the tree summary -------------------------------------------------------------------------------------------
CLASS_DEF = re.compile(r"^[ \t]*class[ \t]+(\w+)", re.MULTILINE)
# every function definition's name (and a few words of strings): `def` after a character that is not a word's
# (tested on each match: a pattern that starts with `\b` is tried at every position of the text, ~15x slower)
DEF = re.compile(r"def[\s\\]+(\w+)")
WORD = re.compile(r"\w+")
MAX_PROJECT_ROUNDS = 4  # a stepping helper calling another module's stepping helper: one round per link


@dataclass
class _Plan:
    """What the summary knows of a tree from its text alone."""

    tree: Tree
    texts: dict[Path, str]  # the readable files
    classes: frozenset[str]
    start: ProjectSteps


def _plan(tree: Tree) -> _Plan:
    """Name resolution is the cost of the summary (about a lint of the module); it is paid once per module, and
    shared with the lint or fix that follows. Only modules whose text can matter pass their arguments to the
    tree's functions: a module that names a class defined next to a step or backward (it may pass an instance
    of it), or one of the functions whose parameters that fixes."""
    texts = {rel: text for rel in tree.rels if (text := _read(tree.root / rel)[0]) is not None}
    may_step = [text for text in texts.values() if "step" in text or "backward" in text]
    classes = frozenset(name for text in may_step for name in CLASS_DEF.findall(text))
    sources = {module_name(rel): text for rel, text in texts.items()}
    exports = star_exports(sources)
    defined = frozenset(name for text in texts.values() for name in _defined(text))
    start = ProjectSteps(
        modules=frozenset(module_name(rel) for rel in tree.rels),
        exports=exports,
        star_torch=star_torch_imports(sources),
        defined=defined,
    )
    return _Plan(tree, texts, classes, start)


def _defined(text: str) -> Iterable[str]:
    for match in DEF.finditer(text):
        start = match.start()
        if not start or not (text[start - 1].isalnum() or text[start - 1] == "_"):
            yield match.group(1)


def _summarize(trees: list[Tree], executor: _Executor) -> dict[int, ProjectSteps]:
    """The summary of each tree: every module analysed once (in one batch for all trees, so that every worker
    is busy), then the rounds that follow what the first found, tree by tree (few modules each)."""
    plans = [_plan(tree) for tree in trees]
    items = [
        _Item((index, str(rel)), str(plan.tree.root / rel), str(rel), index)
        for index, plan in enumerate(plans)
        for rel in plan.texts
    ]
    starts = {index: plan.start for index, plan in enumerate(plans)}
    first = executor.map("first", _largest_first(items), starts, {i: p.classes for i, p in enumerate(plans)})
    return {index: _rounds(plan, index, first, executor) for index, plan in enumerate(plans)}


def _rounds(plan: _Plan, index: int, first: dict[tuple, tuple], executor: _Executor) -> ProjectSteps:
    """From the modules' first summaries to the tree's: a helper that calls another module's stepping callable
    steps too, so the next rounds analyse again the modules that name a callable found in the round before,
    until nothing is new."""
    tokens: dict[Path, frozenset[str]] = {}
    summaries: dict[Path, ModuleSteps] = {}
    linked: set[Path] = set()
    for rel in sorted(plan.texts):
        words, found, links = first[(index, str(rel))]
        tokens[rel] = words if words is not None else frozenset(WORD.findall(plan.texts[rel]))
        if found is not None:
            summaries[rel] = found
            if links:
                linked.add(rel)
    project = plan.start
    todo: set[Path] = set()
    for round_ in range(MAX_PROJECT_ROUNDS):
        if round_:
            wanted = {rel: rel not in summaries and not plan.classes.isdisjoint(tokens[rel]) for rel in sorted(todo)}
            items = [
                _Item((index, str(rel)), str(plan.tree.root / rel), str(rel), index, links)
                for rel, links in wanted.items()
            ]
            again = executor.map("steps", items, {index: project})
            for rel, links in wanted.items():
                found = again[(index, str(rel))]
                if found is None:  # cannot be analysed: exports nothing
                    summaries.pop(rel, None)
                    continue
                if links:
                    linked.add(rel)
                if rel in summaries:
                    old = summaries[rel]
                    found = replace(
                        found,
                        signatures=old.signatures,
                        passes=old.passes,
                        gates=old.gates,
                        flag_passes=old.flag_passes,
                    )
                summaries[rel] = found
        unread = _link_all_callers(plan, index, summaries, linked, tokens, executor, project)
        combined = ProjectSteps.combine(list(summaries.values()))
        bound = frozenset(b for b in combined.param_classes if b[0].rsplit(".", 1)[-1] not in unread)
        found_project = ProjectSteps(
            project.modules,
            combined.steppers,
            bound,
            exports=plan.start.exports,
            star_torch=plan.start.star_torch,
            per_step=combined.per_step,
            called=combined.called,
            looped_names=combined.looped_names,
            sparse_returns=combined.sparse_returns,
            defined=plan.start.defined,
            device_flags=combined.device_flags,
        )
        if found_project == project:
            break
        words = {part for name in found_project.steppers - project.steppers for part in name.split(".")[-2:]}
        words.discard("__call__")
        stepping = {
            f
            for f, _, klass in found_project.param_classes
            if any(s.startswith(klass + ".") for s in found_project.steppers)
        }
        todo = {
            rel
            for rel in tokens
            if _names_any(words, tokens[rel], plan.texts[rel])
            or any(f.startswith(module_name(rel) + ".") for f in stepping)
            # a function newly known to run every step: what it calls runs every step too
            or any(f.startswith(module_name(rel) + ".") for f in found_project.per_step - project.per_step)
        }
        project = found_project
    if plan.tree.named_from is not None:
        named_from = plan.tree.named_from
        project = replace(project, paths=frozenset((str(named_from / rel), module_name(rel)) for rel in plan.tree.rels))
    return project


def _names_any(names: Iterable[str], tokens: frozenset[str], text: str) -> set[str]:
    """The `names` that the text names as a whole word: a look-up in its words (a name that is not one word,
    such as a module file named with a dash, is searched for in the text)."""
    return {n for n in names if (n in tokens if WORD.fullmatch(n) else re.search(rf"\b{re.escape(n)}\b", text))}


def _link_all_callers(
    plan: _Plan,
    index: int,
    summaries: dict[Path, ModuleSteps],
    linked: set[Path],
    tokens: dict[Path, frozenset[str]],
    executor: _Executor,
    project: ProjectSteps,
) -> set[str]:
    """A parameter's class is certain only when every caller of its function was read: read what each module
    that names such a function passes (once). Returns the names of the functions named by a module that
    could not be read: their parameters stay unknown."""
    functions = {f.rsplit(".", 1)[-1] for s in summaries.values() for f, _, k in s.passes if k != UNKNOWN}
    unread: set[str] = set()
    wanted: dict[Path, set[str]] = {}
    for rel in tokens:
        if rel in linked:
            continue
        named = _names_any(functions, tokens[rel], plan.texts[rel])
        if not named:
            continue
        if rel not in summaries:
            unread |= named
        else:
            wanted[rel] = named
    items = [_Item((index, str(rel)), str(plan.tree.root / rel), str(rel), index) for rel in wanted]
    read = executor.map("passes", items, {index: project})
    for rel, named in wanted.items():
        found = read[(index, str(rel))]
        if found is None:
            unread |= named
            continue
        summaries[rel] = replace(summaries[rel], passes=found)
        linked.add(rel)
    return unread


class _Summary(StepContextRule):
    """A rule with no visits: the analysis context `module_steps` reads."""

    code = "summary"


# --- the modules of one process ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Item:
    """One file's part of a step: `key` (tree index, rel) names it in every process; `name` is its path from its
    tree's root (summary steps) or as reported (run); `arg` the step's argument."""

    key: tuple
    path: str
    name: str
    tree: int | None = None
    arg: object = None


KEEP_SOURCE_CHARS = 8_000_000  # text whose analyses one process keeps between the steps (~65 bytes each: ~500 MB)
_FAILED = None  # a module that cannot be analysed


class _Store:
    """The modules this process analysed, kept (within KEEP_SOURCE_CHARS of text) from the summary's first step
    to the lint or fix of each, which drops them."""

    def __init__(self) -> None:
        self.modules: dict[tuple, _Summary | None] = {}
        self.texts: dict[tuple, str] = {}
        self.kept = 0
        self.rules: dict[tuple[str, ...] | None, list[type[Rule]] | None] = {}
        # each kept module's device analysis (devices.py), made by its summary: its lint would build it again
        # (devices.py holds the last few modules' only)
        self.devices: dict[tuple, DeviceAnalysis] = {}

    def do(self, step: str, item: _Item, projects: dict[int, ProjectSteps], extra: object) -> object:
        """`extra`: the task of a run; the classes named next to a step, by tree, in the first step."""
        project = projects.get(item.tree) if item.tree is not None else None
        if step == "run":
            return self.run(item, project, extra)
        if step == "first":
            found = self.first(item, project, extra[item.tree])
        elif step == "steps":
            found = self.steps(item, project)
        else:
            found = self.passes(item, project)
        visitor = self.modules.get(item.key)
        if visitor is not None and (devices := analysed_devices(visitor.analysis.module)) is not None:
            self.devices[item.key] = devices
        return found

    def first(
        self, item: _Item, project: ProjectSteps, classes: frozenset[str]
    ) -> tuple[frozenset[str] | None, ModuleSteps | None, bool]:
        """(the words of the text, the module's first summary, whether it includes what it passes: it names one
        of `classes`)."""
        text = self._text(item)
        if text is None:
            return None, None, False
        words = frozenset(WORD.findall(text))
        links = not classes.isdisjoint(words)
        visitor = self._visitor(item, project)
        if visitor is None:
            return words, None, False
        try:
            return words, module_steps(visitor, with_passes=links), links
        except Exception:  # noqa: BLE001  (one module the analysis fails on exports nothing; its own fix reports it)
            self._fail(item)
            return words, None, False

    def steps(self, item: _Item, project: ProjectSteps) -> ModuleSteps | None:
        visitor = self._visitor(item, project)
        if visitor is None:
            return None
        visitor.analysis.project = project
        try:
            return module_steps(visitor, with_passes=bool(item.arg))
        except Exception:  # noqa: BLE001  (as in `first`)
            self._fail(item)
            return None

    def passes(self, item: _Item, project: ProjectSteps) -> tuple | None:
        visitor = self._visitor(item, project)
        if visitor is None:
            return None
        try:
            return passes(visitor)
        except Exception:  # noqa: BLE001  (as in `first`)
            return None

    def run(self, item: _Item, project: ProjectSteps | None, task: TreeTask) -> FileResult:
        """The file's lint or fix; its analysis (when this process kept it) is used and dropped."""
        visitor = self.modules.pop(item.key, _FAILED)
        text = self.texts.pop(item.key, None)
        if text is not None:
            self.kept -= len(text)
        devices = self.devices.pop(item.key, None)
        if visitor is not None and devices is not None:
            remember_devices(visitor.analysis.module, devices)
        codes = task.codes_for(item.path)
        if codes not in self.rules:
            self.rules[codes] = None if codes is None else [get_rule(c) for c in codes]
        rules = self.rules[codes]
        analysis = visitor.analysis if visitor is not None else None
        source = text if analysis is not None else None
        path = Path(item.path)
        if task.fix:
            result = fix_file(path, rules, task.unsafe, item.name, project, source=source, analysis=analysis)
        else:
            result = lint_file(path, rules, item.name, project, source=source, analysis=analysis, edits=task.edits)
        if not task.keep_source:
            result.source = None
        return result

    def _text(self, item: _Item) -> str | None:
        if item.key not in self.texts:
            return _read(Path(item.path))[0]
        return self.texts[item.key]

    def _visitor(self, item: _Item, project: ProjectSteps) -> _Summary | None:
        """The analysis of one module (its names stay resolved), made on first use and kept while there is room."""
        if item.key in self.modules:
            return self.modules[item.key]
        text = self._text(item)
        if text is None:
            return None
        visitor = _Summary()
        try:
            module, tree = parse_both(text)
            run_rules(module, [visitor], project, item.name, tree, text)
        except Exception:  # noqa: BLE001  (a file xlaport cannot analyse exports nothing; its lint reports it)
            self._fail(item)
            return None
        if self.kept + len(text) <= KEEP_SOURCE_CHARS:
            self.modules[item.key], self.texts[item.key] = visitor, text
            self.kept += len(text)
        return visitor

    def _fail(self, item: _Item) -> None:
        self.devices.pop(item.key, None)
        text = self.texts.pop(item.key, None)
        if text is not None:
            self.kept -= len(text)
        self.modules[item.key] = _FAILED


# --- running the steps: here, or in worker processes that keep their modules -----------------------------------
Done = Callable[[tuple, object], None]


class _Executor:
    def map(
        self,
        step: str,
        items: list[_Item],
        projects: dict[int, ProjectSteps],
        extra: object = None,
        done: Done | None = None,
    ) -> dict[tuple, object]:
        """Runs `step` (a `_Store` method) on every item: its result by the item's key. `projects`: the tree
        summaries so far, by tree index; `extra`: see `_Store.do`; `done(key, result)` as each one ends."""
        raise NotImplementedError

    def __enter__(self) -> _Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _Local(_Executor):
    def __init__(self) -> None:
        self.store = _Store()

    def map(self, step, items, projects, extra=None, done=None):  # noqa: ANN001, ANN201  (as _Executor.map)
        found = {}
        for item in items:
            found[item.key] = result = self.store.do(step, item, projects, extra)
            if done:
                done(item.key, result)
        return found


def _largest_first(items: list[_Item]) -> list[_Item]:
    """No worker is left with the big files at the end."""
    return sorted(items, key=lambda item: -_size(item.path))


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


DIED = "the analysis process died"
IN_FLIGHT = 2  # steps sent to a worker ahead of its answers: it never waits for the next one


def _worker(conn) -> None:  # noqa: ANN001  (a multiprocessing Connection)
    """A worker's loop: answers each step with its result, keeps its modules between steps."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    gc.disable()  # the kept modules hold no cycles (see engine.without_cycle_collection); the process is short-lived
    store = _Store()
    projects: dict[int, ProjectSteps] = {}
    extra = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        step, payload = message
        if step == "shared":
            projects, extra = payload
            continue
        conn.send((payload.key, store.do(step, payload, projects, extra)))


class _Workers(_Executor):
    """Worker processes, each with its own `_Store`: a module's later steps go to the worker that analysed it.
    A worker that dies (a native crash) takes only the file it was on: that file fails, the others go on in a
    fresh worker."""

    def __init__(self, jobs: int, context: multiprocessing.context.BaseContext) -> None:
        self.context = context
        self.owner: dict[tuple, int] = {}
        self.crashed: set[tuple] = set()
        self.shared: tuple | None = None
        self.workers = [self._start() for _ in range(jobs)]

    def _start(self) -> tuple:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_worker, args=(child,), daemon=True)
        process.start()
        child.close()
        if self.shared is not None:
            parent.send(("shared", self.shared))
        return process, parent

    def map(self, step, items, projects, extra=None, done=None):  # noqa: ANN001, ANN201  (as _Executor.map)
        if not items:
            return {}
        self.shared = (projects, extra)
        for _, conn in self.workers:
            conn.send(("shared", self.shared))
        found: dict[tuple, object] = {}
        own: list[deque[_Item]] = [deque() for _ in self.workers]
        free: deque[_Item] = deque()
        for item in items:
            if item.key in self.crashed:
                found[item.key] = _crashed(step, item)
                continue
            owner = self.owner.get(item.key)
            (own[owner] if owner is not None else free).append(item)
        sent: list[deque[_Item]] = [deque() for _ in self.workers]
        waiting = len(items) - len(found)
        while waiting:
            for index, (_, conn) in enumerate(self.workers):
                while len(sent[index]) < IN_FLIGHT:
                    item = self._next(index, own, free, steal=step == "run")
                    if item is None:
                        break
                    conn.send((step, item))
                    sent[index].append(item)
            busy = {self.workers[i][1]: i for i in range(len(self.workers)) if sent[i]}
            for conn in wait(list(busy)):
                index = busy[conn]
                try:
                    key, result = conn.recv()
                except (EOFError, OSError):
                    item = self._died(index, sent, own, free)
                    if item is not None:
                        found[item.key] = result = _crashed(step, item)
                        waiting -= 1
                        if done:
                            done(item.key, result)
                    continue
                sent[index].popleft()
                if step == "run":
                    self.owner.pop(key, None)
                else:
                    self.owner[key] = index
                found[key] = result
                waiting -= 1
                if done:
                    done(key, result)
        return found

    def _next(self, index: int, own: list[deque[_Item]], free: deque[_Item], steal: bool) -> _Item | None:
        """The worker's own files first, then anyone's; at the end of a run, the last file of the longest queue
        (parsed again here: better than waiting idle)."""
        if own[index]:
            return own[index].popleft()
        if free:
            return free.popleft()
        if steal:
            longest = max(own, key=len)
            if len(longest) > 1:
                return longest.pop()
        return None

    def _died(self, index: int, sent: list[deque[_Item]], own: list[deque[_Item]], free: deque[_Item]) -> _Item | None:
        """Replaces worker `index`; returns the file it died on. Its other files go to any worker."""
        process, conn = self.workers[index]
        conn.close()
        process.join(timeout=5)
        culprit = sent[index].popleft() if sent[index] else None
        if culprit is not None:
            self.crashed.add(culprit.key)
        free.extendleft(reversed([*sent[index], *own[index]]))
        sent[index].clear()
        own[index].clear()
        self.owner = {key: owner for key, owner in self.owner.items() if owner != index}
        self.workers[index] = self._start()
        return culprit

    def __exit__(self, *exc: object) -> None:
        for _, conn in self.workers:
            try:
                conn.send(None)
            except OSError:
                pass
            conn.close()
        for process, _ in self.workers:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()


def _crashed(step: str, item: _Item) -> object:
    if step == "first":
        return None, None, False
    if step == "run":
        return FileResult(item.name, error=f"{item.name}: {DIED}")
    return None


def default_context() -> multiprocessing.context.BaseContext:
    """fork where there is one: the workers start with the kb already imported, in milliseconds."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else methods[0])


def _executor(jobs: int, context: multiprocessing.context.BaseContext | None) -> _Executor:
    return _Workers(jobs, context or default_context()) if jobs > 1 else _Local()
