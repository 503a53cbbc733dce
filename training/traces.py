"""Migration traces: (original function, migrated function, kb codes) examples for fine-tuning.

Four sources:
- `rule_trace`: a corpus function that holds CUDA-isms, migrated by the kb rules;
- `injected_trace`: a clean corpus function into which CUDA-isms are injected; the clean
  version is the target;
- `recorded_traces`: the JSONL that `xlaport migrate` appends (`xlaport.trace`);
- `accepted_traces`: the code model's candidates that a program run accepted (bench/model_evidence.py writes
  them in the same record format): post-rule text before, the model's rewrite after (the flywheel).

A trace's `target` is the migrated function, preceded by the import lines the migration added
(see `join_target` / `split_target`).
"""

from __future__ import annotations

import ast
import random
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import libcst as cst
from xlaport.kb import Finding, SourceError, fix_source, lint_source
from xlaport.model.prompts import join_target, split_target

from xlaport.trace import MODULE_LEVEL, TraceRecord, read_records

from .corpus import Function, split_of

KINDS = ("rules", "injected", "recorded", "accepted")
# Cheap text prefilter: only functions mentioning one of these are linted for rule traces.
CUDA_HINT = re.compile(r"cuda|cudnn|nccl|GradScaler|autocast|DataParallel")
TORCH_FACTORIES = frozenset(
    {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "tensor", "eye", "linspace"}
)


@dataclass
class Trace:
    kind: str  # one of KINDS
    file: str  # source file; decides the split
    name: str  # function name
    original: str  # the function with CUDA-isms
    target: str  # added imports + the migrated function
    imports: str = ""  # module imports the original relies on (prompt context)
    codes: list[str] = field(default_factory=list)  # kb codes found in the original
    split: str = "train"
    validated: bool | None = None  # recorded traces: the validation outcome, when known

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def module_text(imports: str, function: str) -> str:
    return f"{imports}\n{function}" if imports else function


def serving_view(trace: Trace) -> Trace | None:
    """The trace as the pipeline shows it to the model: after the safe rules (suggest's default) rewrote it.

    At serving time the model only sees what the rules left: the function after the safe fixes, with
    the findings still reported. Training on the raw CUDA forms taught it to undo text the rules had
    already changed. None when the safe fixes leave no finding (the pipeline would not ask the model)
    or the function does not survive the round trip.
    """
    try:
        result = fix_source(module_text(trace.imports, trace.original), unsafe=False)
        fixed_imports, function = split_target(result.fixed)
        target_imports, target_function = split_target(trace.target)
        body = ast.parse(function).body
    except (SourceError, RuntimeError, RecursionError, SyntaxError):
        return None
    if not result.remaining or len(body) != 1 or not isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return replace(
        trace,
        original=function,
        imports="\n".join(fixed_imports),
        target=join_target([i for i in target_imports if i not in fixed_imports], target_function),
        codes=sorted({f.code for f in result.remaining}),
    )


def lint_many(modules: list[str]) -> list[list[Finding] | None]:
    """The findings of each module (None: it does not parse), each linted as a module of its own, so
    that a function's labels never depend on its neighbours' imports or code."""
    return [_lint_one(module) for module in modules]


def _lint_one(module: str) -> list[Finding] | None:
    try:
        return lint_source(module)
    except (SourceError, RecursionError):
        return None


# --- (a) functions migrated by the rules -----------------------------------------------------
def is_rule_candidate(fn: Function) -> bool:
    """A cheap text prefilter: only functions that mention a CUDA-ism are linted for rule traces."""
    return bool(CUDA_HINT.search(fn.source))


