"""TorchTPU (`torch-tpu` 0.2.0) entries: the native `tpu` device and the CUDA APIs that name it.

`import torch` loads torch_tpu on a TPU host (torch's backend autoload), renames the PrivateUse1 backend to
`tpu` and registers `torch.tpu` (its device queries are framework-only: user code asks `torch.accelerator`), the `tpu`
distributed backend and a `torch.compile` whose default backend is TorchTPU's. Execution is eager, so the
torch_xla entries about step barriers and recompiles do not apply (see docs/torchtpu.md).
"""

from __future__ import annotations

import libcst as cst

from ..analysis.devices import DeviceAnalysis
from ..cst_helpers import (
    code_of,
    drop_args,
    expr,
    is_cuda_string,
    keyword_arg,
    method_name,
    positional_args,
    same_quotes,
    string_value,
)
from ..rule import IMPORT_TORCH, Rule
from .c2_device_flow import DeviceFlowRule, nccl_values_made_apart
from .c3_model_loading import DeviceMapDispatch

TPU = ("torch_tpu",)

# torch.cuda function -> its TorchTPU spelling. torch_tpu 0.2.0 makes most of `torch.tpu`'s CUDA namesakes
# framework-only: called from user code they raise "is internal to TorchTPU ... Use torch.accelerator.X instead"
# (measured here, docs/torchtpu.md), so those go to torch's device-generic `torch.accelerator`; the seeding ones
# stay public on `torch.tpu`.
TPU_SPELLING = {
    "is_available": "torch.accelerator.is_available",
    "device_count": "torch.accelerator.device_count",
    "current_device": "torch.accelerator.current_device_index",
    "set_device": "torch.accelerator.set_device_index",
    "synchronize": "torch.accelerator.synchronize",
    "initial_seed": "torch.accelerator.random.initial_seed",
    "get_rng_state": "torch.accelerator.random.get_rng_state",
    "manual_seed": "torch.tpu.manual_seed",
    "manual_seed_all": "torch.tpu.manual_seed_all",
    # every TPU generation computes in bfloat16 (it is TorchTPU's autocast default); asked of CUDA on a TPU host
    # the answer is False, and nanoGPT-style code then picks float16 with a GradScaler
    "is_bf16_supported": "True",
}
GUARD_TESTS = ("torch.cuda.is_available", "torch.accelerator.is_available")


def backend_literal(rule: Rule, node: cst.Call, call: str, value: str, positional: bool = False) -> cst.Arg | None:
    """The `backend=` argument of a call to `call` (or its first positional one, with `positional`) when it is the
    string literal `value`; else None."""
    if not rule.is_call_to(node, call):
        return None
    arg = keyword_arg(node, "backend") or (next(iter(positional_args(node)[:1]), None) if positional else None)
    return arg if arg is not None and string_value(arg.value) == value else None


class TpuRule(Rule):
    """A TorchTPU entry (applies to the torch_tpu target only)."""

    targets = TPU


class TpuRewrite(TpuRule):
    """A TorchTPU entry whose rewrite keeps the program's meaning (a safe fix)."""

    fix = "safe"
    autofix = True


def tpu_string(node: cst.SimpleString) -> cst.SimpleString:
    """`"cuda"` -> `"tpu"`, `"cuda:1"` -> `"tpu:1"` (same quotes)."""
    value = string_value(node) or ""
    return same_quotes(node, "tpu" + value[len("cuda") :])


# torch.cuda calls that entries of both targets delete (kb/rules/c6_memory.py: XLA602-XLA604)
REMOVED_BY_SHARED_ENTRIES = (
    "empty_cache",
    "set_per_process_memory_fraction",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_accumulated_memory_stats",
)

MAP_LOCATION = "`map_location` names a CUDA device; load on the CPU (`load_state_dict` copies onto the device)"


