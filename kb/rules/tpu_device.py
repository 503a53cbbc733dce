"""TorchTPU (`torch-tpu` 0.2.0) entries: the native `tpu` device and the CUDA APIs that name it.

`import torch` loads torch_tpu on a TPU host (torch's backend autoload), renames the PrivateUse1 backend to
`tpu` and registers `torch.tpu` (its device queries are framework-only: user code asks `torch.accelerator`), the `tpu`
distributed backend and a `torch.compile` whose default backend is TorchTPU's. Execution is eager, so the
torch_xla entries about step barriers and recompiles do not apply (see docs/torchtpu.md).
"""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import (
    drop_args,
    expr,
    is_cuda_string,
    keyword_arg,
    method_name,
    positional_args,
    same_quotes,
    string_value,
)
from ..rule import IMPORT_TORCH, Rule, register

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
}
GUARD_TESTS = ("torch.cuda.is_available", "torch.accelerator.is_available")


def tpu_string(node: cst.SimpleString) -> cst.SimpleString:
    """`"cuda"` -> `"tpu"`, `"cuda:1"` -> `"tpu:1"` (same quotes)."""
    value = string_value(node) or ""
    return same_quotes(node, "tpu" + value[len("cuda") :])


@register
class CudaDeviceStringForTpu(Rule):
    code = "TPU201"
    title = "A CUDA device string where TorchTPU wants `tpu`"
    category = "C2"
    fix = "safe"
    autofix = True
    targets = TPU
    needs = ("cuda",)
    detects = (
        '`"cuda"` / `"cuda:N"` as the device of `torch.device(...)`, `.to(...)`, a `device=` argument or an '
        "autocast/GradScaler device type."
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


@register
class CudaMethodForTpu(Rule):
    code = "TPU202"
    title = "`.cuda()` on TorchTPU"
    category = "C2"
    fix = "safe"
    autofix = True
    targets = TPU
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


@register
class CudaModuleForTpu(Rule):
    code = "TPU203"
    title = "`torch.cuda.*` device, seeding and sync calls on TorchTPU"
    category = "C2"
    fix = "safe"
    autofix = True
    targets = TPU
    needs = ("cuda",)
    detects = (
        "`torch.cuda.is_available()`, `device_count()`, `current_device()`, `set_device()`, `synchronize()`, "
        "`initial_seed()`, `get_rng_state()`, `manual_seed(_all)()`."
    )
    why = (
        "`torch.cuda.is_available()` is False on a TPU host, so a `'cuda' if torch.cuda.is_available() else 'cpu'` "
        "guard silently trains on the CPU; CUDA seeding seeds no TPU generator. torch's device-generic "
        "`torch.accelerator` answers for the TPU; torch_tpu 0.2.0 refuses user calls of `torch.tpu.is_available` "
        "and the other framework-only namesakes (RuntimeError: 'is internal to TorchTPU'), but keeps "
        "`torch.tpu.manual_seed(_all)` public."
    )
    before = "import torch\nuse_gpu = torch.cuda.is_available()\ntorch.cuda.manual_seed_all(0)\n"
    after = "import torch\nuse_gpu = torch.accelerator.is_available()\ntorch.tpu.manual_seed_all(0)\n"
    message = "asks CUDA; on TorchTPU use `torch.accelerator` (or `torch.tpu` for seeding)"
    valid = ("import torch\nok = torch.accelerator.is_available()\n",)

    def visit_Call(self, node: cst.Call) -> None:
        name = self.call_name(node)
        if name is None or not name.startswith("torch.cuda."):
            return
        spelling = TPU_SPELLING.get(name.removeprefix("torch.cuda."))
        if spelling is not None:
            self.report(node, replacement=node.with_changes(func=expr(spelling)), imports=(IMPORT_TORCH,))


@register
class CudaGuardStringForTpu(Rule):
    """The device string of a `'cuda' if torch.cuda.is_available() else 'cpu'` guard (TPU203 rewrites the test)."""

    code = "TPU204"
    title = "The CUDA side of a device guard on TorchTPU"
    category = "C2"
    fix = "safe"
    autofix = True
    targets = TPU
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


@register
class CudaAutocastForTpu(Rule):
    code = "TPU301"
    title = "CUDA autocast on TorchTPU"
    category = "C5"
    fix = "safe"
    autofix = True
    targets = TPU
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


@register
class GradScalerOnTpu(Rule):
    code = "TPU302"
    title = "A CUDA GradScaler on TorchTPU"
    category = "C5"
    fix = "manual"
    targets = TPU
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


@register
class NcclBackendForTpu(Rule):
    code = "TPU701"
    title = "The NCCL process-group backend on TorchTPU"
    category = "C7"
    fix = "safe"
    autofix = True
    targets = TPU
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
        if not self.is_call_to(node, "torch.distributed.init_process_group"):
            return
        arg = keyword_arg(node, "backend") or next(iter(positional_args(node)[:1]), None)
        if arg is not None and type(arg.value) is cst.SimpleString and string_value(arg.value) == "nccl":
            self.report(arg.value, replacement=same_quotes(arg.value, "tpu"))


@register
class InductorBackendOnTpu(Rule):
    code = "TPU401"
    title = "`torch.compile(backend='inductor')` on TorchTPU"
    category = "C2"
    fix = "safe"
    autofix = True
    targets = TPU
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
        if not self.is_call_to(node, "torch.compile"):
            return
        arg = keyword_arg(node, "backend")
        if arg is not None and string_value(arg.value) == "inductor":
            self.report(node, replacement=drop_args(node, [arg]))
