"""C2 — CUDA / device assumptions: device handles, CUDA-only calls, device-type checks."""

from __future__ import annotations

import libcst as cst

from ..analysis.steps import training_loop
from ..cst_helpers import (
    DATALOADERS,
    SCOPES,
    add_kwarg,
    code_of,
    dotted,
    drop_args,
    find_nodes,
    has_star_args,
    is_literal,
    kwarg,
    same_quotes,
    whole_statement,
    with_commas,
)
from ..rule import (
    IMPORT_TORCH_XLA,
    IMPORT_XM,
    REMOVE,
    Rule,
    expr,
    is_cuda_string,
    keyword_arg,
    positional_args,
    register,
    string_value,
)

XLA_DEVICE = "torch_xla.device()"


@register
class CudaMethod(Rule):
    code = "XLA201"
    title = "`.cuda()` moves to a GPU that a TPU host does not have"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "Calls of the `.cuda()` method on tensors and modules, with or without a device index."
    why = (
        "A TPU VM has no NVIDIA driver: with the CUDA build of torch, `.cuda()` raises "
        "`RuntimeError: Found no NVIDIA driver on your system`. On XLA the device is `torch_xla.device()`."
    )
    before = "x = x.cuda()\nmodel.cuda(0)\n"
    after = "import torch_xla\n\nx = x.to(torch_xla.device())\nmodel.to(torch_xla.device())\n"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("pytorch/xla docs: migration-to-xla-on-tpus.md",)
    message = "`.cuda()` targets a GPU; move to `torch_xla.device()`"
    valid = ("import torch\nx = torch.cuda.is_initialized\n", "cuda = make()\ncuda.to(dev)\n")

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "cuda"):
            return
        if "torch.cuda" in self.qualified_names(func):  # the module, not the method
            return
        kept = [a for a in node.args if a.keyword is not None and a.keyword.value == "non_blocking"]
        args = [cst.Arg(expr(XLA_DEVICE)), *kept]
        replacement = node.with_changes(func=func.with_changes(attr=cst.Name("to")), args=with_commas(args))
        self.report(node, replacement=replacement, imports=(IMPORT_TORCH_XLA,))


@register
class CudaDeviceString(Rule):
    code = "XLA202"
    title = "Device given as the string `\"cuda\"`"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.device(\"cuda\")`, `torch.device(\"cuda\", 0)`, `.to(\"cuda:0\")` and `device=\"cuda\"` keyword "
        "arguments of tensor factories and `.to()`."
    )
    why = (
        "There is no CUDA device on a TPU host: allocation fails with `Found no NVIDIA driver`, "
        "or, behind a fallback, the code silently runs on the CPU."
    )
    before = "import torch\n\nd = torch.device('cuda:0')\ny = x.to('cuda')\nz = torch.zeros(3, device='cuda')\n"
    after = (
        "import torch\nimport torch_xla\n\nd = torch_xla.device()\ny = x.to(torch_xla.device())\n"
        "z = torch.zeros(3, device=torch_xla.device())\n"
    )
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("pytorch/xla docs: migration-to-xla-on-tpus.md",)
    message = "CUDA device string; use `torch_xla.device()`"
    valid = ("print('cuda')\n", "# runs on cuda\nx = 1\n", "name = 'cuda'\n")

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.device"):
            args = positional_args(node)
            type_arg = args[0].value if args else getattr(keyword_arg(node, "type"), "value", None)
            if is_cuda_string(type_arg):
                self.report(node, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))
            return
        device_kw = keyword_arg(node, "device")
        if device_kw is not None and is_cuda_string(device_kw.value):
            self.report(device_kw.value, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "to":
            args = positional_args(node)
            if args and is_cuda_string(args[0].value):
                self.report(args[0].value, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))


