"""Runs the kb rules over source text: findings (lint) and rewrites (fix)."""

from __future__ import annotations

import ast
import gc
import hashlib
import io
import re
import tokenize
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import libcst as cst
from libcst.metadata import MetadataWrapper

from .analysis.devices import analyse as analyse_devices
from .analysis.devices import cpu_utility, one_cpu_decision, tree_device_flags
from .analysis.module import ModuleAnalysis
from .analysis.project_steps import ProjectSteps
from .codegen import ModuleTexts
from .cst_walk import LAYOUT, parent_map
from .edits import ancestors, removal_marker, replace_nodes
from .finding import Edit, Finding, FixResult
from .flips import (
    CPU_KEPT,
    CPU_KEPT_CODES,
    CPU_UTILITY,
    FALLBACK_CODES,
    FLIP_CODES,
    GUARD_CODES,
    Span,
    blocked_flips,
)
from .flips import message as flip_message
from .imports import add_imports, mark_device_imports, remove_imports_made_unused
from .parsing import parse_both
from .registry import all_rules
from .rule import ImportSpec, Report, Rule
from .splice import OriginalText, splice
from .text_edits import text_edits

SUPPRESSION = re.compile(r"#\s*xlaport:\s*ignore(?:\[(?P<codes>[A-Z0-9,\s]+)\])?")
MAX_FIX_PASSES = 6
FIX_CACHE_SIZE = 64  # fixed texts kept per process, by content hash (the service sees the same file again)


def suppressions(source: str) -> dict[int, set[str] | None]:
    """Line -> suppressed codes (None = all) from `# xlaport: ignore[CODE]` comments."""
    found: dict[int, set[str] | None] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type != tokenize.COMMENT:
                continue
            match = SUPPRESSION.search(tok.string)
            if match:
                codes = match.group("codes")
                found[tok.start[0]] = {c.strip() for c in codes.split(",") if c.strip()} if codes else None
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def _is_suppressed(line: int, code: str, suppressed: dict[int, set[str] | None]) -> bool:
    if line not in suppressed:
        return False
    codes = suppressed[line]
    return codes is None or code in codes


@dataclass
class _Detection:
    rule: type[Rule]
    report: Report
    line: int
    column: int
    end: tuple[int, int]
    start: tuple[int, int]
    reported_end: tuple[int, int] = (0, 0)  # where the reported node ends (`end` is the replaced node's)

    # what the flip audit (flips.py) reads
    @property
    def code(self) -> str:
        return self.rule.code

    @property
    def node(self) -> cst.CSTNode:
        return self.report.node

    @property
    def safe_fix(self) -> bool:
        return self.report.replacement is not None and _applicability(self) == "safe"


def run_rules(
    module: cst.Module,
    visitors: list[Rule],
    project: ProjectSteps | None = None,
    path: str | None = None,
    tree: ast.Module | None = None,
    source: str | None = None,
    analysis: ModuleAnalysis | None = None,
) -> ModuleAnalysis:
    """One batched visit of `module` by every rule instance, sharing one ModuleAnalysis. `project`: the tree
    `module` is part of, where `path` (relative to the tree's root) names it; `tree`: CPython's AST of the same
    source (parsed again from the module when not given); `source`: the module's text; `analysis`: an analysis of
    this same module (with its tree and source) made by an earlier pass, reused: its resolved names are kept."""
    if analysis is None:
        analysis = ModuleAnalysis.of(module, MetadataWrapper(module, unsafe_skip_copy=True), tree, source)
    else:
        analysis.next_pass()
    wrapper = analysis.wrapper
    if project is not None and path is not None:
        analysis.project, analysis.module_name = project, project.module_of(path)
    for visitor in visitors:
        visitor.analysis = analysis
        # Rule.qualified_names, one call shorter: the rules ask it ~50 times for each call of the module
        visitor.qualified_names = analysis.imported_names
    if any(visitor.get_inherited_dependencies() for visitor in visitors):
        wrapper.visit_batched(visitors)  # a rule that declares libcst metadata gets it resolved
    else:
        _visit_batched(analysis, visitors)
    return analysis


