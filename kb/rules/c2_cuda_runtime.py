"""C2 — CUDA runtime calls and flags: synchronize, cuDNN and TF32 flags, events and streams, `nvidia-smi`."""

from __future__ import annotations

import libcst as cst

from ..analysis.guards import guarded_by_cuda
from ..cst_helpers import (
    block_of,
    expr,
    find_nodes,
    is_literal,
    keyword_arg,
    parenthesized,
    positional_args,
    statements,
    string_value,
)
from ..rule import (
    IMPORT_TORCH_XLA,
    IMPORT_XLA_BACKENDS,
    IMPORT_XM,
    MATMUL_PRECISIONS,
    REMOVE,
    SET_MATMUL_PRECISION,
    Rule,
)


class CudaSynchronize(Rule):
    code = "XLA204"
    needs = ("cuda",)
    title = "`torch.cuda.synchronize()` has no driver to wait on"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.cuda.synchronize()` (typically around timing code)."
    why = (
        "Raises `RuntimeError: Found no NVIDIA driver` on a TPU host. The XLA equivalent waits for the "
        "device queue: `xm.wait_device_ops()` (after a `torch_xla.sync()` so the graph is launched)."
    )
    before = "import torch\n\ntorch.cuda.synchronize()\n"
    after = "import torch_xla.core.xla_model as xm\n\nxm.wait_device_ops()\n"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("torch_xla/core/xla_model.py: wait_device_ops",)
    message = "`torch.cuda.synchronize()` fails without a GPU; use `xm.wait_device_ops()`"

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.cuda.synchronize"):
            self.report(node, replacement=expr("xm.wait_device_ops()"), imports=(IMPORT_XM,))


class CudnnFlags(Rule):
    code = "XLA205"
    severity = "note"  # ignored on TPU: harmless
    needs = ("cudnn",)
    title = "cuDNN flags do nothing on TPU"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "Assignments to `torch.backends.cudnn.benchmark`, `.deterministic` or `.enabled`."
    why = (
        "There is no cuDNN on a TPU: the flags are silently ignored. Keeping them suggests a determinism or "
        "autotuning guarantee that the migrated run does not have."
    )
    before = "import torch\ntorch.backends.cudnn.benchmark = True\nx = 1\n"
    after = "x = 1\n"
    message = "cuDNN flag has no effect on XLA; remove it"

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            names = self.qualified_names(target.target) - TF32_FLAGS  # allow_tf32 is XLA210's
            if any(n.startswith("torch.backends.cudnn.") for n in names):
                if guarded_by_cuda(self, node):
                    return  # CUDA-only tuning behind a CUDA guard: nothing to carry to the TPU
                stmt = self.parent(node)
                if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                    self.report(stmt, replacement=REMOVE)
                else:
                    self.report(node)
                return


# --- timing and monitoring -------------------------------------------------------------
TIMER_WAIT_MESSAGE = (
    "the timer's rewrite waits for the device here already (`torch_xla.sync(); xm.wait_device_ops()`): "
    "this wait is removed, not repeated"
)
# Where `(end - start) * 1000` can stand without parentheses.
BARE_EXPRESSION_PARENTS = (
    cst.Assign,
    cst.AugAssign,
    cst.AnnAssign,
    cst.Arg,
    cst.Return,
    cst.Element,
    cst.FormattedStringExpression,
)
CUDA_TIMING = {
    "torch.cuda.Event": "time with `time.perf_counter()` around `torch_xla.sync(); xm.wait_device_ops()`, "
    "or profile with `torch_xla.debug.profiler`",
    "torch.cuda.Stream": "XLA schedules the device itself: drop the stream and run the ops directly",
    "torch.cuda.stream": "XLA schedules the device itself: drop the `with torch.cuda.stream(...)` block",
    "torch.cuda.current_stream": "to wait for the device use `xm.wait_device_ops()`",
    "torch.cuda.default_stream": "to wait for the device use `xm.wait_device_ops()`",
    "torch.cuda.CUDAGraph": "XLA already compiles and caches the step graph: drop CUDA graph capture",
    "torch.cuda.graph": "XLA already compiles and caches the step graph: drop CUDA graph capture",
    "torch.cuda.make_graphed_callables": "XLA already compiles and caches the step graph: use the callables as is",
}


class CudaEventsAndStreams(Rule):
    code = "XLA208"
    needs = ("cuda",)
    title = "CUDA events, streams and graphs have no XLA counterpart"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.cuda.Event(...)` (with `.record()` / `.elapsed_time()`), `torch.cuda.Stream` / `stream()` / "
        "`current_stream()`, and CUDA graph capture (`torch.cuda.graph`, `CUDAGraph`, `make_graphed_callables`). "
        "Events used only as a timer in one function (`e = torch.cuda.Event(...)`, `e.record()` and "
        "`e.synchronize()` as statements, `a.elapsed_time(b)`) are rewritten to a host timer after a device "
        "barrier; every other use is left for a human."
    )
    why = (
        "They talk to the CUDA runtime: on a TPU host they raise `RuntimeError: Found no NVIDIA driver on your "
        "system` (or, for some, do nothing). Timing with events must become wall-clock timing around a device "
        "barrier — XLA runs lazily, so without `torch_xla.sync()` + `xm.wait_device_ops()` you time the tracing, "
        "not the step. Exclude the first steps: they include compilation. The rewrite of a timer is safe: each "
        "`record()` becomes `torch_xla.sync(); xm.wait_device_ops(); e = time.perf_counter()` and "
        "`a.elapsed_time(b)` becomes `(b - a) * 1000` (milliseconds, as before); a device wait right before or "
        "after a `record()` (`torch.cuda.synchronize()`) goes, the record's rewrite waits there already. The values "
        "computed by the program are unchanged, only where the graph is cut (at the timer) is new."
    )
    before = (
        "import torch\n\nstart = torch.cuda.Event(enable_timing=True)\nend = torch.cuda.Event(enable_timing=True)\n"
        "start.record()\nstep()\nend.record()\ntorch.cuda.synchronize()\nms = start.elapsed_time(end)\n"
    )
    after = (
        "import time\nimport torch_xla\nimport torch_xla.core.xla_model as xm\n\n"
        "torch_xla.sync()\nxm.wait_device_ops()\nstart = time.perf_counter()\nstep()\n"
        "torch_xla.sync()\nxm.wait_device_ops()\nend = time.perf_counter()\nms = (end - start) * 1000\n"
    )
    message = "CUDA event/stream API raises or does nothing on TPU"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("docs/source/learn/xla-profiling.md", "pytorch/xla #8824")
    valid = (
        "import time\nimport torch_xla\nimport torch_xla.core.xla_model as xm\nt0 = time.perf_counter()\n"
        "torch_xla.sync()\nxm.wait_device_ops()\nelapsed = time.perf_counter() - t0\n",
        "import threading\nevent = threading.Event()\nevent.set()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        for name in sorted(self.qualified_names(node.func) & CUDA_TIMING.keys()):
            if name == "torch.cuda.Event" and self._rewrite_timer(node):
                return
            self.report(node, f"`{name}` raises or does nothing on TPU; {CUDA_TIMING[name]}", fix="manual")
            return

    # --- CUDA-event timing -> a host timer after a device barrier -----------------------------------------
    def _rewrite_timer(self, event: cst.Call) -> bool:
        """`start = torch.cuda.Event(...)` whose every use in its scope is `start.record()` (a statement),
        `start.synchronize()` (a statement) or `a.elapsed_time(b)` between such events: each record becomes
        `torch_xla.sync(); xm.wait_device_ops(); start = time.perf_counter()` and `a.elapsed_time(b)` becomes
        `(b - a) * 1000` (milliseconds, as CUDA reports them). Returns False (nothing reported) otherwise."""
        assign = self.parent(event)
        line = self.parent(assign) if assign is not None else None
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        ):
            return False
        scope = self._scope(event)
        plan = self._timer_plan(scope)
        if plan is None or assign.targets[0].target.value not in plan[0]:
            return False
        if self.reports and any(r.node is line for r in self.reports):
            return True
        imports = (("time", None, None), IMPORT_TORCH_XLA, IMPORT_XM)
        message = (
            "CUDA events raise on TPU (`Found no NVIDIA driver`); timed on the host instead, after "
            "`torch_xla.sync(); xm.wait_device_ops()` so the device work is done (exclude the first steps: they compile)"
        )
        self.report(line, message, replacement=REMOVE, imports=imports, fix="safe")
        for node, replacement in plan[1]:
            if node is not line and not any(r.node is node for r in self.reports):
                said = TIMER_WAIT_MESSAGE if any(node is wait for wait in plan[2]) else message
                self.report(node, said, replacement=replacement, imports=imports, fix="safe")
        return True

    def _scope(self, node: cst.CSTNode) -> cst.CSTNode:
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.Module)):
                return anc
        return self.analysis.module

    def _timer_plan(self, scope: cst.CSTNode):
        """(event names, [(node, replacement)]) when every event of `scope` is used only as a timer; else None."""
        cache = self.__dict__.setdefault("_plans", {})
        if id(scope) not in cache:
            cache[id(scope)] = (scope, self._make_plan(scope))
        return cache[id(scope)][1]

    def _make_plan(self, scope: cst.CSTNode):
        body = scope.body if isinstance(scope, cst.FunctionDef) else scope
        events: dict[str, cst.SimpleStatementLine] = {}
        for assign in find_nodes(body, cst.Assign):
            value = assign.value
            if isinstance(value, cst.Call) and "torch.cuda.Event" in self.qualified_names(value.func):
                target = assign.targets[0].target if len(assign.targets) == 1 else None
                line = self.parent(assign)
                if not isinstance(target, cst.Name) or target.value in events or self._scope(assign) is not scope:
                    return None
                events[target.value] = line
        edits: list = []
        for name in find_nodes(body, cst.Name):
            if name.value not in events:
                continue
            if self._scope(name) is not scope:
                return None  # used in a nested function: not followed
            edit = self._timer_edit(name, events)
            if edit is None:
                return None
            if edit is not True and not any(node is edit[0] for node, _ in edits):
                edits.append(edit)
        bound = [n for n in find_nodes(body, cst.Name) if n.value in events and self._binds(n)]
        if len(bound) != len(events):
            return None  # rebound elsewhere (`start = other`): not only a timer
        records = [node for node, replacement in edits if isinstance(replacement, cst.FlattenSentinel)]
        waits = [wait for line in records for wait in self._waits_beside(line, events)]
        edits = [(node, replacement) for node, replacement in edits if not any(node is wait for wait in waits)]
        edits += [(wait, REMOVE) for wait in waits]
        return set(events), edits, waits

    def _waits_beside(self, record: cst.SimpleStatementLine, events: dict) -> list[cst.SimpleStatementLine]:
        """The statements right before and after a `record()` that wait for the device (`torch.cuda.synchronize()`,
        `torch.cuda.current_stream().synchronize()`, an event's `synchronize()`, `xm.wait_device_ops()`): the
        record's rewrite waits there already, so a second `xm.wait_device_ops()` would change nothing."""
        block = block_of(self, record)
        body = list(block.body) if block is not None else []
        at = next(i for i, stmt in enumerate(body) if stmt is record) if body else 0
        beside = body[max(at - 1, 0) : at] + body[at + 1 : at + 2]
        return [stmt for stmt in beside if self._waits(stmt, events)]

    def _waits(self, stmt: cst.CSTNode, events: dict) -> bool:
        if not (
            isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
        ):
            return False
        call = stmt.body[0].value
        if not isinstance(call, cst.Call):
            return False
        if self.is_call_to(call, "torch.cuda.synchronize", "torch_xla.core.xla_model.wait_device_ops"):
            return True
        func = call.func
        if call.args or not (isinstance(func, cst.Attribute) and func.attr.value == "synchronize"):
            return False
        owner = func.value
        if isinstance(owner, cst.Name):
            return owner.value in events
        return isinstance(owner, cst.Call) and self.is_call_to(
            owner, "torch.cuda.current_stream", "torch.cuda.default_stream"
        )

    def _binds(self, name: cst.Name) -> bool:
        parent = self.parent(name)
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.WithItem, cst.AsName))

    def _timer_edit(self, name: cst.Name, events: dict[str, cst.SimpleStatementLine]):
        """True for the event's own assignment; (node, replacement) for a use that has a host-timer form; None."""
        parent = self.parent(name)
        if isinstance(parent, cst.AssignTarget):
            value = self.parent(parent).value
            return (
                True if isinstance(value, cst.Call) and "torch.cuda.Event" in self.qualified_names(value.func) else None
            )
        if isinstance(parent, cst.Arg):
            call = self.parent(parent)
            receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
            if isinstance(receiver, cst.Name) and receiver.value in events:
                return True  # the argument of `a.elapsed_time(b)`: the receiver's edit covers it
            return None
        if not (isinstance(parent, cst.Attribute) and parent.value is name):
            return None
        call = self.parent(parent)
        if not isinstance(call, cst.Call) or call.func is not parent:
            return None
        method = parent.attr.value
        if method == "elapsed_time":
            args = positional_args(call)
            if len(call.args) != 1 or len(args) != 1:
                return None
            other = args[0].value
            if not (isinstance(other, cst.Name) and other.value in events):
                return None
            replacement = expr(f"({other.value} - {name.value}) * 1000")
            if not isinstance(self.parent(call), BARE_EXPRESSION_PARENTS):
                replacement = parenthesized(replacement)
            return call, replacement
        line = self.parent(self.parent(call))
        is_statement = (
            isinstance(self.parent(call), cst.Expr)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        )
        if call.args or not is_statement:
            return None
        if method == "record":
            code = f"torch_xla.sync()\nxm.wait_device_ops()\n{name.value} = time.perf_counter()\n"
            new = statements(code)
            new[0] = new[0].with_changes(leading_lines=line.leading_lines)
            return line, cst.FlattenSentinel(new)
        if method == "synchronize":
            return line, statements("xm.wait_device_ops()\n")[0].with_changes(leading_lines=line.leading_lines)
        return None