def rule_trace(fn: Function, unsafe: bool = True, findings: list[Finding] | None = None) -> Trace | None:
    """The rules' migration of `fn`, or None when the rules find nothing they can rewrite.

    `findings`: those of `fn.imports + fn.source` when already known (see `lint_many`).
    """
    if not is_rule_candidate(fn):
        return None
    module = module_text(fn.imports, fn.source)
    if findings is None:
        findings = _lint_one(module)
    if not findings or not any(f.fixable for f in findings):
        return None  # nothing, or only manual findings: no target to learn from
    try:
        result = fix_source(module, unsafe=unsafe)
        fixed_imports, fixed_function = split_target(result.fixed)
        original_imports, _ = split_target(module)
    except (SourceError, RuntimeError, RecursionError, SyntaxError):
        return None
    if not result.changed:
        return None
    added = [imp for imp in fixed_imports if imp not in original_imports]
    return Trace(
        kind="rules",
        file=fn.file,
        name=fn.name,
        original=fn.source,
        target=join_target(added, fixed_function),
        imports=fn.imports,
        codes=sorted({f.code for f in findings}),
        split=split_of(fn.file),
    )


# --- (b) clean functions with injected CUDA-isms ----------------------------------------------
def is_injection_candidate(fn: Function) -> bool:
    return "torch." in fn.source and not CUDA_HINT.search(fn.source)


def inject(fn: Function, rng: random.Random) -> tuple[str, str] | None:
    """(`fn` with one or two CUDA-isms injected, the imports it needs), or None if no injection applies."""
    try:
        module = cst.parse_module(fn.source)
    except cst.ParserSyntaxError:
        return None
    if len(module.body) != 1 or not isinstance(module.body[0], cst.FunctionDef):
        return None
    if not isinstance(module.body[0].body, cst.IndentedBlock):
        return None
    kinds = list(INJECTIONS)
    rng.shuffle(kinds)
    wanted = 1 if rng.random() < 0.7 else 2
    applied = []
    for kind in kinds:
        changed = INJECTIONS[kind](module, rng)
        if changed is not None and changed.code != module.code:
            module = changed
            applied.append(kind)
        if len(applied) == wanted:
            break
    if not applied:
        return None
    imports = fn.imports
    if not re.search(r"^import torch\s*$", imports, re.M):
        imports = "import torch\n" + imports
    return module.code, imports


def injected_trace(
    fn: Function, rng: random.Random, injected: tuple[str, str] | None = None, findings: list[Finding] | None = None
) -> Trace | None:
    """`fn` with CUDA-isms injected (`inject`), the clean `fn` as the target; None if none applies.

    `injected` / `findings`: the result of `inject` and the findings of its module, when already known.
    """
    injected = injected or inject(fn, rng)
    if injected is None:
        return None
    source, imports = injected
    if findings is None:
        findings = _lint_one(module_text(imports, source))
        if findings is None:
            return None
    return Trace(
        kind="injected",
        file=fn.file,
        name=fn.name,
        original=source,
        target=fn.source,
        imports=imports,
        codes=sorted({f.code for f in findings}),
        split=split_of(fn.file),
    )


def _function(module: cst.Module) -> cst.FunctionDef:
    return module.body[0]  # type: ignore[return-value]


def _with_body(module: cst.Module, statements: list[cst.BaseStatement]) -> cst.Module:
    fn = _function(module)
    return module.with_changes(body=[fn.with_changes(body=fn.body.with_changes(body=statements))])


def _docstring_count(statements: list[cst.BaseStatement]) -> int:
    first = statements[0] if statements else None
    if (
        isinstance(first, cst.SimpleStatementLine)
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    ):
        return 1
    return 0


def _insert_first(module: cst.Module, statement: cst.BaseStatement) -> cst.Module | None:
    """`statement` first in the function (after the docstring); None when the body is only a docstring."""
    body = list(_function(module).body.body)
    start = _docstring_count(body)
    if start == len(body):
        return None
    return _with_body(module, [*body[:start], statement, *body[start:]])


def _insert_last(module: cst.Module, statement: cst.BaseStatement) -> cst.Module | None:
    """`statement` before the final statement when it is a return, else at the end; None before a docstring."""
    body = list(_function(module).body.body)
    last = body[-1]
    is_return = isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)
    position = len(body) - 1 if is_return else len(body)
    if position < _docstring_count(body):
        return None
    return _with_body(module, [*body[:position], statement, *body[position:]])