def _visit_batched(analysis: ModuleAnalysis, visitors: list[Rule]) -> None:
    """libcst's batched visit (each node's `visit_<Type>` of every rule in order, its children, then its
    `leave_<Type>`), over the module's node list (analysis/module.py's walk) instead of libcst's traversal,
    which rebuilds every node it passes."""
    visits: dict[type, list] = {}
    leaves: dict[type, list] = {}
    for visitor in visitors:
        for is_visit, visited, name in _dispatch(visitor):
            (visits if is_visit else leaves).setdefault(visited, []).append(getattr(visitor, name))
    # (depth, node, its leave methods) of the nodes entered and not left yet that some rule leaves: only those
    # need remembering (a node is left when the walk comes to one that is not deeper)
    entered: list[tuple[int, cst.CSTNode, list]] = []
    for node, depth in zip(*analysis.walked, strict=True):
        while entered and entered[-1][0] >= depth:
            _, done, methods = entered.pop()
            for method in methods:
                method(done)
        kind = type(node)
        for method in visits.get(kind, ()):
            method(node)
        if kind in leaves:
            entered.append((depth, node, leaves[kind]))
    while entered:
        _, done, methods = entered.pop()
        for method in methods:
            method(done)


_DISPATCH: dict[type, tuple[tuple[bool, type, str], ...]] = {}  # rule class -> its visit_/leave_ methods


def _dispatch(visitor: Rule) -> tuple[tuple[bool, type, str], ...]:
    """(a visit or a leave, the node type, the method's name) for each of the visitor's `visit_<Type>` and
    `leave_<Type>` methods, in `get_visitors`' order: worked out once per rule class (which they depend on alone,
    see Rule.get_visitors), not on every pass of every module (an issubclass on libcst's abstract classes each)."""
    found = _DISPATCH.get(type(visitor))
    if found is None:
        entries = []
        for name in visitor.get_visitors():
            kind, _, node_type = name.partition("_")
            if "_" in node_type:
                raise NotImplementedError(f"{type(visitor).__name__}.{name}: attribute visitors are not supported")
            visited = getattr(cst, node_type)
            if issubclass(visited, LAYOUT):
                raise NotImplementedError(f"{type(visitor).__name__}.{name}: layout nodes are not walked")
            entries.append((kind == "visit", visited, name))
        found = _DISPATCH[type(visitor)] = tuple(entries)
    return found


# A string escape that can spell a letter (`"\x63uda"` is "cuda"): then a word a rule needs may be absent from the
# text and present in a string's value.
_LETTER_ESCAPE = re.compile(r"\\[xuUN0-7]")
NEEDS_WORD = re.compile(r"[a-z0-9_-]+")  # what a word of Rule.needs is made of


def may_report(rules: list[type[Rule]], source: str) -> list[type[Rule]]:
    """The rules that can report something in `source`: those whose `needs` it spells (see Rule.needs)."""
    if _LETTER_ESCAPE.search(source):
        return rules
    # every word a rule needs is made of these characters, so it lies inside one run of them: the text's distinct
    # runs (a few thousand characters) are searched instead of the text (test_rule_needs checks the words)
    text = "\x00".join(set(NEEDS_WORD.findall(source.lower())))
    spelled = {word for word in {w for rule in rules for w in rule.needs} if word in text}  # each word looked up once
    return [rule for rule in rules if not rule.needs or not spelled.isdisjoint(rule.needs)]


def _detect(
    module: cst.Module,
    rules: list[type[Rule]],
    source: str,
    project: ProjectSteps | None = None,
    path: str = "",
    tree: ast.Module | None = None,
    analysis: ModuleAnalysis | None = None,
) -> list[_Detection]:
    # a device flag that the tree's other modules use to choose the device flips here (devices.py)
    with tree_device_flags(project.device_flags if project is not None else frozenset()):
        return _detect_in_tree(module, rules, source, project, path, tree, analysis)


def _detect_in_tree(
    module: cst.Module,
    rules: list[type[Rule]],
    source: str,
    project: ProjectSteps | None,
    path: str,
    tree: ast.Module | None,
    analysis: ModuleAnalysis | None,
) -> list[_Detection]:
    chosen = may_report(rules, source)
    implied = _implied_words(project, path, source)
    if implied:  # the tree runs this module's functions every step: its step rules may report here
        chosen += [rule for rule in rules if rule not in chosen and not implied.isdisjoint(rule.needs)]
    visitors = [rule() for rule in chosen]
    analysis = run_rules(module, visitors, project, path, tree, source, analysis)
    if not any(visitor.reports for visitor in visitors):
        return []  # the common case: no positions, no suppression comments to read
    suppressed = suppressions(source) if "xlaport" in source else {}
    positions = analysis.positions()
    dead = [positions[n] for n in analyse_devices(module).facts.dead_regions() if n in positions]
    detections = []
    for visitor in visitors:
        for report in visitor.reports:
            pos = positions[report.node]
            if _is_suppressed(pos.start.line, visitor.code, suppressed) or _inside(pos, dead):
                continue
            span = positions[report.target] if report.target is not None else pos
            detections.append(
                _Detection(
                    type(visitor),
                    report,
                    pos.start.line,
                    pos.start.column + 1,
                    (span.end.line, span.end.column),
                    (span.start.line, span.start.column),
                    (pos.end.line, pos.end.column),
                )
            )
    detections.sort(key=lambda d: (d.line, d.column, d.rule.code))
    return _withhold_blocked_flips(module, detections, positions, dead)