@register
class CudaIsAvailableFallback(Rule):
    code = "XLA203"
    title = "`torch.cuda.is_available()` fallback trains on the CPU"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.cuda.is_available()` used to pick a device (`'cuda' if torch.cuda.is_available() else 'cpu'`, "
        "`torch.device(...)` around it) or in any other condition."
    )
    why = (
        "On a TPU host `torch.cuda.is_available()` is False, so the fallback picks the CPU and the whole "
        "run trains on the host CPU, slowly, with exit code 0 — a silent failure."
    )
    before = "import torch\n\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
    after = "import torch\nimport torch_xla\n\ndevice = torch_xla.device()\n"
    references = ("xla_migration_facts C2: is_available() fallback",)
    message = "`torch.cuda.is_available()` is False on TPU: this picks the CPU silently"
    valid = ("import torch_xla\ndevice = torch_xla.device()\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.device"):
            args = positional_args(node)
            if args and self._is_fallback(args[0].value):
                self.report(node, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))
            return
        if self.is_call_to(node, "torch.cuda.is_available"):
            parent = self.parent(node)
            if isinstance(parent, cst.IfExp) and self._is_fallback(parent):
                return  # reported on the IfExp / torch.device call
            self.report(
                node,
                "`torch.cuda.is_available()` is False on TPU; branch on the XLA device instead "
                "(e.g. `torch_xla.device()`), or the CPU branch runs silently",
            )

    def visit_IfExp(self, node: cst.IfExp) -> None:
        if not self._is_fallback(node):
            return
        parent = self.parent(self.parent(node))  # IfExp -> Arg -> Call
        if isinstance(parent, cst.Call) and self.is_call_to(parent, "torch.device"):
            return
        self.report(node, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))

    def _is_fallback(self, node: cst.CSTNode) -> bool:
        return (
            isinstance(node, cst.IfExp)
            and self.is_call_to(node.test, "torch.cuda.is_available")
            and (is_cuda_string(node.body) or self.is_call_to(node.body, "torch.device"))
        )


@register
class CudaSynchronize(Rule):
    code = "XLA204"
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
    after = "import torch\nimport torch_xla.core.xla_model as xm\n\nxm.wait_device_ops()\n"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("torch_xla/core/xla_model.py: wait_device_ops",)
    message = "`torch.cuda.synchronize()` fails without a GPU; use `xm.wait_device_ops()`"

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.cuda.synchronize"):
            self.report(node, replacement=expr("xm.wait_device_ops()"), imports=(IMPORT_XM,))


@register
class CudnnFlags(Rule):
    code = "XLA205"
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
    after = "import torch\nx = 1\n"
    message = "cuDNN flag has no effect on XLA; remove it"

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            names = self.qualified_names(target.target) - TF32_FLAGS  # allow_tf32 is XLA210's
            if any(n.startswith("torch.backends.cudnn.") for n in names):
                stmt = self.parent(node)
                if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                    self.report(stmt, replacement=REMOVE)
                else:
                    self.report(node)
                return


# --- small CST helpers shared by the C2 and C3 rules --------------------------------


def block_of(rule: Rule, stmt: cst.CSTNode) -> cst.IndentedBlock | cst.Module | None:
    parent = rule.parent(stmt)
    return parent if isinstance(parent, (cst.IndentedBlock, cst.Module)) else None


def calls_in(rule: Rule, root: cst.CSTNode, names: set[str] | frozenset[str]) -> list[cst.Call]:
    return [c for c in find_nodes(root, cst.Call, enter_root=False) if rule.qualified_names(c.func) & names]


def bound_names(root: cst.CSTNode) -> set[str]:
    """Names (and dotted attribute targets) that statements under `root` assign, import or define."""
    bound: set[str] = set()

    def targets(node: cst.CSTNode) -> None:
        if isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                targets(element.value)
        elif isinstance(node, cst.StarredElement):
            targets(node.value)
        elif (name := dotted(node)) is not None:
            bound.add(name)

    kinds = (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.AsName, cst.NamedExpr)
    for node in find_nodes(root, *kinds, enter_root=False):
        if isinstance(node, cst.AssignTarget):
            targets(node.target)
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For, cst.NamedExpr)):
            targets(node.target)
        elif isinstance(node, cst.AsName):
            targets(node.name)
    for node in find_nodes(root, cst.Import, cst.ImportFrom, cst.FunctionDef, cst.ClassDef, enter_root=False):
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            bound.add(node.name.value)
        elif not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                if alias.asname is None:
                    bound.add((dotted(alias.name) or "").split(".")[0])
    return bound


def used_names(root: cst.CSTNode) -> set[str]:
    """Names and dotted chains read under `root` (`self.model.to(dev)`: self, self.model, self.model.to, dev)."""
    not_reads = {id(a.attr) for a in find_nodes(root, cst.Attribute)}
    not_reads |= {id(a.keyword) for a in find_nodes(root, cst.Arg) if a.keyword is not None}
    used = set()
    for node in find_nodes(root, cst.Name, cst.Attribute):
        name = dotted(node)
        if name is not None and id(node) not in not_reads:
            used.add(name)
    return used


# --- seeding ---------------------------------------------------------------------------
TORCH_SEEDS = frozenset({"torch.manual_seed", "torch.random.manual_seed"})
CUDA_SEEDS = frozenset(
    {
        "torch.cuda.manual_seed",
        "torch.cuda.manual_seed_all",
        "torch.cuda.random.manual_seed",
        "torch.cuda.random.manual_seed_all",
    }
)
# Calls that already seed the XLA generator (accelerate's set_seed calls xm.set_rng_state).
XLA_SEEDS = frozenset(
    {
        "torch_xla.manual_seed",
        "torch_xla.torch_xla.manual_seed",
        "torch_xla.core.xla_model.set_rng_state",
        "accelerate.utils.set_seed",
        "accelerate.utils.random.set_seed",
    }
)


def seed_argument(call: cst.Call) -> cst.BaseExpression | None:
    args = positional_args(call)
    if args:
        return args[0].value
    kw = keyword_arg(call, "seed")
    return kw.value if kw is not None else None


class AddXlaSeed(Rule):
    """Shared detector: a seeding call that leaves the XLA generator unseeded gets `torch_xla.manual_seed` after it."""

    seeds: frozenset[str] = TORCH_SEEDS
    # Calls in the same block that mean "nothing to add here" (XLA207 turns CUDA seeds into XLA seeds).
    already_seeded: frozenset[str] = XLA_SEEDS | CUDA_SEEDS

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & self.seeds:
            return
        stmt = self.statement_of(node)
        block = block_of(self, stmt) if stmt is not None else None
        if block is not None and any(calls_in(self, s, self.already_seeded) for s in block.body):
            return  # seeded here already, or XLA207 turns the CUDA seed into the XLA one
        seed = seed_argument(node)
        line = whole_statement(self, node)
        if seed is None or line is None or find_nodes(seed, cst.Call):
            self.report(node, f"{self.message}: add `torch_xla.manual_seed(seed)` next to it")
            return
        xla_seed = cst.SimpleStatementLine(body=[cst.Expr(cst.Call(expr("torch_xla.manual_seed"), [cst.Arg(seed)]))])
        self.report(line, replacement=cst.FlattenSentinel([line, xla_seed]), imports=(IMPORT_TORCH_XLA,))


@register
class TorchSeedOnly(AddXlaSeed):
    code = "XLA206"
    title = "`torch.manual_seed()` does not seed the XLA generator"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.manual_seed(s)` with no `torch_xla.manual_seed` / `xm.set_rng_state` / `torch.cuda.manual_seed*` "
        "call in the same block."
    )
    why = (
        "XLA tensors draw random numbers from the XLA device generator, which `torch.manual_seed` leaves alone: "
        "dropout masks, `torch.randn(..., device=dev)` and random init on the device change from run to run, "
        "so a 'seeded' TPU run is not reproducible and cannot be compared with its reference (no error). "
        "Adding `torch_xla.manual_seed(s)` right after keeps the CPU seeding and seeds the device too."
    )
    before = "import torch\n\ntorch.manual_seed(42)\n"
    after = "import torch\nimport torch_xla\n\ntorch.manual_seed(42)\ntorch_xla.manual_seed(42)\n"
    message = "`torch.manual_seed` does not seed the XLA RNG; also call `torch_xla.manual_seed(seed)`"
    symptoms = ("rand differs across runs despite torch.manual_seed", "non-deterministic dropout on TPU")
    references = ("pytorch/xla #2092", "pytorch/xla PR #7340 (torch_xla.manual_seed)")
    valid = (
        "import torch\nimport torch_xla\ntorch.manual_seed(0)\ntorch_xla.manual_seed(0)\n",
        "import torch\nimport torch_xla.core.xla_model as xm\ndef seed(s):\n    torch.manual_seed(s)\n    xm.set_rng_state(s)\n",
        "from accelerate.utils import set_seed\nimport torch\ntorch.manual_seed(1)\nset_seed(1)\n",
    )