def _statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def _is_torch_factory(node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and isinstance(node.func.value, cst.Name)
        and node.func.value.value == "torch"
        and node.func.attr.value in TORCH_FACTORIES
    )


class _Collect(cst.CSTVisitor):
    def __init__(self, wanted: Callable[[cst.CSTNode], bool]) -> None:
        self.wanted = wanted
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.wanted(node):
            self.found.append(node)
        return True


class _ReplaceOne(cst.CSTTransformer):
    def __init__(self, target: cst.CSTNode, make: Callable[[cst.CSTNode], cst.CSTNode]) -> None:
        self.target = target
        self.make = make

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        return self.make(updated_node) if original_node is self.target else updated_node


def _replace_random(
    module: cst.Module,
    rng: random.Random,
    wanted: Callable[[cst.CSTNode], bool],
    make: Callable[[cst.CSTNode], cst.CSTNode],
) -> cst.Module | None:
    collector = _Collect(wanted)
    _function(module).body.visit(collector)
    if not collector.found:
        return None
    target = rng.choice(collector.found)
    return module.with_changes(body=[_function(module).visit(_ReplaceOne(target, make))])


def inject_cuda_method(module: cst.Module, rng: random.Random) -> cst.Module | None:
    """`x = torch.zeros(...)` → `x = torch.zeros(...).cuda()`."""

    def wanted(node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Assign) and _is_torch_factory(node.value)

    def make(node: cst.Assign) -> cst.Assign:
        return node.with_changes(value=cst.Call(cst.Attribute(node.value, cst.Name("cuda"))))

    return _replace_random(module, rng, wanted, make)


def inject_device_string(module: cst.Module, rng: random.Random) -> cst.Module | None:
    """`torch.zeros(n)` → `torch.zeros(n, device="cuda")`."""

    def wanted(node: cst.CSTNode) -> bool:
        return _is_torch_factory(node) and not any(a.keyword and a.keyword.value == "device" for a in node.args)

    def make(node: cst.Call) -> cst.Call:
        no_space = cst.SimpleWhitespace("")
        equal = cst.AssignEqual(whitespace_before=no_space, whitespace_after=no_space)
        arg = cst.Arg(cst.SimpleString('"cuda"'), keyword=cst.Name("device"), equal=equal)
        args = list(node.args)
        if args and any(a.star for a in args):
            return node
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return node.with_changes(args=[*args, arg])

    return _replace_random(module, rng, wanted, make)


def inject_synchronize(module: cst.Module, rng: random.Random) -> cst.Module | None:
    """`torch.cuda.synchronize()` before the final statement (a return) or at the end."""
    return _insert_last(module, _statement("torch.cuda.synchronize()\n"))


def inject_cudnn_benchmark(module: cst.Module, rng: random.Random) -> cst.Module | None:
    """`torch.backends.cudnn.benchmark = True` as the first statement (after the docstring)."""
    return _insert_first(module, _statement("torch.backends.cudnn.benchmark = True\n"))


def inject_autocast(module: cst.Module, rng: random.Random) -> cst.Module | None:
    """The body (after the docstring) wrapped in a CUDA autocast region."""
    body = list(_function(module).body.body)
    start = _docstring_count(body)
    if start == len(body):
        return None
    spelling = rng.choice(["torch.cuda.amp.autocast()", 'torch.autocast("cuda")', 'torch.autocast(device_type="cuda")'])
    region = cst.parse_statement(f"with {spelling}:\n    pass\n")
    assert isinstance(region, cst.With)
    wrapped = region.with_changes(body=region.body.with_changes(body=body[start:]))
    return _with_body(module, [*body[:start], wrapped])