def _withhold_blocked_flips(module: cst.Module, detections: list[_Detection], positions, dead) -> list[_Detection]:
    """Flips that would make a CUDA-only call run on a TPU host become manual findings that name the call
    (flips.py); in a script kept on the CPU (devices.cpu_utility) no device rewrite is made (flips.CPU_KEPT_CODES)."""
    if not any(d.rule.code in CPU_KEPT_CODES for d in detections):
        return detections
    devices = analyse_devices(module)
    if cpu_utility(module):
        for index, d in enumerate(detections):
            if d.rule.code in FALLBACK_CODES | GUARD_CODES:
                message = CPU_UTILITY
            elif d.rule.code in CPU_KEPT_CODES:
                message = CPU_KEPT + d.report.message
            else:
                continue
            detections[index] = replace(d, report=replace(d.report, message=message, replacement=None, imports=()))
        return detections
    if not any(d.rule.code in FLIP_CODES for d in detections):
        return detections

    def span_of(node: cst.CSTNode) -> Span:
        pos = positions[node]
        return (pos.start.line, pos.start.column), (pos.end.line, pos.end.column)

    dead_spans = [((r.start.line, r.start.column), (r.end.line, r.end.column)) for r in dead]
    blocked = blocked_flips(devices, detections, span_of, dead_spans)
    for index, blocker in blocked.items():
        d = detections[index]
        report = replace(d.report, message=flip_message(d.rule.code, blocker), replacement=None, imports=())
        detections[index] = replace(d, report=report)
    return detections


def _implied_words(project: ProjectSteps | None, path: str, source: str = "") -> frozenset[str]:
    """{"step"} when the tree runs a function of this module once per training step (its text may name no
    step: a helper of the loop, a model's method); {"sparse"} when the module names a function of the tree that
    returns a sparse tensor (`adj, x, y = load_data()`: its text may name nothing sparse)."""
    if project is None or not path:
        return frozenset()
    words = set()
    prefix = project.module_of(path) + "."
    if any(name.startswith(prefix) for name in project.per_step):
        words.add("step")
    if any(function.rsplit(".", 1)[-1] in source for function, _ in project.sparse_returns):
        words.add("sparse")
    return frozenset(words)


def _inside(pos, regions) -> bool:
    """Is `pos` within one of `regions` (code that a TPU host never runs: nothing there is reported)?"""
    start, end = (pos.start.line, pos.start.column), (pos.end.line, pos.end.column)
    return any((r.start.line, r.start.column) <= start and end <= (r.end.line, r.end.column) for r in regions)


def _finding(path: str, d: _Detection, edits: tuple[Edit, ...] = ()) -> Finding:
    return Finding(
        path=path,
        line=d.line,
        column=d.column,
        code=d.rule.code,
        category=d.rule.category,
        title=d.rule.title,
        message=d.report.message,
        fix=_applicability(d),
        fixable=d.report.replacement is not None and _applicability(d) != "manual",
        end_line=d.reported_end[0] or None,
        end_column=d.reported_end[1] + 1 if d.reported_end[0] else None,
        edits=edits,
    )


def _own_edits(module: cst.Module, d: _Detection, original: list[OriginalText]) -> tuple[Edit, ...]:
    """The text replacements of `d`'s own rewrite (with the imports it adds), alone: what an editor or a SARIF
    consumer applies for this one finding. `xlaport fix` applies the rewrites together, in passes, and then removes
    the imports they left unused, so its result can differ from applying each finding's edits. `original`: the
    module's statement texts (splice.py), recorded by the first finding that needs them."""
    if d.report.replacement is None or _applicability(d) == "manual":
        return ()
    try:
        if not original:
            original.append(OriginalText(module))
        fixed, generated = splice(original[0], _apply(module, [d]))
        ast.parse(generated)  # parses exactly when `fixed` does (splice.py)
    except Exception:  # noqa: BLE001  (a rewrite that only works with its rule's other edits: no edits, the finding stays)
        return ()
    return text_edits(original[0].code, fixed)