class CudaDeviceStringForTpu(TpuRewrite):
    code = "TPU201"
    title = "A CUDA device string where TorchTPU wants `tpu`"
    category = "C2"
    needs = ("cuda",)
    detects = (
        '`"cuda"` / `"cuda:N"` as the device of `torch.device(...)`, `.to(...)`, a `device=` argument or an '
        "autocast/GradScaler device type; as `torch.load`'s `map_location` it becomes `'cpu'`."
    )
    why = (
        "TorchTPU's device is the native `tpu` device (torch's PrivateUse1 backend, renamed when the package "
        "loads): tensors and modules move with `.to('tpu')`, and `torch.autocast('tpu')` is its mixed precision. "
        "A `cuda` left behind fails with `Found no NVIDIA driver` or, in code that guards it, runs on the CPU."
    )
    before = 'import torch\ndevice = torch.device("cuda")\nx = torch.zeros(3, device="cuda:0")\n'
    after = 'import torch\ndevice = torch.device("tpu")\nx = torch.zeros(3, device="tpu:0")\n'
    message = "names a CUDA device; TorchTPU's device is `tpu`"
    symptoms = ("Found no NVIDIA driver on your system",)
    references = ("torch_tpu 0.2.0: _loader.py (rename_privateuse1_backend('tpu'))",)
    valid = ('import torch\nname = "cuda is fast"\ndevice = torch.device("tpu")\n',)

    DEVICE_CALLS = frozenset({"torch.device", "torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler"})

    def visit_Call(self, node: cst.Call) -> None:
        first = positional_args(node)[:1]
        if self.is_call_to(node, *self.DEVICE_CALLS) or method_name(node) == "to":
            candidates = [*first, *(a for a in positional_args(node)[1:] if method_name(node) == "to")]
        else:
            candidates = []
        candidates += [a for a in node.args if a.keyword is not None and a.keyword.value in ("device", "device_type")]
        for arg in candidates:
            if type(arg.value) is cst.SimpleString and is_cuda_string(arg.value):
                self.report(arg.value, replacement=tpu_string(arg.value))
        location = keyword_arg(node, "map_location") if self.is_call_to(node, "torch.load") else None
        if location is not None and type(location.value) is cst.SimpleString and is_cuda_string(location.value):
            # a checkpoint restored onto the CPU; `load_state_dict` copies it onto the module's device
            self.report(location.value, MAP_LOCATION, replacement=same_quotes(location.value, "cpu"))