def inject_grad_scaler(module: cst.Module, rng: random.Random) -> cst.Module | None:
    """`loss.backward()` → `scaler.scale(loss).backward()` with a `torch.cuda.amp.GradScaler()`."""
    body = list(_function(module).body.body)

    def wanted(node: cst.CSTNode) -> bool:
        return (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "backward"
            and not node.args
        )

    def make(node: cst.Call) -> cst.Call:
        func = node.func
        assert isinstance(func, cst.Attribute)
        scaled = cst.Call(cst.Attribute(cst.Name("scaler"), cst.Name("scale")), [cst.Arg(func.value)])
        return node.with_changes(func=func.with_changes(value=scaled))

    replaced = _replace_random(module, rng, wanted, make)
    if replaced is None:
        return None
    body = list(_function(replaced).body.body)
    start = _docstring_count(body)
    scaler = _statement("scaler = torch.cuda.amp.GradScaler()\n")
    return _with_body(replaced, [*body[:start], scaler, *body[start:]])


def inject_memory_report(module: cst.Module, rng: random.Random) -> cst.Module | None:
    """A CUDA memory statistic printed before the final statement (a return) or at the end."""
    stat = rng.choice(["memory_allocated", "max_memory_allocated", "memory_reserved"])
    return _insert_last(module, _statement(f'print(f"{stat}: {{torch.cuda.{stat}() / 2**20:.0f}} MB")\n'))


def inject_empty_cache(module: cst.Module, rng: random.Random) -> cst.Module | None:
    """`torch.cuda.empty_cache()` as the first statement (after the docstring)."""
    return _insert_first(module, _statement("torch.cuda.empty_cache()\n"))


def inject_set_device(module: cst.Module, rng: random.Random) -> cst.Module | None:
    """`torch.cuda.set_device(0)` as the first statement (after the docstring)."""
    return _insert_first(module, _statement("torch.cuda.set_device(0)\n"))


INJECTIONS: dict[str, Callable[[cst.Module, random.Random], cst.Module | None]] = {
    "cuda_method": inject_cuda_method,
    "device_string": inject_device_string,
    "synchronize": inject_synchronize,
    "cudnn_benchmark": inject_cudnn_benchmark,
    "autocast": inject_autocast,
    "grad_scaler": inject_grad_scaler,
    "memory_report": inject_memory_report,
    "empty_cache": inject_empty_cache,
    "set_device": inject_set_device,
}


# --- recorded traces ---------------------------------------------------------------------------
def recorded_traces(path: Path) -> Iterator[Trace]:
    """Traces from the JSONL that `xlaport migrate` appends (`xlaport.trace.TraceRecord`).

    Function records are used (file records repeat them; module-level code is not a function).
    Records whose validation rejected the migration are skipped: they are not migrations.
    """
    for record in read_records(path):
        trace = _recorded_trace(record)
        if trace is not None:
            yield trace


def accepted_traces(path: Path) -> Iterator[Trace]:
    """The accepted candidates of `path`: function records that a model proposed (`proposed_by` names a
    "model:...") and whose program run validated them. Anything else in the file is skipped.

    They always go to the train split: they are what the flywheel feeds back. A model trained on them has seen
    those programs, so it is no longer measured on them (bench/model_evidence.py says which programs they came from).
    """
    for record in read_records(path):
        if record.validation.status != "validated" or not any(p.startswith("model:") for p in record.proposed_by):
            continue
        trace = _recorded_trace(record)
        if trace is not None:
            yield replace(trace, kind="accepted", file=trace.file.replace("recorded:", "accepted:", 1), split="train")


def _recorded_trace(record: TraceRecord) -> Trace | None:
    if record.unit != "function" or record.function == MODULE_LEVEL or record.error:
        return None
    if record.validation.status == "rejected":
        return None
    original, migrated = textwrap.dedent(record.original), textwrap.dedent(record.migrated)  # methods come indented
    if not original.strip() or not migrated.strip() or original.strip() == migrated.strip():
        return None
    try:
        ast.parse(original)
        ast.parse(migrated)
    except (SyntaxError, ValueError):
        return None
    file = f"recorded:{record.src}/{record.path}"
    return Trace(
        kind="recorded",
        file=file,
        name=record.function or "",
        original=original if original.endswith("\n") else original + "\n",
        target=migrated if migrated.endswith("\n") else migrated + "\n",
        codes=sorted(set(record.codes_applied + record.codes_left)),
        split=split_of(file),
        validated=True if record.validation.status == "validated" else None,
    )