@register
class CudaSeed(Rule):
    code = "XLA207"
    title = "`torch.cuda.manual_seed(_all)()` is a silent no-op on TPU"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.cuda.manual_seed(s)` and `torch.cuda.manual_seed_all(s)`."
    why = (
        "Without a GPU the call only queues a seed for a CUDA generator that never exists: nothing is seeded, no "
        "error, and device-side randomness (dropout, random init on the device) differs between runs. "
        "The device generator on TPU is seeded by `torch_xla.manual_seed(s)`."
    )
    before = "import torch\n\ntorch.manual_seed(0)\ntorch.cuda.manual_seed_all(0)\n"
    after = "import torch\nimport torch_xla\n\ntorch.manual_seed(0)\ntorch_xla.manual_seed(0)\n"
    message = "`torch.cuda.manual_seed*` seeds nothing on TPU; use `torch_xla.manual_seed(seed)`"
    symptoms = ("rand differs across runs despite torch.cuda.manual_seed_all",)
    references = ("pytorch/xla #2092", "pytorch/xla PR #7340")
    valid = ("import torch_xla\ntorch_xla.manual_seed(0)\n", "import torch\ntorch.manual_seed(0)\n")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & CUDA_SEEDS:
            return
        line = whole_statement(self, node)
        block = block_of(self, line) if line is not None else None
        if line is None or block is None:
            self.report(node, replacement=node.with_changes(func=expr("torch_xla.manual_seed")), imports=(IMPORT_TORCH_XLA,))
            return
        # One seed per block: the first CUDA seed becomes the XLA seed, later ones (or all, when the block
        # already seeds XLA) go away.
        seeds = [s for s in block.body if isinstance(s, cst.SimpleStatementLine) and calls_in(self, s, CUDA_SEEDS)]
        seeded = any(calls_in(self, s, XLA_SEEDS) for s in block.body)
        if seeded or seeds[0] is not line:
            self.report(line, "the XLA generator is already seeded in this block; drop this CUDA seed", REMOVE)
        else:
            self.report(node, replacement=node.with_changes(func=expr("torch_xla.manual_seed")), imports=(IMPORT_TORCH_XLA,))


# --- timing and monitoring -------------------------------------------------------------
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


@register
class CudaEventsAndStreams(Rule):
    code = "XLA208"
    title = "CUDA events, streams and graphs have no XLA counterpart"
    category = "C2"
    fix = "manual"
    detects = (
        "`torch.cuda.Event(...)` (with `.record()` / `.elapsed_time()`), `torch.cuda.Stream` / `stream()` / "
        "`current_stream()`, and CUDA graph capture (`torch.cuda.graph`, `CUDAGraph`, `make_graphed_callables`)."
    )
    why = (
        "They talk to the CUDA runtime: on a TPU host they raise `RuntimeError: Found no NVIDIA driver on your "
        "system` (or, for some, do nothing). Timing with events must become wall-clock timing around a device "
        "barrier — XLA runs lazily, so without `torch_xla.sync()` + `xm.wait_device_ops()` you time the tracing, "
        "not the step. Exclude the first steps: they include compilation."
    )
    before = (
        "import torch\n\nstart = torch.cuda.Event(enable_timing=True)\nend = torch.cuda.Event(enable_timing=True)\n"
        "start.record()\nstep()\nend.record()\ntorch.cuda.synchronize()\nms = start.elapsed_time(end)\n"
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
            self.report(node, f"`{name}` raises or does nothing on TPU; {CUDA_TIMING[name]}")
            return


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


@register
class NvidiaSmi(Rule):
    code = "XLA209"
    title = "`nvidia-smi` does not exist on a TPU host"
    category = "C2"
    fix = "manual"
    detects = (
        "`subprocess.run/call/check_output/Popen([\"nvidia-smi\", ...])`, `os.system(\"nvidia-smi ...\")`, "
        "`os.popen(...)`, `shutil.which(\"nvidia-smi\")`."
    )
    why = (
        "A TPU VM has no NVIDIA tools: the call raises `FileNotFoundError: [Errno 2] No such file or directory: "
        "'nvidia-smi'` (list form), or the shell prints `nvidia-smi: not found` and the parsed output is empty. "
        "The TPU counterpart is the `tpu-info` CLI (installed by `torch_xla[tpu]`), or, in-process, "
        "`xm.get_memory_info(torch_xla.device())` for HBM use (TPU only; it raises on PJRT CPU)."
    )
    before = (
        "import subprocess\n\n"
        "out = subprocess.check_output([\"nvidia-smi\", \"--query-gpu=memory.used\", \"--format=csv\"])\n"
    )
    message = "`nvidia-smi` is missing on TPU hosts; use `tpu-info` or `xm.get_memory_info(torch_xla.device())`"
    symptoms = ("FileNotFoundError: [Errno 2] No such file or directory: 'nvidia-smi'", "nvidia-smi: not found")
    references = ("torch_xla setup.py extras 'tpu' (tpu-info)", "torch_xla/core/xla_model.py get_memory_info")
    valid = ("import subprocess\nsubprocess.run([\"tpu-info\"])\n", "import os\nos.system(\"echo nvidia-smi\")\n")

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
TORCH_PRECISION = {"highest": "highest", "high": "high", "medium": "default"}
SET_PRECISION = "torch_xla.backends.set_mat_mul_precision"
IMPORT_XLA_BACKENDS = ("torch_xla.backends", None, None)


@register
class Tf32Flags(Rule):
    code = "XLA210"
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
    after = "import torch\nimport torch_xla.backends\n\ntorch_xla.backends.set_mat_mul_precision(\"high\")\n"
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
        if precision is None or len(node.targets) != 1 or not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
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
            call = cst.Expr(expr(f'{SET_PRECISION}("{precision}")'))
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
                    return TORCH_PRECISION.get(value or "")
                if self.is_call_to(call, SET_PRECISION):
                    return value
        return None


# --- device counting and selection -----------------------------------------------------
LAUNCHERS = frozenset(
    {
        "torch.multiprocessing.spawn",
        "torch_xla.launch",
        "torch_xla.torch_xla.launch",
        "torch_xla.distributed.xla_multiprocessing.spawn",
    }
)


@register
class CudaDeviceCount(Rule):
    code = "XLA211"
    title = "`torch.cuda.device_count()` is 0 on TPU"
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = "Calls of `torch.cuda.device_count()`."
    why = (
        "It returns 0 without a GPU, so world sizes, per-device batch sizes and `if n > 1:` branches silently take "
        "the wrong value (or divide by zero). `torch_xla.device_count()` counts the XLA devices this process can "
        "address. Unsafe: that call starts the XLA runtime, and a runtime started in the parent makes "
        "`torch_xla.launch` fail (`RuntimeError: Runtime is already initialized. Do not use the XLA device before "
        "calling xmp.spawn.`) — so in files that launch processes xlaport only reports it: read the world size "
        "inside the launched function with `xr.world_size()`."
    )
    before = "import torch\n\nn_gpus = torch.cuda.device_count()\n"
    after = "import torch\nimport torch_xla\n\nn_gpus = torch_xla.device_count()\n"
    message = "`torch.cuda.device_count()` is 0 on TPU; use `torch_xla.device_count()`"
    symptoms = ("ZeroDivisionError: division by zero", "Runtime is already initialized. Do not use the XLA device before calling xmp.spawn.")
    references = ("torch_xla/torch_xla.py device_count", "torch_xla/runtime.py world_size")
    valid = ("import torch_xla\nn = torch_xla.device_count()\n",)

    def __init__(self) -> None:
        super().__init__()
        self.counts: list[cst.Call] = []
        self.launches = False

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if "torch.cuda.device_count" in names:
            self.counts.append(node)
        elif names & LAUNCHERS:
            self.launches = True

    def leave_Module(self, original_node: cst.Module) -> None:
        for call in self.counts:
            if self.launches:
                self.report(
                    call,
                    "`torch.cuda.device_count()` is 0 on TPU, and counting XLA devices before `torch_xla.launch` "
                    "breaks the launch: let the runtime pick one process per chip and read `xr.world_size()` "
                    "inside the launched function",
                )
            else:
                self.report(call, replacement=expr("torch_xla.device_count()"), imports=(IMPORT_TORCH_XLA,))


@register
class CudaSetDevice(Rule):
    code = "XLA212"
    title = "`torch.cuda.set_device()` is not needed on TPU"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.cuda.set_device(local_rank)` statements (per-rank GPU selection)."
    why = (
        "Without a GPU it raises `RuntimeError: Found no NVIDIA driver on your system`. Under `torch_xla.launch` "
        "each process already owns its chip and sees it as `torch_xla.device()` (`xla:0`): the call has no "
        "XLA counterpart and is deleted."
    )
    before = "import torch\n\ntorch.cuda.set_device(local_rank)\nmodel = build()\n"
    after = "import torch\n\nmodel = build()\n"
    message = "`torch.cuda.set_device` raises on TPU; each process already sees its chip as `torch_xla.device()`"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("docs/source/learn/pytorch-on-xla-devices.md (launch)",)
    valid = ("import torch_xla\ndevice = torch_xla.device()\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.cuda.set_device"):
            return
        line = whole_statement(self, node)
        if line is not None:
            self.report(line, replacement=REMOVE)
        else:
            self.report(node)


@register
class CudaCurrentDevice(Rule):
    code = "XLA213"
    title = "`torch.cuda.current_device()` / `torch.cuda.device(i)` select a GPU index"
    category = "C2"
    fix = "manual"
    detects = "Calls of `torch.cuda.current_device()` and `torch.cuda.device(i)` (often as a context manager)."
    why = (
        "Both initialise CUDA: on a TPU host they raise `RuntimeError: Found no NVIDIA driver on your system`. "
        "There is no 'current device' to switch on XLA: each launched process has one chip, `torch_xla.device()`. "
        "Use `xr.local_ordinal()` / `xr.global_ordinal()` where the code wanted the process' index, and drop "
        "`with torch.cuda.device(i):` blocks (keep their body)."
    )
    before = "import torch\n\nrank = torch.cuda.current_device()\n"
    message = "`torch.cuda.current_device()` raises on TPU; use `torch_xla.device()` / `xr.local_ordinal()`"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("torch_xla/runtime.py local_ordinal",)
    valid = ("import torch_xla.runtime as xr\nrank = xr.local_ordinal()\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.cuda.current_device"):
            self.report(node)
        elif self.is_call_to(node, "torch.cuda.device"):
            self.report(node, "`torch.cuda.device(i)` raises on TPU; drop it (each process sees its chip as `torch_xla.device()`)")


# --- data loading -------------------------------------------------------------------------


@register
class PinMemory(Rule):
    code = "XLA214"
    title = "`DataLoader(pin_memory=True)` pins for a GPU that is not there"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`DataLoader(..., pin_memory=<anything but False>)` and `pin_memory_device=...`."
    why = (
        "Pinned host memory speeds up CUDA copies only. On a TPU host torch warns `UserWarning: 'pin_memory' "
        "argument is set as true but no accelerator is found, then device pinned memory won't be used` and "
        "pins nothing. Host-to-device prefetch on XLA is done by `pl.MpDeviceLoader(loader, device)`. "
        "Dropping the keyword keeps the behaviour and removes the warning."
    )
    before = "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=32, pin_memory=True)\n"
    after = "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=32)\n"
    message = "`pin_memory` has no effect on TPU; drop it (MpDeviceLoader prefetches to the device)"
    symptoms = ("UserWarning: 'pin_memory' argument is set as true but no accelerator is found",)
    references = ("torch_xla/distributed/parallel_loader.py",)
    valid = ("from torch.utils.data import DataLoader\nloader = DataLoader(ds, pin_memory=False)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & DATALOADERS:
            return
        drop = [a for a in (keyword_arg(node, "pin_memory"), keyword_arg(node, "pin_memory_device")) if a is not None]
        drop = [a for a in drop if not is_literal(a.value, "False") and string_value(a.value) != ""]
        if drop:
            self.report(node, replacement=drop_args(node, drop))


# --- the optimizer must be built after the model moves ---------------------------------
OPTIMIZER_MODULES = ("torch.optim.", "torch_xla.amp.syncfree.", "bitsandbytes.optim.", "transformers.optimization.")
NOT_OPTIMIZERS = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.", "torch.optim.Optimizer")
DTYPE_NAMES = frozenset(
    f"torch.{n}"
    for n in (
        "float16 half bfloat16 float32 float float64 double int8 uint8 int16 short int32 int int64 long bool "
        "complex64 complex128 float8_e4m3fn float8_e5m2"
    ).split()
)


def is_optimizer(rule: Rule, call: cst.Call) -> bool:
    for name in rule.qualified_names(call.func):
        last = name.rsplit(".", 1)[-1]
        if name.startswith(OPTIMIZER_MODULES) and not name.startswith(NOT_OPTIMIZERS) and last[:1].isupper():
            return True
        if name in {"transformers.AdamW", "transformers.Adafactor"}:
            return True
    return False


def parameter_owners(call: cst.Call) -> list[str]:
    """`model` for every `model.parameters()` / `model.named_parameters()` inside `call`."""
    owners = []
    for inner in find_nodes(call, cst.Call):
        func = inner.func
        if isinstance(func, cst.Attribute) and func.attr.value in {"parameters", "named_parameters"}:
            owner = dotted(func.value)
            if owner is not None:
                owners.append(owner)
    return owners


def related(a: str, b: str) -> bool:
    """One names the other or a submodule of it (`model` / `model.encoder`)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def moved_module(rule: Rule, call: cst.Call) -> str | None:
    """`model` when `call` is `model.to(<device>)` or `model.cuda()`; dtype-only or CPU moves do not count."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in {"to", "cuda"}:
        return None
    owner = dotted(func.value)
    if owner is None or rule.qualified_names(func.value):  # `torch.cuda`, imported modules
        return None
    if func.attr.value == "cuda":
        return owner
    args = positional_args(call)
    target = args[0].value if args else getattr(keyword_arg(call, "device"), "value", None)
    if target is None or rule.qualified_names(target) & DTYPE_NAMES:
        return None
    if string_value(target) == "cpu":
        return None
    if rule.is_call_to(target, "torch.device") and positional_args(target):
        if string_value(positional_args(target)[0].value) == "cpu":
            return None
    return owner


@register
class OptimizerBeforeMove(Rule):
    code = "XLA215"
    title = "Optimizer built before the model moves to the XLA device trains nothing"
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = (
        "`opt = torch.optim.X(model.parameters(), ...)` followed, later in the same function or module, by "
        "`model.to(device)` / `model = model.to(device)` / `model.cuda()` of that model (or of a module that "
        "contains the optimized one), with no move before the optimizer."
    )
    why = (
        "On CUDA `.to()` keeps the Parameter objects and swaps their data, so the order does not matter there. "
        "Moving a CPU module to XLA creates NEW Parameter objects: the optimizer keeps the old CPU tensors, "
        "`optimizer.step()` updates tensors the model no longer uses, and the model never learns — the loss stays "
        "flat, exit code 0, no error (accelerate and the HF Trainer raise `ValueError: The model and the optimizer "
        "parameters are not on the same device` for this). The fix moves the model first. Unsafe: it reorders "
        "statements; xlaport only rewrites when the move is a plain statement of the same block and nothing it "
        "uses is assigned in between — other layouts are reported for a manual fix."
    )
    before = (
        "import torch\n\n"
        "model = Net()\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
        "model.to(device)\n"
    )
    after = (
        "import torch\n\n"
        "model = Net()\n"
        "model.to(device)\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    )
    message = "optimizer built before the model moves to the device: it updates stale CPU parameters"
    symptoms = (
        "loss does not decrease on TPU",
        "ValueError: The model and the optimizer parameters are not on the same device",
    )
    references = ("pytorch/xla #1623", "pytorch/xla #3675", "accelerate accelerator.py _get_devices check")
    valid = (
        "import torch\nmodel = Net()\nmodel.to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "import torch\ndef f(model, device):\n    model = model.to(device)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    model.to(device)\n    return opt\n",
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.to(torch.bfloat16)\n"
        "model.to('cpu')\nx.to(device)\n",
        "import torch\nmodel = Net().to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.to(device)\n",
        "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nsched = torch.optim.lr_scheduler.StepLR(opt, 1)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not is_optimizer(self, node):
            return
        owners = parameter_owners(node)
        if not owners:
            return
        levels = self._levels(node)
        if any(self._moved_before(stmt, owners) for block, i in levels for stmt in block.body[:i]):
            return
        for block, i in levels:
            for j in range(i + 1, len(block.body)):
                moves = [c for c in find_nodes(block.body[j], cst.Call, enter_root=False) if self._moves(c, owners)]
                if moves:
                    self._report(node, block, i, j, moves[0])
                    return

    def _levels(self, node: cst.CSTNode) -> list[tuple[cst.IndentedBlock | cst.Module, int]]:
        """(block, index of the statement holding `node`) from the innermost block out to the function/module."""
        levels, child = [], node
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.IndentedBlock, cst.Module)):
                levels.append((anc, next(k for k, s in enumerate(anc.body) if s is child)))
            if isinstance(anc, (*SCOPES, cst.Module)):
                break
            child = anc
        return levels

    def _moves(self, call: cst.Call, owners: list[str]) -> bool:
        moved = moved_module(self, call)
        return moved is not None and any(related(moved, o) for o in owners)

    def _moved_before(self, stmt: cst.CSTNode, owners: list[str]) -> bool:
        if any(self._moves(c, owners) for c in find_nodes(stmt, cst.Call, enter_root=False)):
            return True
        # `model = Net().to(device)`: the module is created on the device
        for assign in find_nodes(stmt, cst.Assign, enter_root=False):
            names = [dotted(t.target) for t in assign.targets]
            if any(n and any(related(n, o) for o in owners) for n in names) and self._creates_on_device(assign.value):
                return True
        return False

    def _creates_on_device(self, value: cst.BaseExpression) -> bool:
        func = value.func if isinstance(value, cst.Call) else None
        return isinstance(func, cst.Attribute) and func.attr.value in {"to", "cuda"} and dotted(func.value) is None

    def _report(self, opt: cst.Call, block, i: int, j: int, move: cst.Call) -> None:
        move_line = self.position(move).start.line
        where = f"`{code_of(move.func.value)}` moves at line {move_line}"
        stmt = block.body[j]
        blocker = self._why_not_movable(block, i, j, move)
        if blocker:
            self.report(
                opt,
                f"{self.message} ({where}); build the optimizer after the move, or move the model first "
                f"(not rewritten: {blocker})",
            )
            return
        body = list(block.body)
        comments = [line for line in stmt.leading_lines if line.comment is not None]
        blanks = [line for line in stmt.leading_lines if line.comment is None]
        new_body = [*body[:i], stmt.with_changes(leading_lines=comments), *body[i:j], *body[j + 1 :]]
        if j + 1 < len(body) and blanks:
            after = body[j + 1]
            new_body[j + 1] = after.with_changes(leading_lines=[*blanks, *after.leading_lines])
        self.report(
            opt,
            f"{self.message} ({where}); move the model before building the optimizer",
            replacement=block.with_changes(body=new_body),
            target=block,
        )

    def _why_not_movable(self, block, i: int, j: int, move: cst.Call) -> str | None:
        stmt = block.body[j]
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return "the move is not a plain statement of the same block"
        small = stmt.body[0]
        plain = isinstance(small, cst.Expr) and small.value is move
        reassigned = (
            isinstance(small, cst.Assign)
            and small.value is move
            and len(small.targets) == 1
            and dotted(small.targets[0].target) == dotted(move.func.value)
        )
        if not (plain or reassigned):
            return "the move is part of a larger statement"
        changed = set().union(*(bound_names(s) for s in block.body[i:j]))
        clash = sorted(used_names(stmt) & changed)
        if clash:
            return f"`{'`, `'.join(clash)}` is assigned between the optimizer and the move"
        return None


# --- compile, optimizer and clipping flags ------------------------------------------------
@register
class TorchCompileInductor(Rule):
    code = "XLA216"
    title = "`torch.compile` with the default (inductor) backend fails on XLA tensors"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.compile(fn)` without `backend=`, with `backend=\"inductor\"`, and the bare `@torch.compile` decorator."
    why = (
        "Inductor generates Triton/C++ kernels for CUDA/CPU; given XLA tensors it fails with "
        "`InductorError: KeyError: 'xla'`. The Dynamo backend for XLA is `backend=\"openxla\"`. Inductor-only "
        "options (`mode=`, `options=`) are then ignored with a warning. For training, plain lazy tensors (or "
        "`torch_xla.compile`) are usually faster than Dynamo, which traces forward and backward separately."
    )
    before = "import torch\n\nmodel = torch.compile(model)\n"
    after = "import torch\n\nmodel = torch.compile(model, backend=\"openxla\")\n"
    message = "`torch.compile` uses inductor, which fails on XLA tensors; use `backend=\"openxla\"`"
    symptoms = ("InductorError: KeyError: 'xla'",)
    references = ("docs/source/perf/dynamo.md",)
    valid = (
        "import torch\nm = torch.compile(model, backend='openxla')\n",
        "import torch\nm = torch.compile(model, backend=my_backend)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.compile"):
            return
        backend = keyword_arg(node, "backend")
        if backend is None:
            if has_star_args(node):
                return
            self.report(node, replacement=add_kwarg(node, "backend", cst.SimpleString('"openxla"')))
        elif string_value(backend.value) == "inductor":
            self.report(backend.value, replacement=same_quotes(backend.value, "openxla"))

    def visit_Decorator(self, node: cst.Decorator) -> None:
        if not isinstance(node.decorator, cst.Call) and "torch.compile" in self.qualified_names(node.decorator):
            call = cst.Call(node.decorator, [kwarg("backend", cst.SimpleString('"openxla"'))])
            self.report(node.decorator, replacement=call)


@register
class FusedOptimizer(Rule):
    code = "XLA217"
    title = "`fused=True` optimizers do not run on XLA tensors"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.optim.Adam/AdamW/SGD/...(..., fused=<anything but False/None>)`."
    why = (
        "The fused kernels exist for CUDA/CPU/MPS only; the first `step()` raises ``RuntimeError: `fused=True` "
        "requires all the params to be floating point Tensors of supported devices: ['mps', 'cuda', 'xpu', 'hpu', "
        "'cpu', 'mtia', 'privateuseone'] but torch.float32 and xla``. Without the flag the optimizer does the same "
        "math (XLA fuses the update into the step graph anyway)."
    )
    before = "import torch\n\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)\n"
    after = "import torch\n\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4)\n"
    message = "`fused=True` fails on XLA tensors; drop it"
    symptoms = ("RuntimeError: `fused=True` requires all the params to be floating point Tensors of supported devices",)
    references = ("torch_xla/amp/syncfree/",)
    valid = ("import torch\nopt = torch.optim.AdamW(model.parameters(), fused=False)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        fused = keyword_arg(node, "fused")
        if fused is not None and not is_literal(fused.value, "False", "None") and is_optimizer(self, node):
            self.report(node, replacement=drop_args(node, [fused]))


CLIP_FUNCTIONS = frozenset(
    {
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_norm",
        "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        "torch.nn.utils.clip_grad.clip_grad_value_",
    }
)


@register
class ForeachClip(Rule):
    code = "XLA218"
    title = "`clip_grad_norm_(..., foreach=True)` raises on XLA"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`clip_grad_norm_` / `clip_grad_value_` with `foreach=<anything but False/None>`."
    why = (
        "`import torch_xla` replaces `clip_grad_norm_` with a host-sync-free version that rejects foreach "
        "(`RuntimeError: foreach=True is not supported with XLA`), and `clip_grad_value_` fails with "
        "`foreach=True was passed, but can't use the foreach API on xla tensors`. The flag is only a CUDA speed "
        "knob: dropping it gives the same clipping."
    )
    before = "import torch\n\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)\n"
    after = "import torch\n\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    message = "`foreach=True` raises with XLA tensors; drop it"
    symptoms = (
        "RuntimeError: foreach=True is not supported with XLA",
        "foreach=True was passed, but can't use the foreach API on xla tensors",
    )
    references = ("torch_xla/_patched_functions.py",)
    valid = ("import torch\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        foreach = keyword_arg(node, "foreach")
        if foreach is not None and not is_literal(foreach.value, "False", "None") and self.qualified_names(node.func) & CLIP_FUNCTIONS:
            self.report(node, replacement=drop_args(node, [foreach]))


@register
class TorchCheckpoint(Rule):
    code = "XLA219"
    title = "`torch.utils.checkpoint` fails (or saves nothing) on XLA"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.utils.checkpoint.checkpoint(fn, *args, ...)` and `checkpoint_sequential(...)`."
    why = (
        "In torch_xla 2.9 the backward of the torch version fails with `AttributeError: module 'torch' has no "
        "attribute 'xla'` (it looks up a device module named after the device type); historically it also saved "
        "no memory because XLA's CSE merged the recomputation back (#3455). "
        "`torch_xla.utils.checkpoint.checkpoint` adds an optimization barrier so the recompute stays. It only has the "
        "reentrant variant: calls with `use_reentrant=False` or other options (and `checkpoint_sequential`) are "
        "reported, not rewritten — with reentrant checkpointing an input must require grad or the segment's "
        "parameters get no gradient."
    )
    before = (
        "import torch\nimport torch.utils.checkpoint\n\n"
        "h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=True)\n"
    )
    after = (
        "import torch\nimport torch.utils.checkpoint\nimport torch_xla.utils.checkpoint\n\n"
        "h = torch_xla.utils.checkpoint.checkpoint(block, h, use_reentrant=True)\n"
    )
    message = "`torch.utils.checkpoint` fails on XLA; use `torch_xla.utils.checkpoint.checkpoint`"
    symptoms = ("AttributeError: module 'torch' has no attribute 'xla'",)
    references = ("torch_xla/utils/checkpoint.py", "pytorch/xla #3455", "huggingface/transformers #29314")
    valid = ("import torch_xla.utils.checkpoint as xc\nh = xc.checkpoint(block, h)\n",)

    XLA_KWARGS = frozenset({"use_reentrant", "preserve_rng_state"})

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if "torch.utils.checkpoint.checkpoint_sequential" in names:
            self.report(node, "`checkpoint_sequential` fails on XLA; checkpoint each segment with `torch_xla.utils.checkpoint.checkpoint`")
            return
        if "torch.utils.checkpoint.checkpoint" not in names:
            return
        reentrant = keyword_arg(node, "use_reentrant")
        kwargs = {a.keyword.value for a in node.args if a.keyword is not None}
        if (reentrant is not None and not is_literal(reentrant.value, "True")) or kwargs - self.XLA_KWARGS or any(
            a.star == "**" for a in node.args
        ):
            self.report(
                node,
                f"{self.message} (reentrant only: with use_reentrant=False / extra options, rewrite by hand and make "
                "sure an input of each segment requires grad)",
            )
            return
        self.report(
            node,
            replacement=node.with_changes(func=expr("torch_xla.utils.checkpoint.checkpoint")),
            imports=(("torch_xla.utils.checkpoint", None, None),),
        )


