"""Synthesized training pairs for the findings the rules leave to a person (the code model's job).

A real corpus function F is rewritten twice at the same place: once with a CUDA-ism of a kind
the kb reports as manual, once in the XLA-friendly form; the first is the trace's original, the
second its target. Kinds (kb codes in brackets):

- host_read      a loss read on the host in a training loop [XLA401/402/403] -> a step closure,
                 or an on-device running sum
- event_timing   `torch.cuda.Event` timing around the function's work [XLA208] -> a wall clock
                 that waits for the device (`xm.wait_device_ops()`)
- memory_stats   CUDA allocator statistics [XLA601] -> `xm.get_memory_info(device)`
- masked         boolean-mask indexing, `nonzero`, `masked_select` [XLA409/411] -> static shapes
- grad_scaler    a GradScaler built with `enabled=` around backward/step [XLA502] -> F unchanged

Edits are made on text lines located with `ast` (statement starts and ends), so the rest of F
keeps its formatting. Pairs whose original has no kb finding are dropped (`synth_traces` lints).
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from collections.abc import Callable

from xlaport.model.prompts import join_target

from .corpus import Function, normalized_key, split_of
from .traces import Trace, lint_many, module_text

XM = "import torch_xla.core.xla_model as xm"
TORCH_XLA = "import torch_xla"
TIME = "import time"
HOST_READ_CODES = ("XLA401", "XLA402", "XLA403", "XLA404")

Edit = tuple[str, str, list[str]]  # (original with the CUDA-ism, XLA form, imports the XLA form adds)


# --- locating statements ---------------------------------------------------------------------------
def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _insert(lines: list[str], after: int, block: list[str], indent: str) -> list[str]:
    """`lines` with `block` (indented by `indent`) inserted after line number `after` (1-based; 0: at the top)."""
    return lines[:after] + [indent + text + "\n" for text in block] + lines[after:]


def _function(tree: ast.Module) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    if len(tree.body) == 1 and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return tree.body[0]
    return None


def _calls(node: ast.AST, attr: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr
    ]


def _body_statement(loop: ast.For | ast.While, inner: ast.AST) -> ast.stmt | None:
    """The statement directly in `loop.body` that contains `inner`."""
    for stmt in loop.body:
        if any(n is inner for n in ast.walk(stmt)):
            return stmt
    return None


def _training_loops(fn: ast.AST) -> list[tuple[ast.For | ast.While, str, ast.stmt]]:
    """(loop, loss variable, the loop-body statement after which to insert) of each simple training loop.

    A training loop calls `NAME.backward()` directly in its body and an `.step()` somewhere in it.
    """
    found = []
    for loop in ast.walk(fn):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        backward = next((c for c in _calls(loop, "backward") if isinstance(c.func.value, ast.Name)), None)
        steps = _calls(loop, "step")
        if backward is None or not steps:
            continue
        anchor = _body_statement(loop, steps[-1]) or _body_statement(loop, backward)
        if anchor is None or isinstance(anchor, (ast.Return, ast.Break, ast.Continue)):
            continue
        found.append((loop, backward.func.value.id, anchor))
    return found


# --- the kinds ---------------------------------------------------------------------------------------
def host_read(source: str, tree: ast.Module, rng: random.Random) -> Edit | None:
    loops = _training_loops(tree)
    if not loops:
        return None
    loop, loss, anchor = rng.choice(loops)
    lines = source.splitlines(keepends=True)
    indent = _indent(lines[anchor.lineno - 1])
    loop_indent = _indent(lines[loop.lineno - 1])
    variant = rng.randrange(4)
    if variant == 0:
        cuda = [f'print(f"loss {{{loss}.item():.4f}}")']
        xla = [f'xm.add_step_closure(lambda value: print(f"loss {{value.item():.4f}}"), args=({loss}.detach(),))']
    elif variant == 1:
        cuda = [f'print("loss", float({loss}))']
        xla = [f'xm.add_step_closure(lambda value: print("loss", float(value)), args=({loss}.detach(),))']
    elif variant == 2:
        total = rng.choice(["running_loss", "total_loss", "epoch_loss"])
        before = _insert(lines, loop.lineno - 1, [f"{total} = 0.0"], loop_indent)
        shifted = anchor.end_lineno + 1
        cuda_lines = _insert(before, shifted, [f"{total} += {loss}.item()"], indent)
        xla_lines = _insert(before, shifted, [f"{total} += {loss}.detach()  # stays on the device: no sync"], indent)
        return "".join(cuda_lines), "".join(xla_lines), []
    else:
        history = rng.choice(["losses", "history", "loss_log"])
        before = _insert(lines, loop.lineno - 1, [f"{history} = []"], loop_indent)
        shifted = anchor.end_lineno + 1
        cuda_lines = _insert(before, shifted, [f"{history}.append({loss}.item())"], indent)
        xla_lines = _insert(before, shifted, [f"{history}.append({loss}.detach())  # read after the loop"], indent)
        return "".join(cuda_lines), "".join(xla_lines), []
    at = anchor.end_lineno
    return "".join(_insert(lines, at, cuda, indent)), "".join(_insert(lines, at, xla, indent)), [XM]


def _work_span(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int] | None:
    """(first, last) statement index of the function's work: after the docstring, before a final return."""
    body = fn.body
    first = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    last = len(body) - 1
    if last >= first and isinstance(body[last], ast.Return):
        last -= 1
    return (first, last) if last >= first else None