def lint_source(
    source: str,
    path: str = "<string>",
    rules: list[type[Rule]] | None = None,
    project: ProjectSteps | None = None,
    analysis: ModuleAnalysis | None = None,
    edits: bool = False,
) -> list[Finding]:
    """Findings of `rules` (default: all) in `source`. Raises SourceError if it does not parse.
    `edits`: each fixable finding carries its own fix as text replacements (one rewrite of the module per finding).
    `project`: the tree the source is part of (`path` relative to its root), see analysis/project.py;
    `analysis`: an earlier pass's analysis of `source` (kb/batch.py's tree summary), reused instead of a parse."""
    rules = all_rules() if rules is None else rules
    with without_cycle_collection():
        module, tree = (analysis.module, analysis.tree) if analysis is not None else parse_both(source)
        found = _detect(module, rules, source, project, path, tree, analysis)
        original: list[OriginalText] = []
        return [_finding(path, d, _own_edits(module, d, original) if edits else ()) for d in found]


@contextmanager
def without_cycle_collection() -> Iterator[None]:
    """Python's cyclic garbage collector paused for one lint. Parsing and analysing a file allocate a million
    objects that live until the lint ends, so the collector runs every few thousand allocations and, as they
    pile up, keeps walking all of them again: a fifth of lint time, finding nothing (libcst trees hold no
    cycles; reference counting frees them). Collection resumes after, as it was (a lint in another thread
    that started while it was paused leaves it paused until this one ends)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _applicability(d: _Detection) -> str:
    return d.report.fix or d.rule.fix


def _allowed(d: _Detection, unsafe: bool) -> bool:
    fix = _applicability(d)
    return fix == "safe" or (fix == "unsafe" and unsafe)


def _non_overlapping(detections: list[_Detection]) -> list[_Detection]:
    """Outermost first; a replacement inside another one waits for the next pass, and so do the other
    replacements of its rule: a rule's edits of one pass belong together (XLA502 removes the scaler and
    rewrites each of its uses; removing it without rewriting one use would leave a dangling name)."""
    chosen: list[_Detection] = []
    waiting: set[type[Rule]] = set()
    for d in sorted(detections, key=lambda d: (d.start, (-d.end[0], -d.end[1]))):
        if any(c.start <= d.start and d.end <= c.end or d.start <= c.start and c.end <= d.end for c in chosen):
            waiting.add(d.rule)
            continue
        chosen.append(d)
    return [d for d in chosen if d.rule not in waiting] or chosen[:1]


def _apply(module: cst.Module, chosen: list[_Detection]) -> cst.Module:
    replacements = {}
    imports: list[ImportSpec] = []
    for d in chosen:
        node = d.report.target if d.report.target is not None else d.report.node
        replacement = d.report.replacement
        if replacement is cst.RemovalSentinel.REMOVE and isinstance(node, cst.BaseStatement):
            replacement = removal_marker(node)
        replacements[node] = replacement
        imports.extend(d.report.imports)
    on_path = ancestors(replacements, parent_map(module))
    new_module = replace_nodes(module, replacements, on_path, drop_markers=True, once=_is_sync_line)
    return add_imports(new_module, imports) if imports else new_module


def _is_sync_line(stmt: cst.CSTNode) -> bool:
    """`torch_xla.sync()` alone on its line: a barrier right after a barrier does nothing, so where two rewrites
    add one each (XLA406 after `optimizer.step()`, XLA208 for the `end.record()` that follows) one is kept."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return False
    call = stmt.body[0].value
    return (
        isinstance(call, cst.Call)
        and not call.args
        and isinstance(call.func, cst.Attribute)
        and isinstance(call.func.value, cst.Name)
        and (call.func.value.value, call.func.attr.value) == ("torch_xla", "sync")
    )


_FIX_CACHE: OrderedDict[tuple, FixResult] = OrderedDict()