# --- device-type branches ---------------------------------------------------------------
def _is_cudaish(rule: Rule, node: cst.CSTNode) -> bool:
    if is_cuda_string(node) or (string_value(node) or "").startswith("torch.cuda."):
        return True
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        return any(_is_cudaish(rule, e.value) for e in node.elements)
    return False


def _is_type_probe(node: cst.CSTNode) -> bool:
    """`x.device.type` or `x.type()`."""
    if isinstance(node, cst.Attribute):
        return node.attr.value == "type"
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "type" and not node.args


@register
class CudaTypeCheck(Rule):
    code = "XLA220"
    title = "Device-type checks for CUDA are False for XLA tensors"
    category = "C2"
    fix = "manual"
    detects = (
        "`t.is_cuda`, `t.device.type == \"cuda\"` (also `in (\"cuda\", ...)`), `t.type() == \"torch.cuda.FloatTensor\"` "
        "and `torch.cuda.*Tensor` types."
    )
    why = (
        "An XLA tensor has `is_cuda == False`, `device.type == 'xla'` and `type() == 'torch.xla.FloatTensor'`: "
        "every GPU branch silently takes its CPU/else path on TPU (slow host code, skipped AMP, wrong batch "
        "size). Test for XLA instead (`t.device.type == 'xla'`, `xm.is_xla_tensor(t)`), or drop the branch; "
        "use `.to()`/`.type_as()` rather than `.type(...)` conversions."
    )
    before = "def step(x):\n    if x.is_cuda:\n        return fast(x)\n    return slow(x)\n"
    message = "CUDA device-type check is False for XLA tensors: this takes the non-GPU branch on TPU"
    symptoms = ("is_cuda=False on XLA tensor", "type()=='torch.xla.FloatTensor'")
    references = ("lucidrains/reformer-pytorch #105",)
    valid = (
        "def f(x):\n    return x.device.type == 'xla'\n",
        "import torch\nwith torch.autocast(device_type='cuda'):\n    pass\n",
        "kind = cfg.type == 'cuda_like'\n",
    )

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "is_cuda" and not self.qualified_names(node):
            self.report(node, "`.is_cuda` is False for XLA tensors; use `t.device.type == 'xla'` or `xm.is_xla_tensor(t)`")
            return
        for name in self.qualified_names(node):
            if name.startswith("torch.cuda.") and name.endswith("Tensor") and not isinstance(self.parent(node), cst.Attribute):
                self.report(node, f"`{name}` is a CUDA tensor type; XLA tensors are `torch.xla.*Tensor`: use dtype/device checks")
                return

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(c.comparator for c in node.comparisons)]
        if any(_is_type_probe(o) for o in operands) and any(_is_cudaish(self, o) for o in operands):
            self.report(node)