class CudaMethodForTpu(TpuRewrite):
    code = "TPU202"
    title = "`.cuda()` on TorchTPU"
    category = "C2"
    needs = ("cuda",)
    detects = "`x.cuda()` (no argument): the model or tensor moved to the GPU."
    why = (
        "`.cuda()` asks for a CUDA device, which a TPU host does not have. TorchTPU generates `.tpu()` for its "
        "backend too, but `.to('tpu')` reads the same on both sides of a diff and works for modules and tensors."
    )
    before = "def move(model):\n    return model.cuda()\n"
    after = 'def move(model):\n    return model.to("tpu")\n'
    message = "`.cuda()` moves to a GPU; on TorchTPU use `.to('tpu')`"
    valid = ("def move(model):\n    return model.to('tpu')\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) != "cuda" or not isinstance(node.func, cst.Attribute):
            return
        if node.args:  # `.cuda(rank)`: which chip is a launcher's choice on TPU
            self.report(node, "`.cuda(N)` names a GPU; on TorchTPU each process uses `.to('tpu')`", fix="manual")
            return
        self.report(
            node,
            replacement=node.with_changes(
                func=node.func.with_changes(attr=cst.Name("to")), args=[cst.Arg(cst.SimpleString('"tpu"'))]
            ),
        )


class CudaModuleForTpu(TpuRewrite):
    code = "TPU203"
    title = "`torch.cuda.*` device, seeding and sync calls on TorchTPU"
    category = "C2"
    needs = ("cuda",)
    detects = (
        "`torch.cuda.is_available()`, `device_count()`, `current_device()`, `set_device()`, `synchronize()`, "
        "`initial_seed()`, `get_rng_state()`, `manual_seed(_all)()`, `is_bf16_supported()`."
    )
    why = (
        "`torch.cuda.is_available()` is False on a TPU host, so a `'cuda' if torch.cuda.is_available() else 'cpu'` "
        "guard silently trains on the CPU; CUDA seeding seeds no TPU generator. torch's device-generic "
        "`torch.accelerator` answers for the TPU; torch_tpu 0.2.0 refuses user calls of `torch.tpu.is_available` "
        "and the other framework-only namesakes (RuntimeError: 'is internal to TorchTPU'), but keeps "
        "`torch.tpu.manual_seed(_all)` public."
    )
    before = "import torch\nuse_gpu = torch.cuda.is_available()\ntorch.cuda.manual_seed_all(0)\n"
    # `is_bf16_supported()` becomes `True`: every TPU computes in bfloat16
    after = "import torch\nuse_gpu = torch.accelerator.is_available()\ntorch.tpu.manual_seed_all(0)\n"
    message = "asks CUDA; on TorchTPU use `torch.accelerator` (or `torch.tpu` for seeding)"
    valid = ("import torch\nok = torch.accelerator.is_available()\n",)

    def __init__(self) -> None:
        super().__init__()
        self.folded: set[int] = set()

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        """`x and torch.cuda.is_bf16_supported()` -> `x` (the call is True on a TPU)."""
        right = node.right
        if isinstance(node.operator, cst.And) and type(right) is cst.Call and self.is_bf16_query(right):
            self.folded.add(id(right))
            self.report(right, target=node, replacement=node.left.with_changes(lpar=node.lpar, rpar=node.rpar))

    def is_bf16_query(self, node: cst.Call) -> bool:
        return self.call_name(node) == "torch.cuda.is_bf16_supported"

    def visit_Call(self, node: cst.Call) -> None:
        name = self.call_name(node)
        if name is None or not name.startswith("torch.cuda.") or id(node) in self.folded:
            return
        spelling = TPU_SPELLING.get(name.removeprefix("torch.cuda."))
        if spelling == "True":
            self.report(node, replacement=cst.Name("True"))
        elif spelling is not None:
            self.report(node, replacement=node.with_changes(func=expr(spelling)), imports=(IMPORT_TORCH,))


class CudaGuardStringForTpu(TpuRewrite):
    """The device string of a `'cuda' if torch.cuda.is_available() else 'cpu'` guard (TPU203 rewrites the test)."""

    code = "TPU204"
    title = "The CUDA side of a device guard on TorchTPU"
    category = "C2"
    needs = ("cuda",)
    detects = "`'cuda'` as the value chosen by `... if torch.cuda/tpu.is_available() else ...`."
    why = (
        "After `torch.cuda.is_available()` becomes `torch.accelerator.is_available()` the guard must choose `tpu`, or a "
        "TPU host asks for CUDA."
    )
    before = "import torch\ndevice = 'cuda' if torch.accelerator.is_available() else 'cpu'\n"
    after = "import torch\ndevice = 'tpu' if torch.accelerator.is_available() else 'cpu'\n"
    message = "the guard's device is CUDA; on TorchTPU it is `tpu`"
    valid = ("import torch\ndevice = 'tpu' if torch.accelerator.is_available() else 'cpu'\n",)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        test = node.test
        if type(test) is not cst.Call or self.qualified_names(test.func).isdisjoint(GUARD_TESTS):
            return
        for side in (node.body, node.orelse):
            if type(side) is cst.SimpleString and is_cuda_string(side):
                self.report(side, replacement=tpu_string(side))


class CudaAutocastForTpu(TpuRewrite):
    code = "TPU301"
    title = "CUDA autocast on TorchTPU"
    category = "C5"
    needs = ("autocast",)
    detects = "`torch.cuda.amp.autocast(...)`: the CUDA-only spelling of mixed precision."
    why = (
        "TorchTPU's mixed precision is torch's own `torch.autocast('tpu')`, in bfloat16 by default (the device "
        "module's autocast dtype); the CUDA-only context does nothing for tensors on the `tpu` device."
    )
    before = "import torch\ndef step(model, x):\n    with torch.cuda.amp.autocast():\n        return model(x)\n"
    after = 'import torch\ndef step(model, x):\n    with torch.autocast("tpu"):\n        return model(x)\n'
    message = "CUDA autocast; on TorchTPU use `torch.autocast('tpu')`"
    valid = ("import torch\nwith torch.autocast('tpu'):\n    pass\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.cuda.amp.autocast"):
            args = [cst.Arg(cst.SimpleString('"tpu"')), *node.args]
            self.report(node, replacement=node.with_changes(func=expr("torch.autocast"), args=args))


class GradScalerOnTpu(TpuRule):
    code = "TPU302"
    title = "A CUDA GradScaler on TorchTPU"
    category = "C5"
    fix = "manual"
    needs = ("gradscaler",)
    detects = "`torch.cuda.amp.GradScaler()` / `torch.amp.GradScaler(...)`."
    why = (
        "Loss scaling guards float16 gradients; TorchTPU's autocast computes in bfloat16, which has float32's "
        "range, so the scaler is not needed. Removing it changes every use (scale, step, update): a human does it."
    )
    before = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    message = "loss scaling is for float16; with bfloat16 autocast on TorchTPU remove the scaler and its uses"
    valid = ("import torch\nscaler = None\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.cuda.amp.GradScaler", "torch.amp.GradScaler"):
            self.report(node)


class NcclBackendForTpu(TpuRewrite):
    code = "TPU701"
    title = "The NCCL process-group backend on TorchTPU"
    category = "C7"
    needs = ("nccl",)
    detects = "`init_process_group('nccl')` / `backend='nccl'`."
    why = (
        "torch_tpu registers the `tpu` backend of torch.distributed (and `tpu_dist`, the same) when it loads; "
        "NCCL does not exist on a TPU host. The launcher stays torchrun (torch_tpu's `set_tpu_launch_env` fills "
        "the environment a multi-host TPU job needs)."
    )
    before = 'import torch.distributed as dist\ndist.init_process_group(backend="nccl")\n'
    after = 'import torch.distributed as dist\ndist.init_process_group(backend="tpu")\n'
    message = "NCCL is CUDA's backend; on TorchTPU it is `tpu`"
    valid = ('import torch.distributed as dist\ndist.init_process_group(backend="tpu")\n',)

    def visit_Call(self, node: cst.Call) -> None:
        arg = backend_literal(self, node, "torch.distributed.init_process_group", "nccl", positional=True)
        if arg is not None:
            self.report(arg.value, replacement=same_quotes(arg.value, "tpu"))


class InductorBackendOnTpu(TpuRewrite):
    code = "TPU401"
    title = "`torch.compile(backend='inductor')` on TorchTPU"
    category = "C2"
    needs = ("inductor",)
    detects = "`torch.compile(..., backend='inductor')`."
    why = (
        "torch_tpu replaces `torch.compile`'s default backend with its own and raises `RuntimeError` when Inductor "
        "gets `tpu` tensors (experimental there). Without `backend=`, the same call compiles with TorchTPU."
    )
    before = 'import torch\ndef build(model):\n    return torch.compile(model, backend="inductor")\n'
    after = "import torch\ndef build(model):\n    return torch.compile(model)\n"
    message = "Inductor on `tpu` tensors raises; drop `backend=` to compile with TorchTPU"
    valid = ("import torch\ndef build(model):\n    return torch.compile(model)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        arg = backend_literal(self, node, "torch.compile", "inductor")
        if arg is not None:
            self.report(node, replacement=drop_args(node, [arg]))


def _cpu_string(like: cst.BaseExpression) -> cst.SimpleString:
    quote = like.quote if isinstance(like, cst.SimpleString) else '"'
    return cst.SimpleString(f"{quote}cpu{quote}")


def _tpu_origin(node: cst.BaseExpression) -> cst.BaseExpression:
    """A CUDA device value as TorchTPU's, index kept: `'cuda:1'` -> `'tpu:1'`, `f'cuda:{rank}'` ->
    `f'tpu:{rank}'`, `'cuda:{}'.format(i)` -> `'tpu:{}'.format(i)`; any other form -> `"tpu"`."""
    if isinstance(node, cst.SimpleString):
        return tpu_string(node)
    if isinstance(node, cst.FormattedString) and node.parts and isinstance(node.parts[0], cst.FormattedStringText):
        first = node.parts[0]
        if first.value.startswith("cuda"):
            text = first.with_changes(value="tpu" + first.value[len("cuda") :])
            return node.with_changes(parts=[text, *node.parts[1:]])
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        template = node.func.value
        if isinstance(template, cst.SimpleString) and is_cuda_string(template):
            return node.with_changes(func=node.func.with_changes(value=tpu_string(template)))
    return cst.SimpleString('"tpu"')


class DeviceFlowRuleForTpu(DeviceFlowRule):
    """TorchTPU rewrites that read the module's device analysis, as XLA226/229/230 do."""

    targets = TPU
    fix = "safe"
    autofix = True


class CudaDeviceOriginForTpu(DeviceFlowRuleForTpu):
    code = "TPU205"
    title = "A device value made as a CUDA string (config variable, default, flag, f-string) on TorchTPU"
    category = "C2"
    needs = ("cuda",)
    detects = (
        "CUDA device strings where a device value is made and then flows to `.to()`, `device=`, `torch.device()` or "
        "autocast: config variables (`device = 'cuda'`), argparse defaults, parameter defaults, `f'cuda:{rank}'`."
    )
    why = (
        "The value is used far from where it is written, so rewriting the uses misses it and the program asks "
        "for CUDA on a TPU host. Rewritten where it is made, a `--device` flag or a config file keeps working; "
        "an index stays (`f'cuda:{rank}'` -> `f'tpu:{rank}'`). A value used only as `torch.load`'s `map_location` "
        "becomes `'cpu'` (`load_state_dict` copies onto the device)."
    )
    before = "import torch\n\ndevice = 'cuda'\nx = torch.zeros(2).to(device)\n"
    after = "import torch\n\ndevice = 'tpu'\nx = torch.zeros(2).to(device)\n"
    message = "CUDA device value made here; TorchTPU's device is `'tpu'`"
    valid = ("import torch\ndevice = 'cpu'\nx = torch.zeros(2).to(device)\n", "name = 'cuda'\nprint(name)\n")

    def check(self, analysis: DeviceAnalysis) -> None:
        facts = analysis.facts
        for node in facts.string_origins:
            only_map_location = facts.origin_keys.get(id(node)) in facts.map_location_keys
            self.report(node, replacement=_cpu_string(node) if only_map_location else _tpu_origin(node))


class NcclBackendValueForTpu(DeviceFlowRuleForTpu):
    code = "TPU206"
    title = "`'nccl'` given as the process-group backend through a variable, default or flag, on TorchTPU"
    category = "C7"
    needs = ("nccl",)
    detects = "`backend = 'nccl'` config variables, `def setup(backend='nccl')`, `--dist-backend` defaults."
    why = "NCCL does not exist on a TPU host; torch_tpu registers the `tpu` backend of torch.distributed (TPU701)."
    before = "import torch.distributed as dist\n\nbackend = 'nccl'\ndist.init_process_group(backend=backend)\n"
    after = "import torch.distributed as dist\n\nbackend = 'tpu'\ndist.init_process_group(backend=backend)\n"
    message = "NCCL is CUDA's backend; on TorchTPU it is `'tpu'`"
    valid = ("backend = 'gloo'\n",)

    def check(self, analysis: DeviceAnalysis) -> None:
        for node in nccl_values_made_apart(analysis):  # a literal at the call itself is TPU701's
            self.report(node, replacement=same_quotes(node, "tpu"))


class CudaStringGuardForTpu(DeviceFlowRuleForTpu):
    code = "TPU207"
    title = "A `'cuda' in device` test stays False on TorchTPU"
    category = "C2"
    needs = ("cuda",)
    detects = "`'cuda' in device`, `device.type == 'cuda'` tests whose protected code selects the device or autocast."
    why = (
        "Once the device value is `tpu` the test is False, so `device_type = 'cuda' if 'cuda' in device else "
        "'cpu'` picks the CPU and autocast or the device choice behind it never runs on the TPU."
    )
    before = "device = 'tpu'\ndevice_type = 'cuda' if 'cuda' in device else 'cpu'\n"
    after = "device = 'tpu'\ndevice_type = 'cuda' if 'tpu' in device else 'cpu'\n"
    message = "this CUDA test is False on TorchTPU and keeps the device code behind it from running"
    valid = ("import torch\nif torch.cuda.is_available():\n    torch.cuda.manual_seed_all(0)\n",)

    def check(self, analysis: DeviceAnalysis) -> None:
        for guard in analysis.facts.guards:
            if guard.flips and isinstance(guard.test, cst.SimpleString):
                self.report(guard.test, replacement=same_quotes(guard.test, "tpu"))


class CudaOnlyApiOnTpu(TpuRule):
    code = "TPU208"
    title = "A CUDA-only API with no TorchTPU spelling"
    category = "C1"
    fix = "manual"
    needs = ("cuda", "triton")
    detects = (
        "`torch.cuda.*` calls no TorchTPU rule rewrites (memory statistics, streams, events, `empty_cache`, "
        "`get_device_name`, ...) and Triton kernels (`import triton`)."
    )
    why = (
        "On a TPU host these ask a CUDA driver that is not there: most raise, a few answer zeros. Triton compiles "
        "for NVIDIA and AMD GPUs only; TorchTPU's custom kernels are Pallas. Each needs a decision (drop, "
        "`torch.accelerator`'s namesake where there is one, or a Pallas kernel)."
    )
    before = "import torch\nprint(torch.cuda.max_memory_allocated())\n"
    message = "a CUDA-only API: it has no TorchTPU spelling; drop it or use `torch.accelerator`'s namesake"
    valid = ("import torch\nprint(torch.accelerator.memory_allocated())\n",)

    # rewritten or reported by the other TorchTPU entries (TPU203, TPU301, TPU302) and by the entries of both
    # targets that remove CUDA allocator controls (XLA602-XLA604)
    COVERED = frozenset(
        {f"torch.cuda.{name}" for name in TPU_SPELLING}
        | {"torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler", "torch.cuda.is_bf16_supported"}
        | {f"torch.cuda.{name}" for name in REMOVED_BY_SHARED_ENTRIES}
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = self.call_name(node)
        if name is not None and name.startswith("torch.cuda.") and name not in self.COVERED:
            self.report(node)

    def visit_Import(self, node: cst.Import) -> None:
        self.report_triton(node, [alias.name for alias in node.names])

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.report_triton(node, [] if node.module is None else [node.module])

    def report_triton(self, node: cst.Import | cst.ImportFrom, modules: list[cst.BaseExpression]) -> None:
        if any(code_of(module).split(".")[0] == "triton" for module in modules):
            self.report(node, "Triton kernels compile for GPUs only; on TorchTPU write the kernel in Pallas")


class DeviceMapOnTpu(DeviceMapDispatch):
    """The code side of TPU101: where transformers/accelerate, not the program, choose the device."""

    code = "TPU102"
    targets = TPU
    title = "`device_map=` leaves the device to transformers/accelerate, which may not know `tpu`"
    detects = (
        "`from_pretrained(..., device_map=...)` and `pipeline(..., device_map=...)` (any value but None), and "
        "`pipeline(..., device=<GPU index>)`."
    )
    why = (
        "With `device_map`, accelerate places the layers on the devices it knows. A release that predates "
        "TorchTPU's `tpu` device finds no accelerator and puts every layer on the CPU without an error (the "
        "study's TorchTPU failure; TPU101 reports the pins), and `{'': 0}` / `'cuda'` name a GPU. Which release "
        "first knows `tpu` is not stated in the torch-tpu 0.2.0 wheel, so this is a check, not a rewrite: load "
        "without `device_map` and `.to('tpu')`, or confirm on a TPU host that "
        "`next(model.parameters()).device.type == 'tpu'`."
    )
    before = (
        "from transformers import AutoModelForCausalLM\n\n"
        'model = AutoModelForCausalLM.from_pretrained(name, device_map="auto")\n'
    )
    message = (
        "`device_map` lets accelerate pick the device: a release that does not know `tpu` loads on the CPU; "
        "load, then `.to('tpu')` (or check the device on a TPU host)"
    )
    symptoms = ("model parameters on cpu after from_pretrained(device_map='auto')", "TPU idle, training slow")
    references = ("seeds/002 IV-C (the TorchTPU run's transformers/accelerate pins)",)
    PIPELINE_GPU_INDEX = "`pipeline(device=<GPU index>)` names a GPU; on TorchTPU pass `device='tpu'`"
    valid = (
        "from transformers import AutoModelForCausalLM\nm = AutoModelForCausalLM.from_pretrained(name)\n",
        # an export script that loads on the CPU on purpose
        'from transformers import AutoModel\nm = AutoModel.from_pretrained(name, device_map={"": "cpu"})\n',
    )

    def dispatches(self, device_map: cst.Arg | None) -> bool:
        """As XLA313, but `device_map="cpu"` / `{"": "cpu"}` asks for the CPU itself: nothing is left to accelerate."""
        if device_map is None or not super().dispatches(device_map):
            return False
        value = device_map.value
        places = [e.value for e in value.elements] if isinstance(value, cst.Dict) else [value]
        return not all(string_value(place) == "cpu" for place in places)