def event_timing(source: str, tree: ast.Module, rng: random.Random) -> Edit | None:
    fn = _function(tree)
    span = _work_span(fn) if fn else None
    if span is None:
        return None
    lines = source.splitlines(keepends=True)
    first, last = fn.body[span[0]], fn.body[span[1]]
    indent = _indent(lines[first.lineno - 1])
    start, end = rng.choice([("start", "end"), ("start_event", "end_event"), ("t0", "t1")])
    elapsed = rng.choice(["elapsed_ms", "ms", "duration_ms"])
    report = [f'print(f"{fn.name}: {{{elapsed}:.1f}} ms")'] if rng.random() < 0.5 else []
    cuda_before = [
        f"{start} = torch.cuda.Event(enable_timing=True)",
        f"{end} = torch.cuda.Event(enable_timing=True)",
        f"{start}.record()",
    ]
    cuda_after = [f"{end}.record()", "torch.cuda.synchronize()", f"{elapsed} = {start}.elapsed_time({end})", *report]
    xla_before = [f"{start} = time.perf_counter()"]
    xla_after = [
        "xm.wait_device_ops()  # wait for the device, not only for tracing",
        f"{elapsed} = (time.perf_counter() - {start}) * 1000",
        *report,
    ]

    def wrap(before: list[str], after: list[str]) -> str:
        out = _insert(lines, last.end_lineno, after, indent)
        top = min([d.lineno for d in getattr(first, "decorator_list", [])] + [first.lineno])
        return "".join(_insert(out, top - 1, before, indent))

    return wrap(cuda_before, cuda_after), wrap(xla_before, xla_after), [TIME, XM]


MEMORY_STATS = {"memory_allocated": "bytes_used", "max_memory_allocated": "peak_bytes_used"}


def memory_stats(source: str, tree: ast.Module, rng: random.Random) -> Edit | None:
    fn = _function(tree)
    span = _work_span(fn) if fn else None
    if span is None:
        return None
    lines = source.splitlines(keepends=True)
    last = fn.body[span[1]]
    indent = _indent(lines[fn.body[span[0]].lineno - 1])
    stat = rng.choice(list(MEMORY_STATS))
    key = MEMORY_STATS[stat]
    label = rng.choice(["memory", "peak memory" if stat.startswith("max") else "allocated", "mem"])
    xla_read = f"xm.get_memory_info(torch_xla.device())[{key!r}]"
    if rng.random() < 0.5:
        cuda = [f'print(f"{label}: {{torch.cuda.{stat}() / 2**20:.0f}} MB")']
        xla = [f'print(f"{label}: {{{xla_read} / 2**20:.0f}} MB")']
    else:
        name = rng.choice(["mem_mb", "used_mb", "memory_mb"])
        cuda = [f"{name} = torch.cuda.{stat}() / 2**20"]
        xla = [f"{name} = {xla_read} / 2**20"]
    at = last.end_lineno
    return "".join(_insert(lines, at, cuda, indent)), "".join(_insert(lines, at, xla, indent)), [TORCH_XLA, XM]