SUBPROCESS_CALLS = frozenset(
    {
        "subprocess.run",
        "subprocess.call",
        "subprocess.check_call",
        "subprocess.check_output",
        "subprocess.Popen",
        "subprocess.getoutput",
        "subprocess.getstatusoutput",
        "os.system",
        "os.popen",
        "shutil.which",
    }
)


def _program_of(node: cst.CSTNode) -> str | None:
    """The program a subprocess call starts: the first list element or the first word of a command string."""
    if isinstance(node, (cst.List, cst.Tuple)) and node.elements:
        node = node.elements[0].value
    text = string_value(node)
    if isinstance(node, cst.ConcatenatedString):
        text = string_value(node.left)
    if not text or not text.split():
        return None
    return text.split()[0].rsplit("/", 1)[-1]


class NvidiaSmi(Rule):
    code = "XLA209"
    needs = ("nvidia-smi",)
    title = "`nvidia-smi` does not exist on a TPU host"
    category = "C2"
    fix = "manual"
    detects = (
        '`subprocess.run/call/check_output/Popen(["nvidia-smi", ...])`, `os.system("nvidia-smi ...")`, '
        '`os.popen(...)`, `shutil.which("nvidia-smi")`.'
    )
    why = (
        "A TPU VM has no NVIDIA tools: the call raises `FileNotFoundError: [Errno 2] No such file or directory: "
        "'nvidia-smi'` (list form), or the shell prints `nvidia-smi: not found` and the parsed output is empty. "
        "The TPU counterpart is the `tpu-info` CLI (installed by `torch_xla[tpu]`), or, in-process, "
        "`xm.get_memory_info(torch_xla.device())` for HBM use (TPU only; it raises on PJRT CPU)."
    )
    before = (
        "import subprocess\n\n"
        'out = subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv"])\n'
    )
    message = "`nvidia-smi` is missing on TPU hosts; use `tpu-info` or `xm.get_memory_info(torch_xla.device())`"
    symptoms = ("FileNotFoundError: [Errno 2] No such file or directory: 'nvidia-smi'", "nvidia-smi: not found")
    references = ("torch_xla setup.py extras 'tpu' (tpu-info)", "torch_xla/core/xla_model.py get_memory_info")
    valid = ('import subprocess\nsubprocess.run(["tpu-info"])\n', 'import os\nos.system("echo nvidia-smi")\n')

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & SUBPROCESS_CALLS:
            return
        args = positional_args(node)
        first = args[0].value if args else getattr(keyword_arg(node, "args") or keyword_arg(node, "cmd"), "value", None)
        if first is not None and _program_of(first) == "nvidia-smi":
            self.report(node)