# --- host work in the step loop -----------------------------------------------------------
@register
class NumpyOfDeviceTensor(Rule):
    code = "XLA221"
    title = "`.numpy()` on a tensor of the training loop fails once it lives on XLA"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`t.numpy()` / `t.detach().numpy()` without `.cpu()` / `.to(...)` in the chain, inside a training-step loop "
        "(where MpDeviceLoader batches and model outputs are XLA tensors after the migration)."
    )
    why = (
        "Converting an XLA tensor raises `TypeError: can't convert xla:0 device type tensor to numpy. Use "
        "Tensor.cpu() to copy the tensor to host memory first.` On GPU such code worked because the tensors were "
        "still CPU tensors (e.g. labels straight from a DataLoader); once MpDeviceLoader puts batches on the device "
        "it breaks. Inserting `.cpu()` is a no-op for CPU tensors. Each such copy is a host sync: move per-step "
        "metrics into `xm.add_step_closure` when speed matters."
    )
    before = (
        "for x, y in loader:\n    loss = step(x, y)\n    loss.backward()\n    opt.step()\n"
        "    preds = out.detach().numpy()\n"
    )
    after = (
        "for x, y in loader:\n    loss = step(x, y)\n    loss.backward()\n    opt.step()\n"
        "    preds = out.detach().cpu().numpy()\n"
    )
    message = "`.numpy()` raises for XLA tensors; copy to the host with `.cpu()` first"
    symptoms = ("TypeError: can't convert xla:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.",)
    references = ("xla_migration_facts C2 .numpy() on device tensors",)
    valid = (
        "for x, y in loader:\n    loss.backward()\n    opt.step()\n    a = loss.detach().cpu().numpy()\n",
        "preds = out.detach().numpy()\n",
        "for x, y in loader:\n    loss.backward()\n    opt.step()\n    a = loss.numpy(force=True)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "numpy") or node.args:
            return
        receiver: cst.CSTNode = func.value
        while True:
            if isinstance(receiver, cst.Call):
                inner = receiver.func
                if isinstance(inner, cst.Attribute) and inner.attr.value in {"cpu", "to"}:
                    return  # already copied to the host
                receiver = inner
            elif isinstance(receiver, (cst.Attribute, cst.Subscript)):
                receiver = receiver.value
            else:
                break
        if self.qualified_names(receiver) or training_loop(self, node) is None:
            return  # `np...`, `torch.from_numpy(...)...`: not a device tensor; outside the loop: unknown
        to_host = cst.Call(cst.Attribute(func.value, cst.Name("cpu")))
        self.report(node, replacement=node.with_changes(func=func.with_changes(value=to_host)))


FACTORIES = frozenset(
    f"torch.{n}" for n in "randn rand randint randperm normal zeros ones empty full arange linspace eye".split()
)


@register
class HostTensorMovedInLoop(Rule):
    code = "XLA222"
    title = "Tensor built on the host then moved, every step"
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = "`torch.randn(...).to(device)` / `torch.zeros(...).cuda()` (tensor factories) inside a training-step loop."
    why = (
        "The factory runs on the CPU and each step pays an extra host-to-device transfer (`TransferToDeviceTime` "
        "grows with steps); the constant also becomes a graph input instead of being generated inside the XLA "
        "graph. Build it on the device: `torch.randn(shape, device=device)`. Unsafe: random factories then draw "
        "from the XLA generator, so the numbers differ from the CPU-generated ones (seed with `torch_xla.manual_seed`)."
    )
    before = (
        "import torch\n\nfor x, y in loader:\n    noise = torch.randn(x.shape).to(device)\n"
        "    loss = model(x + noise, y)\n    loss.backward()\n    opt.step()\n"
    )
    after = (
        "import torch\n\nfor x, y in loader:\n    noise = torch.randn(x.shape, device=device)\n"
        "    loss = model(x + noise, y)\n    loss.backward()\n    opt.step()\n"
    )
    message = "tensor created on the CPU and copied each step; create it on the device (`device=`)"
    symptoms = ("TransferToDeviceTime grows every step",)
    references = ("pytorch/xla #8861",)
    valid = (
        "import torch\nfor x in loader:\n    n = torch.randn(3, device=device)\n    loss.backward()\n",
        "import torch\nnoise = torch.randn(3).to(device)\n",
        "import torch\nfor x in loader:\n    m = torch.ones(3).to(torch.bfloat16)\n    loss.backward()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in {"to", "cuda"}):
            return
        factory = func.value
        if not (isinstance(factory, cst.Call) and self.qualified_names(factory.func) & FACTORIES):
            return
        if keyword_arg(factory, "device") is not None or training_loop(self, node) is None:
            return
        device = self._device(node)
        if device is False:
            return
        if device is None or has_star_args(factory):
            self.report(node)
            return
        imports = (IMPORT_TORCH_XLA,) if code_of(device) == XLA_DEVICE else ()
        self.report(node, replacement=add_kwarg(factory, "device", device), imports=imports)

    def _device(self, call: cst.Call) -> cst.BaseExpression | None | bool:
        """The device expression of `.to(...)`/`.cuda()`; False when it is not a device move; None if unclear."""
        if call.func.attr.value == "cuda":
            return None if call.args and any(a.keyword is None for a in call.args) else expr(XLA_DEVICE)
        args = positional_args(call)
        extra = [a for a in call.args if a.keyword is not None and a.keyword.value != "non_blocking"]
        if len(args) != 1 or extra:
            return None if args else False
        target = args[0].value
        if self.qualified_names(target) & DTYPE_NAMES or string_value(target) == "cpu":
            return False
        return target


# --- distributed launch ------------------------------------------------------------------------
@register
class NcclProcessGroup(Rule):
    code = "XLA223"
    title = "`init_process_group(\"nccl\")` needs GPUs"
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = "`torch.distributed.init_process_group(\"nccl\", ...)` / `backend=\"nccl\"`."
    why = (
        "NCCL is the GPU collective library: on a TPU host it fails with `ValueError: ProcessGroupNCCL is only "
        "supported with GPUs, no GPUs found!`. The XLA backend is registered by `import "
        "torch_xla.distributed.xla_backend` and initialised with `init_method=\"xla://\"`, which takes rank and "
        "world size from the XLA runtime (explicit `rank=`/`world_size=` are then ignored). Unsafe: it assumes "
        "processes are started by `torch_xla.launch` (or torchrun) with one process per chip."
    )
    before = "import torch.distributed as dist\n\ndist.init_process_group(\"nccl\")\n"
    after = (
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n\n"
        "dist.init_process_group(\"xla\", init_method=\"xla://\")\n"
    )
    message = "NCCL needs GPUs; use the `xla` backend with `init_method=\"xla://\"`"
    symptoms = ("ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",)
    references = ("docs/source/perf/ddp.md", "docs/source/learn/_pjrt.md")
    valid = (
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n"
        "dist.init_process_group('xla', init_method='xla://')\n",
        "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.distributed.init_process_group"):
            return
        args = positional_args(node)
        backend = args[0] if args else keyword_arg(node, "backend")
        if backend is None or string_value(backend.value) != "nccl":
            return
        if keyword_arg(node, "store") is not None or has_star_args(node):
            self.report(node, f"{self.message} (and drop the custom store)")
            return
        new_args = [a.with_changes(value=same_quotes(a.value, "xla")) if a is backend else a for a in node.args]
        new = node.with_changes(args=new_args)
        init = args[1] if len(args) > 1 else keyword_arg(node, "init_method")
        xla_url = same_quotes(backend.value, "xla://")
        if init is None:
            new = add_kwarg(new, "init_method", xla_url)
        else:
            new = new.with_changes(args=[a.with_changes(value=xla_url) if a is init else a for a in new.args])
        self.report(node, replacement=new, imports=(("torch_xla.distributed.xla_backend", None, None),))


DDP_NAMES = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)


@register
class DdpDeviceIds(Rule):
    code = "XLA224"
    title = "`DistributedDataParallel(device_ids=[rank])` names GPU indices"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`DistributedDataParallel(model, device_ids=[...], output_device=...)`."
    why = (
        "`device_ids` / `output_device` are CUDA device indices. With the `xla` process group each process drives "
        "exactly one chip and the module is already on `torch_xla.device()`; the PyTorch/XLA DDP recipe "
        "constructs `DDP(model, gradient_as_bucket_view=True)` without them. Dropping them keeps the behaviour."
    )
    before = (
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "model = DDP(model, device_ids=[rank], output_device=rank)\n"
    )
    after = "from torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(model)\n"
    message = "`device_ids`/`output_device` are GPU indices; on XLA use `DDP(model)` (one chip per process)"
    references = ("docs/source/perf/ddp.md", "README v2.9.0 DistributedDataParallel")
    valid = ("from torch.nn.parallel import DistributedDataParallel as DDP\nm = DDP(model, gradient_as_bucket_view=True)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & DDP_NAMES:
            return
        args = positional_args(node)
        drop = [a for a in (keyword_arg(node, "device_ids"), keyword_arg(node, "output_device")) if a is not None]
        if len(args) > 3:
            self.report(node, f"{self.message} (positional arguments: rewrite by hand)")
            return
        drop += args[1:]
        if drop:
            self.report(node, replacement=drop_args(node, drop))


@register
class MpSpawn(Rule):
    code = "XLA225"
    title = "`torch.multiprocessing.spawn(fn, nprocs=N)`: launch with `torch_xla.launch`"
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = "`torch.multiprocessing.spawn(fn, args=..., nprocs=N, ...)` (`mp.spawn`)."
    why = (
        "GPU scripts start one process per GPU with `nprocs=torch.cuda.device_count()`, which is 0 on TPU. On XLA "
        "the runtime chooses one process per chip: `torch_xla.launch(fn, args=...)` calls `fn(index, *args)` like "
        "`mp.spawn` does. Unsafe: the index is the global ordinal (same as the local index on one host), and a "
        "world size passed through `args` must be read inside `fn` with `xr.world_size()` instead; do not touch "
        "the XLA device before the launch (`RuntimeError: Runtime is already initialized`)."
    )
    before = (
        "import torch.multiprocessing as mp\n\n"
        "mp.spawn(train, args=(world_size,), nprocs=world_size, join=True)\n"
    )
    after = (
        "import torch.multiprocessing as mp\nimport torch_xla\n\n"
        "torch_xla.launch(train, args=(world_size,))\n"
    )
    message = "`mp.spawn` with a GPU count; use `torch_xla.launch(fn, args=...)` (one process per chip)"
    symptoms = ("ValueError: Unsupported nprocs", "Runtime is already initialized. Do not use the XLA device before calling xmp.spawn.")
    references = ("torch_xla/torch_xla.py launch", "torch_xla/_internal/pjrt.py spawn", "huggingface/accelerate #2999")
    valid = ("import torch_xla\ntorch_xla.launch(train, args=(1,))\n",)

    POSITIONS = ("fn", "args", "nprocs", "join", "daemon", "start_method")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.multiprocessing.spawn"):
            return
        given = dict(zip(self.POSITIONS, [a.value for a in positional_args(node)], strict=False))
        given.update({a.keyword.value: a.value for a in node.args if a.keyword is not None})
        join = given.get("join")
        if has_star_args(node) or "fn" not in given:
            self.report(node)
            return
        if join is not None and not is_literal(join, "True"):
            self.report(node, f"{self.message}; `torch_xla.launch` always joins: restructure code that runs after `join=False`")
            return
        args = [cst.Arg(given["fn"])]
        if "args" in given:
            args.append(kwarg("args", given["args"]))
        start = given.get("start_method")
        if start is not None and string_value(start) != "spawn":
            args.append(kwarg("start_method", start))
        call = cst.Call(expr("torch_xla.launch"), with_commas(args))
        self.report(node, replacement=call, imports=(IMPORT_TORCH_XLA,))