TENSORISH = re.compile(
    r"^(x|y|h|out|output|outputs|logits|scores|pred|preds|probs|loss|losses|attn|weights|feat|features|emb|z|target|targets|labels|mask)$"
)
MASKED_TEMPLATES = [
    ("{n} = {v}[{v} > 0].numel()", "{n} = ({v} > 0).sum()", "num_pos"),
    ("{n} = {v}[{v} > 0].sum()", "{n} = torch.where({v} > 0, {v}, torch.zeros_like({v})).sum()", "pos_sum"),
    ("{n} = {v}[{v} != 0].mean()", "{n} = ({v} * ({v} != 0)).sum() / ({v} != 0).sum()", "nonzero_mean"),
    ("{n} = torch.nonzero({v}).size(0)", "{n} = torch.count_nonzero({v})", "num_nonzero"),
    ("{n} = {v}.nonzero().shape[0]", "{n} = torch.count_nonzero({v})", "nnz"),
    (
        "{n} = torch.masked_select({v}, {v} > 0).sum()",
        "{n} = torch.where({v} > 0, {v}, torch.zeros_like({v})).sum()",
        "pos_total",
    ),
]


def masked(source: str, tree: ast.Module, rng: random.Random) -> Edit | None:
    fn = _function(tree)
    if fn is None:
        return None
    lines = source.splitlines(keepends=True)
    sites = []  # (variable, line after which to insert, indent)
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            if isinstance(stmt.value, ast.Call) and TENSORISH.match(stmt.targets[0].id):
                sites.append((stmt.targets[0].id, stmt.end_lineno, _indent(lines[stmt.lineno - 1])))
    span = _work_span(fn)
    if span is not None:
        first = fn.body[span[0]]
        for arg in fn.args.args:
            if TENSORISH.match(arg.arg):
                sites.append((arg.arg, first.lineno - 1, _indent(lines[first.lineno - 1])))
    if not sites:
        return None
    variable, at, indent = rng.choice(sites)
    cuda, xla, name = rng.choice(MASKED_TEMPLATES)
    values = {"n": name, "v": variable}
    return (
        "".join(_insert(lines, at, [cuda.format(**values)], indent)),
        "".join(_insert(lines, at, [xla.format(**values)], indent)),
        [],
    )