def fix_source(
    source: str,
    path: str = "<string>",
    rules: list[type[Rule]] | None = None,
    unsafe: bool = False,
    project: ProjectSteps | None = None,
    analysis: ModuleAnalysis | None = None,
) -> FixResult:
    """Applies every allowed rewrite until nothing more changes; never returns unparsable code.
    Results are kept by content hash (with the path, rules, `unsafe` and project) for the next identical request.
    `project`: the tree the source is part of (`path` relative to its root), see analysis/project.py;
    `analysis`: an earlier pass's analysis of `source`, reused for the first detection instead of a parse."""
    rules = all_rules() if rules is None else rules
    key = (hashlib.sha256(source.encode("utf-8", "surrogatepass")).digest(), path, tuple(rules), unsafe, project)
    cached = _FIX_CACHE.get(key)
    if cached is None:
        # as lint_source: the fix's libcst trees hold no cycles to find; and every pass keeps the first pass's
        # answer to "is this script kept on the CPU?" (devices.one_cpu_decision)
        with without_cycle_collection(), one_cpu_decision():
            cached = _fix_source(source, path, rules, unsafe, project, analysis)
        _FIX_CACHE[key] = cached
        while len(_FIX_CACHE) > FIX_CACHE_SIZE:
            _FIX_CACHE.popitem(last=False)
    else:
        _FIX_CACHE.move_to_end(key)
    return replace(cached, applied=list(cached.applied), remaining=list(cached.remaining))


def _fix_source(
    source: str,
    path: str,
    rules: list[type[Rule]],
    unsafe: bool,
    project: ProjectSteps | None,
    analysis: ModuleAnalysis | None = None,
) -> FixResult:
    """Detect, rewrite, and detect the rewritten text again, until nothing fixable is left. The second detection
    is not a formality: rewrites unlock rewrites nested in them and change what other rules see (code leaves a
    CUDA-only branch, a scaler's uses go); carrying the first pass's findings over to the rewritten text instead
    changed what is left in 51 of 585 fixes (the corpus and kb fixture files that get one, safe and unsafe) and
    missed a second rewrite pass in 17."""
    module, tree = (analysis.module, analysis.tree) if analysis is not None else parse_both(source)
    original = tree
    text = source
    applied: list[Finding] = []
    texts = ModuleTexts()  # the modules below share most statements: each one's code is generated once
    detections = _detect(module, rules, text, project, path, tree, analysis)
    imports_checked = True  # `text` was checked for imports the rewrites left unused (nothing to check before any)
    for _ in range(MAX_FIX_PASSES):
        fixable = _fixable(detections, unsafe)
        if not fixable:
            break
        chosen = _non_overlapping(fixable)
        candidate = _apply(module, chosen)
        candidate_text = texts.code(candidate)
        if candidate_text == text:
            break
        applied.extend(_finding(path, d) for d in chosen)
        tree = _checked_tree(candidate_text, path)
        cleaned = remove_imports_made_unused(original, candidate, tree, texts.code)
        if cleaned is not candidate:
            # the final text, unless a rewrite is left: then its detections are what is left. If one is left, the
            # next pass works on the text with its imports (a rewrite that adds an import puts it after them), and
            # they are removed at the end.
            final = texts.code(cleaned)
            final_tree = _checked_tree(final, path)
            found = _detect(cleaned, rules, final, project, path, final_tree)
            if not _fixable(found, unsafe):
                final = texts.code(mark_device_imports(original, cleaned, final_tree))
                return FixResult(path, source, final, applied, [_finding(path, d) for d in found])
        # the rewritten tree itself, not a parse of its text (which CPython checked above): parsing it again was
        # ~15% of a 200-line fix, and gives the same fixes and findings on the corpus and kb fixture files (784
        # files, safe and unsafe: 599 fixes)
        text, module, imports_checked = candidate_text, candidate, cleaned is candidate
        # the new text's detections: what the next pass rewrites, or what is left (no lint of the result at the end)
        detections = _detect(module, rules, text, project, path, tree)
    remaining = [_finding(path, d) for d in detections]
    if not imports_checked:
        cleaned = remove_imports_made_unused(original, module, tree, texts.code)
        if cleaned is not module:
            text = texts.code(cleaned)
            remaining = lint_source(text, path, rules, project)
            module, tree = cleaned, ast.parse(text, path)
    if applied:  # a comment at a line's end: the findings' positions stay
        text = texts.code(mark_device_imports(original, module, tree))
    return FixResult(path=path, source=source, fixed=text, applied=applied, remaining=remaining)


def _fixable(detections: list[_Detection], unsafe: bool) -> list[_Detection]:
    return [d for d in detections if d.report.replacement is not None and _allowed(d, unsafe)]


def _checked_tree(text: str, path: str) -> ast.Module:
    """CPython's AST of a rewritten text, which must compile."""
    try:
        tree = ast.parse(text, path)
        compile(tree, path, "exec")
    except (SyntaxError, ValueError) as exc:
        raise RuntimeError(f"internal error: a rewrite produced unparsable code in {path}: {exc}") from exc
    return tree