# --- matmul precision ------------------------------------------------------------------
TF32_MATMUL = "torch.backends.cuda.matmul.allow_tf32"
TF32_CUDNN = "torch.backends.cudnn.allow_tf32"
TF32_FLAGS = frozenset({TF32_MATMUL, TF32_CUDNN})


class Tf32Flags(Rule):
    code = "XLA210"
    needs = ("allow_tf32",)
    title = "TF32 switches do not set TPU matmul precision"
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = (
        "`torch.backends.cuda.matmul.allow_tf32 = True|False` and `torch.backends.cudnn.allow_tf32 = True|False` "
        "(`torch.set_float32_matmul_precision(...)` is XLA504)."
    )
    why = (
        "XLA ignores them. On TPU an fp32 matmul/conv runs by default as ONE bf16 pass (~8 mantissa bits) — less "
        "precise than TF32 (10 bits) — so code that asked for full fp32 (`allow_tf32 = False`) silently drifts "
        "from its GPU reference. The XLA switch is `torch_xla.backends.set_mat_mul_precision('default'|'high'|"
        "'highest')` (1, 3 or 6 bf16 passes), one setting for matmuls and convolutions, set once at start. "
        "Mapping: `allow_tf32=True` -> 'high' (at least TF32 accuracy), `allow_tf32=False` -> 'highest'. A flag "
        "whose precision another setting of the same block already gives is removed. Unsafe: 'high'/'highest' "
        "make matmuls 3-6x slower than the TPU default; pick 'default' if speed matters more than parity."
    )
    before = "import torch\n\ntorch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = True\n"
    after = 'import torch_xla.backends\n\ntorch_xla.backends.set_mat_mul_precision("high")\n'
    message = "TF32 flags do nothing on TPU (default: one bf16 pass); use `torch_xla.backends.set_mat_mul_precision`"
    symptoms = ("allclose failures between TPU and GPU fp32 results", "loss drift vs the GPU reference")
    references = ("torch_xla/backends/__init__.py", "pytorch/xla #8811", "tutorials/precision_tutorial")
    valid = (
        "import torch_xla.backends\ntorch_xla.backends.set_mat_mul_precision('highest')\n",
        "import torch\ntorch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False\n",
    )

    def visit_Assign(self, node: cst.Assign) -> None:
        names = set().union(*(self.qualified_names(t.target) for t in node.targets)) & TF32_FLAGS
        if not names:
            return
        line = self.parent(node)
        precision = self._flag_precision(node)
        if (
            precision is None
            or len(node.targets) != 1
            or not isinstance(line, cst.SimpleStatementLine)
            or len(line.body) != 1
        ):
            self.report(node, f"{self.message} (`allow_tf32=True` ~ 'high', `False` ~ 'highest')")
            return
        other = self._other_setting(line, TF32_CUDNN in names)
        if other == precision:
            self.report(line, f"the '{precision}' precision set in this block covers this flag; drop it", REMOVE)
        elif other is not None:
            self.report(
                node,
                f"XLA has one precision for matmuls and convolutions; this block asks for '{other}' and "
                f"'{precision}': keep one `torch_xla.backends.set_mat_mul_precision(...)`",
            )
        else:
            call = cst.Expr(expr(f'{SET_MATMUL_PRECISION}("{precision}")'))
            self.report(line, replacement=line.with_changes(body=[call]), imports=(IMPORT_XLA_BACKENDS,))

    def _flag_precision(self, node: cst.Assign) -> str | None:
        if is_literal(node.value, "True"):
            return "high"
        if is_literal(node.value, "False"):
            return "highest"
        return None

    def _other_setting(self, line: cst.SimpleStatementLine, is_cudnn: bool) -> str | None:
        """The XLA precision another statement of the block sets (for a cuDNN flag: the matmul flag too)."""
        block = block_of(self, line)
        for stmt in block.body if block is not None else ():
            if stmt is line or not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                continue
            small = stmt.body[0]
            if isinstance(small, cst.Assign) and is_cudnn:
                if any(TF32_MATMUL in self.qualified_names(t.target) for t in small.targets):
                    return self._flag_precision(small)
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                call = small.value
                args = positional_args(call)
                value = string_value(args[0].value) if args else None
                if self.is_call_to(call, "torch.set_float32_matmul_precision"):
                    return MATMUL_PRECISIONS.get(value or "")
                if self.is_call_to(call, SET_MATMUL_PRECISION):
                    return value
        return None