def grad_scaler(source: str, tree: ast.Module, rng: random.Random) -> Edit | None:
    fn = _function(tree)
    if fn is None:
        return None
    lines = source.splitlines(keepends=True)
    params = {a.arg for a in fn.args.args}
    for loop in ast.walk(fn):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        plain = [s for s in ast.walk(loop) if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
        backward = [s for s in plain if _is_call(s.value, "backward", 0) and isinstance(s.value.func.value, ast.Name)]
        step = [
            s
            for s in plain
            if _is_call(s.value, "step", 0) and isinstance(s.value.func.value, (ast.Name, ast.Attribute))
        ]
        if len(backward) != 1 or len(step) != 1 or backward[0].lineno != backward[0].end_lineno:
            continue
        if step[0].lineno != step[0].end_lineno:
            continue
        enabled = "args.amp" if "args" in params else "self.use_amp" if "self" in params else "use_amp"
        cuda_lines = list(lines)
        for stmt, rewrite in ((backward[0], _scaled_backward), (step[0], _scaled_step)):
            line = cuda_lines[stmt.lineno - 1]
            cuda_lines[stmt.lineno - 1] = rewrite(line, stmt.value)
        spelling = rng.choice(["torch.cuda.amp.GradScaler", "torch.amp.GradScaler"])
        arg = f'"cuda", enabled={enabled}' if spelling == "torch.amp.GradScaler" else f"enabled={enabled}"
        cuda_lines = _insert(
            cuda_lines, loop.lineno - 1, [f"scaler = {spelling}({arg})"], _indent(lines[loop.lineno - 1])
        )
        return "".join(cuda_lines), source, []
    return None


def _is_call(call: ast.Call, attr: str, nargs: int) -> bool:
    return (
        isinstance(call.func, ast.Attribute)
        and call.func.attr == attr
        and len(call.args) == nargs
        and not call.keywords
    )


def _scaled_backward(line: str, call: ast.Call) -> str:
    name = call.func.value.id
    return line.replace(f"{name}.backward()", f"scaler.scale({name}).backward()", 1)


def _scaled_step(line: str, call: ast.Call) -> str:
    optimizer = ast.unparse(call.func.value)
    indent = _indent(line)
    return line.replace(f"{optimizer}.step()", f"scaler.step({optimizer})", 1) + f"{indent}scaler.update()\n"


KINDS: dict[str, Callable[[str, ast.Module, random.Random], Edit | None]] = {
    "host_read": host_read,
    "event_timing": event_timing,
    "memory_stats": memory_stats,
    "masked": masked,
    "grad_scaler": grad_scaler,
}


# --- traces -----------------------------------------------------------------------------------------
REPEATS = {"host_read": 4, "grad_scaler": 2}  # rare kinds (few simple training loops): every variant
PLAIN_CODE = re.compile(r"torch\.|model|optimizer")  # timing and memory reports go where there is tensor work


def synth_edits(fn: Function, rng: random.Random) -> list[tuple[str, Edit]]:
    """(kind, edit) of the kinds that apply to `fn`, placed at random (rare kinds in several variants)."""
    try:
        tree = ast.parse(fn.source)
    except SyntaxError:
        return []
    if _function(tree) is None:
        return []
    edits = []
    for kind, make in KINDS.items():
        if kind in ("event_timing", "memory_stats") and not PLAIN_CODE.search(fn.source):
            continue
        for _ in range(REPEATS.get(kind, 1)):
            edit = make(fn.source, tree, rng)
            if edit is None or edit[0] == edit[1]:
                continue
            try:
                ast.parse(edit[0])
                ast.parse(edit[1])
            except SyntaxError:
                continue
            edits.append((kind, edit))
    return edits


def _with_torch(imports: str) -> str:
    return imports if re.search(r"^import torch\s*$", imports, re.M) else "import torch\n" + imports


def _balanced(candidates: list, count: int, rng: random.Random) -> list:
    """Up to `count` candidates, taking the kinds in turn (rare kinds are not crowded out)."""
    by_kind: dict[str, list] = {}
    for candidate in candidates:
        by_kind.setdefault(candidate[1], []).append(candidate)
    for group in by_kind.values():
        rng.shuffle(group)
    chosen: list = []
    while len(chosen) < count and any(by_kind.values()):
        for group in by_kind.values():
            if group and len(chosen) < count:
                chosen.append(group.pop())
    return chosen


def synth_traces(functions: list[Function], limit: int, seed: int = 0) -> list[Trace]:
    """Up to `limit` deduplicated traces; only pairs whose original has a kb finding the target lacks are kept."""
    rng = random.Random(seed)
    candidates: list[tuple[Function, str, Edit]] = []
    seen: set[str] = set()
    for fn in functions:
        for kind, edit in synth_edits(fn, rng):
            key = normalized_key(edit[0])
            if key not in seen:
                seen.add(key)
                candidates.append((fn, kind, edit))
    candidates = _balanced(candidates, limit * 3 // 2, rng)  # linting is the cost; most candidates pass
    imports = [_with_torch(fn.imports) for fn, _, _ in candidates]
    originals = lint_many([module_text(i, e[0]) for i, (_, _, e) in zip(imports, candidates, strict=True)])
    targets = lint_many([module_text(i, e[1]) for i, (_, _, e) in zip(imports, candidates, strict=True)])
    traces = []
    for (fn, kind, edit), context, before, after in zip(candidates, imports, originals, targets, strict=True):
        if not before or after is None:
            continue
        if not Counter(f.code for f in before) - Counter(f.code for f in after):
            continue  # the CUDA-ism is not reported (or the target is reported the same)
        traces.append(
            Trace(
                kind="synth:" + kind,
                file=fn.file,
                name=fn.name,
                original=edit[0],
                target=join_target([i for i in edit[2] if i not in context], edit[1]),
                imports=context,
                codes=sorted({f.code for f in before}),
                split=split_of(fn.file),
            )
        )
        if len(traces) >= limit:
            break
    return traces
