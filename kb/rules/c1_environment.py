"""C1 — environment / dependencies: deprecated or removed torch_xla APIs, env vars, CUDA-only packages."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..cst_helpers import call_with, kwarg, module_name, same_quotes, whole_statement
from ..rule import (
    IMPORT_TORCH_XLA,
    IMPORT_XR,
    REMOVE,
    Rule,
    expr,
    keyword_arg,
    positional_args,
    register,
    string_value,
)

IMPORT_XLA_BACKEND = ("torch_xla.distributed.xla_backend", None, None)


# --- helpers shared by the C1, C6 and C7 rules ---------------------------------------
@dataclass
class EnvWrite:
    """One environment variable set in code: `os.environ[key] = value` and friends."""

    key: str
    value: cst.BaseExpression | None
    node: cst.CSTNode  # where the finding is reported


def env_writes(rule: Rule, node: cst.Assign | cst.Call) -> list[EnvWrite]:
    """Env vars that `node` sets: `os.environ[K] = v`, `os.environ.setdefault(K, v)`,
    `os.environ.update({K: v})` / `update(K=v)` and `os.putenv(K, v)` (K a string literal)."""
    found: list[EnvWrite] = []
    if isinstance(node, cst.Assign):
        for target in node.targets:
            sub = target.target
            if not (isinstance(sub, cst.Subscript) and "os.environ" in rule.qualified_names(sub.value)):
                continue
            if len(sub.slice) == 1 and isinstance(sub.slice[0].slice, cst.Index):
                key = string_value(sub.slice[0].slice.value)
                if key is not None:
                    found.append(EnvWrite(key, node.value, node))
        return found
    if rule.is_call_to(node, "os.environ.setdefault", "os.putenv"):
        args = positional_args(node)
        key = string_value(args[0].value) if args else None
        if key is not None:
            found.append(EnvWrite(key, args[1].value if len(args) > 1 else None, node))
    elif rule.is_call_to(node, "os.environ.update"):
        for arg in node.args:
            if arg.keyword is not None:
                found.append(EnvWrite(arg.keyword.value, arg.value, node))
            elif isinstance(arg.value, cst.Dict):
                for element in arg.value.elements:
                    key = string_value(getattr(element, "key", None))
                    if key is not None:
                        found.append(EnvWrite(key, element.value, node))
    return found


def in_import_guard(rule: Rule, node: cst.CSTNode) -> bool:
    """Is `node` inside a `try:` body whose handlers catch ImportError (an optional dependency)?"""
    for anc in rule.ancestors(node):
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(anc, cst.Try):
            for handler in anc.handlers:
                if handler.type is None:
                    return True
                if isinstance(handler.type, cst.Tuple):
                    caught = [element.value for element in handler.type.elements]
                else:
                    caught = [handler.type]
                names = {module_name(c) for c in caught}
                if names & {"ImportError", "ModuleNotFoundError", "Exception"}:
                    return True
    return False


# --- deprecated and removed torch_xla APIs ------------------------------------------
@register
class XlaDeviceDeprecated(Rule):
    code = "XLA101"
    title = "`xm.xla_device()` is deprecated: use `torch_xla.device()`"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = "Calls of `torch_xla.core.xla_model.xla_device(n=None, devkind=None)` in any import spelling."
    why = (
        "torch_xla 2.9 still runs it but warns `DeprecationWarning: Use torch_xla.device instead`; the function "
        "is a thin wrapper that ignores `devkind` and returns `torch_xla.device(n)`, so the rewrite is exact."
    )
    before = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nsecond = xm.xla_device(1)\n"
    after = (
        "import torch_xla.core.xla_model as xm\nimport torch_xla\n\n"
        "device = torch_xla.device()\nsecond = torch_xla.device(1)\n"
    )
    message = "`xm.xla_device()` is deprecated; use `torch_xla.device()`"
    symptoms = ("DeprecationWarning: Use torch_xla.device instead",)
    references = ("torch_xla/core/xla_model.py (v2.9.0) xla_device", "pytorch/xla README v2.9.0 Getting Started")
    valid = ("import torch_xla\ndevice = torch_xla.device()\n", "xla_device = lambda: 0\nxla_device()\n")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch_xla.core.xla_model.xla_device"):
            return
        if any(a.star for a in node.args):
            self.report(node)
            return
        args = positional_args(node)
        index = args[0] if args else keyword_arg(node, "n")
        new_args = [cst.Arg(index.value)] if index is not None else []
        self.report(node, replacement=call_with(node, "torch_xla.device", new_args), imports=(IMPORT_TORCH_XLA,))


@register
class MarkStepDeprecated(Rule):
    code = "XLA102"
    title = "`xm.mark_step()` is deprecated: use `torch_xla.sync()`"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = "Calls of `torch_xla.core.xla_model.mark_step(wait=False, reset_scope=True)`."
    why = (
        "torch_xla 2.9 warns `DeprecationWarning: Use torch_xla.sync instead`. `torch_xla.sync(wait, reset_scope)` "
        "takes the same arguments and cuts the lazy graph the same way."
    )
    before = "import torch_xla.core.xla_model as xm\n\nloss.backward()\nxm.mark_step()\n"
    after = "import torch_xla.core.xla_model as xm\nimport torch_xla\n\nloss.backward()\ntorch_xla.sync()\n"
    message = "`xm.mark_step()` is deprecated; use `torch_xla.sync()`"
    symptoms = ("DeprecationWarning: Use torch_xla.sync instead",)
    references = ("torch_xla/core/xla_model.py (v2.9.0) mark_step", "torch_xla/torch_xla.py sync")
    valid = ("import torch_xla\ntorch_xla.sync()\n", "import torch_xla.core.xla_model as xm\nstep = xm.mark_step\n")

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch_xla.core.xla_model.mark_step"):
            self.report(node, replacement=call_with(node, "torch_xla.sync", list(node.args)), imports=(IMPORT_TORCH_XLA,))


REMOVED_GETTERS = {
    "torch_xla.core.xla_model.xrt_world_size": "xr.world_size()",
    "torch_xla.core.xla_model.get_ordinal": "xr.global_ordinal()",
}


@register
class RemovedRuntimeGetters(Rule):
    code = "XLA103"
    title = "`xm.xrt_world_size()` / `xm.get_ordinal()` were removed in 2.7"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = (
        "Calls of `xm.xrt_world_size()` and `xm.get_ordinal()`, and `from torch_xla.core.xla_model import ...` "
        "of those names."
    )
    why = (
        "Both were removed in torch_xla 2.7 (PR #7679): the call raises `AttributeError: module "
        "'torch_xla.core.xla_model' has no attribute 'xrt_world_size'` and the from-import raises ImportError. "
        "`torch_xla.runtime.world_size()` / `global_ordinal()` return the same numbers. "
        "(`xm.get_local_ordinal()` still exists in 2.9.)"
    )
    before = (
        "import torch_xla.core.xla_model as xm\n\n"
        "world = xm.xrt_world_size()\nrank = xm.get_ordinal()\n"
    )
    after = (
        "import torch_xla.core.xla_model as xm\nimport torch_xla.runtime as xr\n\n"
        "world = xr.world_size()\nrank = xr.global_ordinal()\n"
    )
    message = "removed in torch_xla 2.7; use `torch_xla.runtime` (`xr.world_size()`, `xr.global_ordinal()`)"
    symptoms = (
        "AttributeError: module 'torch_xla.core.xla_model' has no attribute 'xrt_world_size'",
        "AttributeError: module 'torch_xla.core.xla_model' has no attribute 'get_ordinal'",
        "ImportError: cannot import name 'xrt_world_size' from 'torch_xla.core.xla_model'",
    )
    references = ("pytorch/xla PR #7679", "torch_xla/runtime.py world_size, global_ordinal")
    valid = (
        "import torch_xla.runtime as xr\nn = xr.world_size()\n",
        "import torch_xla.core.xla_model as xm\ni = xm.get_local_ordinal()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        for name in self.qualified_names(node.func) & REMOVED_GETTERS.keys():
            if node.args:
                self.report(node, f"removed in torch_xla 2.7; use `{REMOVED_GETTERS[name]}`")
            else:
                self.report(node, replacement=expr(REMOVED_GETTERS[name]), imports=(IMPORT_XR,))
            return

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if module_name(node.module) != "torch_xla.core.xla_model" or isinstance(node.names, cst.ImportStar):
            return
        kept = [a for a in node.names if module_name(a.name) not in {"xrt_world_size", "get_ordinal"}]
        if len(kept) == len(node.names):
            return
        line = self.parent(node)
        if not kept and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            self.report(line, "import of names removed in torch_xla 2.7", replacement=REMOVE)
        elif kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            self.report(node, "import of names removed in torch_xla 2.7", replacement=node.with_changes(names=kept))
        else:
            self.report(node, "import of names removed in torch_xla 2.7")


@register
class XmpSpawn(Rule):
    code = "XLA104"
    title = "`xmp.spawn(fn, nprocs=N)`: use `torch_xla.launch(fn, args=...)`"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = "Calls of `torch_xla.distributed.xla_multiprocessing.spawn` used as a statement."
    why = (
        "Under PJRT, `nprocs` may only be 1 or None: any other value raises `ValueError: Unsupported nprocs (8). "
        "Please use nprocs=1 or None (default).` — one process per chip is chosen by the runtime. "
        "`torch_xla.launch(fn, args, start_method, debug_single_process)` is the 2.x entry point: it calls the "
        "same spawn (nprocs=None, or 1 with `debug_single_process=True`), and under torchrun it calls `fn` directly "
        "instead of spawning again. `join`/`daemon` were already ignored. Calls with another `nprocs` are reported "
        "without a rewrite: drop `nprocs` and limit chips with `TPU_VISIBLE_CHIPS` / `TPU_NUM_DEVICES`."
    )
    before = (
        "import torch_xla.distributed.xla_multiprocessing as xmp\n\n"
        "xmp.spawn(_mp_fn, args=(flags,), nprocs=1)\n"
    )
    after = (
        "import torch_xla.distributed.xla_multiprocessing as xmp\nimport torch_xla\n\n"
        "torch_xla.launch(_mp_fn, args=(flags,), debug_single_process=True)\n"
    )
    message = "`xmp.spawn` is the old launcher; use `torch_xla.launch(fn, args=...)`"
    symptoms = (
        "ValueError: Unsupported nprocs (8). Please use nprocs=1 or None (default). If None, spawn will use all "
        "available devices. Use the environment variable X_NUM_DEVICES (where X is CPU, TPU, NEURONCORE, etc) to "
        "limit the number of devices used.",
    )
    references = ("torch_xla/_internal/pjrt.py spawn", "torch_xla/torch_xla.py launch", "huggingface/accelerate #2999")
    valid = ("import torch_xla\ntorch_xla.launch(_mp_fn, args=())\n", "import torch.multiprocessing as mp\nmp.spawn(f)\n")

    POSITIONS = ("fn", "args", "nprocs", "join", "daemon", "start_method")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch_xla.distributed.xla_multiprocessing.spawn"):
            return
        if any(a.star for a in node.args) or whole_statement(self, node) is None:
            self.report(node)
            return
        given = dict(zip(self.POSITIONS, [a.value for a in positional_args(node)], strict=False))
        given.update({a.keyword.value: a.value for a in node.args if a.keyword is not None})
        nprocs = given.get("nprocs")
        nprocs_text = cst.Module([]).code_for_node(nprocs) if nprocs is not None else "None"
        if nprocs_text not in {"None", "1"}:
            self.report(
                node,
                f"`nprocs={nprocs_text}` raises ValueError under PJRT (only 1 or None); use "
                "`torch_xla.launch(fn, args=...)` (one process per chip) and limit chips with TPU_VISIBLE_CHIPS",
            )
            return
        args = [cst.Arg(given["fn"])]
        if "args" in given:
            args.append(kwarg("args", given["args"]))
        start = given.get("start_method")
        if start is not None and string_value(start) != "spawn":
            args.append(kwarg("start_method", start))
        if nprocs_text == "1":
            args.append(kwarg("debug_single_process", expr("True")))
        self.report(node, replacement=call_with(node, "torch_xla.launch", args), imports=(IMPORT_TORCH_XLA,))




@register
class XlaGradScalerRemoved(Rule):
    code = "XLA105"
    title = "`torch_xla.amp.GradScaler` was removed in 2.9"
    category = "C1"
    fix = "manual"
    detects = "`from torch_xla.amp import GradScaler`, `torch_xla.amp.grad_scaler` imports, `torch_xla.amp.GradScaler(...)`."
    why = (
        "The scaler belonged to XLA:GPU, which torch_xla 2.9 removed with all CUDA support (#9608, #9597, #9540): "
        "the import fails with `ImportError: cannot import name 'GradScaler' from 'torch_xla.amp'`. "
        "On TPU use bf16 (`torch.autocast('xla', dtype=torch.bfloat16)`), which needs no loss scaling: "
        "`loss.backward()` and `xm.optimizer_step(optimizer)` instead of `scaler.scale/step/update`."
    )
    before = "from torch_xla.amp import GradScaler\n\nscaler = GradScaler()\n"
    message = (
        "`torch_xla.amp.GradScaler` no longer exists (XLA:GPU removed in 2.9); use bf16 without a scaler: "
        "`loss.backward(); xm.optimizer_step(opt)`"
    )
    symptoms = (
        "ImportError: cannot import name 'GradScaler' from 'torch_xla.amp'",
        "ModuleNotFoundError: No module named 'torch_xla.amp.grad_scaler'",
    )
    references = ("pytorch/xla commits #9608 #9597 #9540 (v2.8 -> v2.9)", "docs/source/perf/amp.md")
    valid = ("from torch_xla.amp import autocast\n", "from torch.amp import GradScaler\n")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = module_name(node.module)
        if module == "torch_xla.amp.grad_scaler":
            self.report(node)
        elif module == "torch_xla.amp" and not isinstance(node.names, cst.ImportStar):
            if any(module_name(a.name) in {"GradScaler", "grad_scaler"} for a in node.names):
                self.report(node)

    def visit_Import(self, node: cst.Import) -> None:
        if any(module_name(a.name) == "torch_xla.amp.grad_scaler" for a in node.names):
            self.report(node)

    def visit_Call(self, node: cst.Call) -> None:
        # from-imported names are reported at the import; here only `torch_xla.amp.GradScaler(...)`
        if isinstance(node.func, cst.Attribute) and self.is_call_to(
            node, "torch_xla.amp.GradScaler", "torch_xla.amp.grad_scaler.GradScaler"
        ):
            self.report(node)


# --- environment variables ----------------------------------------------------------
BF16_ENV_VARS = {"XLA_USE_BF16", "XLA_DOWNCAST_BF16", "XLA_USE_FP16", "XLA_DOWNCAST_FP16"}


@register
class EnvVarBf16(Rule):
    code = "XLA106"
    title = "`XLA_USE_BF16` / `XLA_DOWNCAST_BF16` env vars: cast explicitly instead"
    category = "C1"
    fix = "manual"
    detects = (
        "Code that sets `XLA_USE_BF16`, `XLA_DOWNCAST_BF16`, `XLA_USE_FP16` or `XLA_DOWNCAST_FP16` "
        "(`os.environ[...] = ...`, `setdefault`, `update`, `os.putenv`) to anything but \"0\"."
    )
    why = (
        "Deprecated: torch_xla prints `XLA_USE_BF16 will be deprecated after the 2.6 release, please convert your "
        "model to bf16 directly` (the FP16 ones warn `is deprecated`). Worse, it is silent about precision: "
        "`tensor.dtype` still says float32 while every value is bf16-rounded (1/3 -> 0.333984375), so loss sums "
        "and metrics lose precision unnoticed, and Pallas kernels raise when it is set. "
        "Use `model.to(torch.bfloat16)` or `torch.autocast('xla', dtype=torch.bfloat16)` around forward + loss."
    )
    before = 'import os\n\nos.environ["XLA_USE_BF16"] = "1"\n'
    message = (
        "env-var bf16 is deprecated and hides the dtype; use `torch.autocast('xla', dtype=torch.bfloat16)` "
        "or `model.to(torch.bfloat16)`"
    )
    symptoms = (
        "XLA_USE_BF16 will be deprecated after the 2.6 release, please convert your model to bf16 directly",
        "XLA_USE_FP16 is deprecated",
        "XLA_DOWNCAST_BF16",
    )
    references = ("torch_xla/csrc/dtype.cpp", "pytorch/xla PR #2425", "torch_xla/experimental/custom_kernel.py")
    valid = ('import os\nos.environ["XLA_USE_BF16"] = "0"\n', 'import os\nflag = os.environ.get("XLA_USE_BF16")\n')

    def visit_Assign(self, node: cst.Assign) -> None:
        self._check(node)

    def visit_Call(self, node: cst.Call) -> None:
        self._check(node)

    def _check(self, node: cst.Assign | cst.Call) -> None:
        for write in env_writes(self, node):
            if write.key in BF16_ENV_VARS and string_value(write.value) != "0":
                self.report(
                    write.node,
                    f"`{write.key}` is deprecated and hides the real dtype; use "
                    "`torch.autocast('xla', dtype=torch.bfloat16)` or `model.to(torch.bfloat16)`",
                )


@register
class PjrtDeviceGpu(Rule):
    code = "XLA107"
    title = "`PJRT_DEVICE=CUDA` / `GPU`: XLA:GPU was removed in 2.9"
    category = "C1"
    fix = "unsafe"
    autofix = True
    detects = (
        "Code that sets `PJRT_DEVICE` to \"CUDA\"/\"GPU\" (env writes, `torch_xla.runtime.set_device_type`), "
        "and code that sets `GPU_NUM_DEVICES`."
    )
    why = (
        "torch_xla 2.9 has no CUDA PJRT plugin: the first device use raises `RuntimeError: No PjRtPlugin registered "
        "for: CUDA. Make sure the environment variable PJRT_DEVICE is set to a correct device name.` "
        "The rewrite sets \"TPU\"; it is unsafe because the script then needs a TPU (on a CPU test host the value "
        "set in code overrides an exported `PJRT_DEVICE=CPU`). `GPU_NUM_DEVICES` is reported only: delete it "
        "(limit chips with `TPU_VISIBLE_CHIPS` / `TPU_NUM_DEVICES`)."
    )
    before = 'import os\n\nos.environ["PJRT_DEVICE"] = "CUDA"\n'
    after = 'import os\n\nos.environ["PJRT_DEVICE"] = "TPU"\n'
    message = "XLA:GPU (PJRT_DEVICE=CUDA/GPU) was removed in torch_xla 2.9; target TPU"
    symptoms = (
        "RuntimeError: No PjRtPlugin registered for: CUDA. Make sure the environment variable PJRT_DEVICE is set "
        "to a correct device name.",
        "RuntimeError: No PjRtPlugin registered for: GPU",
    )
    references = ("pytorch/xla commits #9608 #9597 #9540 (v2.8 -> v2.9)", "docs/source/learn/_pjrt.md")
    valid = ('import os\nos.environ["PJRT_DEVICE"] = "TPU"\n', 'import os\nos.environ.setdefault("PJRT_DEVICE", "CPU")\n')

    def visit_Assign(self, node: cst.Assign) -> None:
        self._check(node)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch_xla.runtime.set_device_type"):
            args = positional_args(node)
            self._check_value(args[0].value if args else None)
            return
        self._check(node)

    def _check(self, node: cst.Assign | cst.Call) -> None:
        for write in env_writes(self, node):
            if write.key == "PJRT_DEVICE":
                self._check_value(write.value)
            elif write.key == "GPU_NUM_DEVICES":
                self.report(write.node, "`GPU_NUM_DEVICES` belongs to the removed XLA:GPU; delete it")

    def _check_value(self, value: cst.BaseExpression | None) -> None:
        text = string_value(value)
        if isinstance(value, cst.SimpleString) and text is not None and text.upper() in {"CUDA", "GPU"}:
            self.report(value, replacement=same_quotes(value, "TPU"))


@register
class CudaVisibleDevicesInCode(Rule):
    code = "XLA108"
    title = "`CUDA_VISIBLE_DEVICES` set in code does not limit TPU chips"
    category = "C1"
    fix = "manual"
    detects = "Code that sets `CUDA_VISIBLE_DEVICES` (`os.environ[...]`, `setdefault`, `update`, `os.putenv`)."
    why = (
        "TPU runtimes ignore it: the process opens every chip of the host, so two jobs meant to share a host "
        "collide (the second fails with `TPU initialization failed` / `/dev/accel0 ... busy`). "
        "To pin one chip set `TPU_VISIBLE_CHIPS=0 TPU_PROCESS_BOUNDS=1,1,1` (plus `TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1`) "
        "before torch_xla starts; for data parallelism let `torch_xla.launch` start one process per chip."
    )
    before = 'import os\n\nos.environ["CUDA_VISIBLE_DEVICES"] = "0"\n'
    message = (
        "`CUDA_VISIBLE_DEVICES` has no effect on TPU; use `TPU_VISIBLE_CHIPS` + `TPU_PROCESS_BOUNDS=1,1,1` "
        "to pin chips (or `torch_xla.launch` for one process per chip)"
    )
    symptoms = (
        "RuntimeError: Bad StatusOr access: UNKNOWN: TPU initialization failed",
        "/dev/accel0 busy",
    )
    references = ("docs/source/learn/_pjrt.md Quickstart/TPU", "pytorch/xla #7227")
    valid = ('import os\ngpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")\n',)

    def visit_Assign(self, node: cst.Assign) -> None:
        self._check(node)

    def visit_Call(self, node: cst.Call) -> None:
        self._check(node)

    def _check(self, node: cst.Assign | cst.Call) -> None:
        for write in env_writes(self, node):
            if write.key == "CUDA_VISIBLE_DEVICES":
                self.report(write.node)


# --- the 'xla' device without torch_xla ----------------------------------------------
def is_xla_string(node: cst.CSTNode | None) -> bool:
    value = string_value(node)
    return value is not None and (value == "xla" or value.startswith("xla:"))


@register
class XlaDeviceWithoutImport(Rule):
    code = "XLA109"
    title = "`'xla'` device used in a module that never imports torch_xla"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.device('xla')`, `device='xla'`, `.to('xla:0')` in a module with no `import torch_xla...` "
        "(any torch_xla import counts)."
    )
    why = (
        "The XLA backend is registered by `import torch_xla`; without it the first allocation raises "
        "`NotImplementedError: Could not run 'aten::empty.memory_format' with arguments from the 'XLA' backend` "
        "(pytorch/xla #9725). Importing torch_xla first fixes it; the import is harmless when another module "
        "already did it."
    )
    before = "import torch\n\nx = torch.randn(4, device='xla')\n"
    after = "import torch\nimport torch_xla\n\nx = torch.randn(4, device='xla')\n"
    message = "the 'xla' device needs `import torch_xla` first (it registers the backend)"
    symptoms = (
        "NotImplementedError: Could not run 'aten::empty.memory_format' with arguments from the 'XLA' backend",
    )
    references = ("pytorch/xla #9725",)
    valid = (
        "import torch\nimport torch_xla\nx = torch.randn(4, device='xla')\n",
        "import torch\nimport torch_xla.core.xla_model as xm\nx = torch.zeros(2).to('xla')\n",
        "import torch\nx = torch.randn(4, device='cpu')\n",
    )

    def __init__(self) -> None:
        super().__init__()
        self.imports_torch_xla = False
        self.candidates: list[cst.CSTNode] = []

    def visit_Import(self, node: cst.Import) -> None:
        if any(module_name(a.name).split(".")[0] == "torch_xla" for a in node.names):
            self.imports_torch_xla = True

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if not node.relative and module_name(node.module).split(".")[0] == "torch_xla":
            self.imports_torch_xla = True

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.device"):
            args = positional_args(node)
            device_type = args[0].value if args else getattr(keyword_arg(node, "type"), "value", None)
            if is_xla_string(device_type):
                self.candidates.append(device_type)
            return
        device_kw = keyword_arg(node, "device")
        if device_kw is not None and is_xla_string(device_kw.value):
            self.candidates.append(device_kw.value)
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "to":
            args = positional_args(node)
            if args and is_xla_string(args[0].value):
                self.candidates.append(args[0].value)

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.imports_torch_xla:
            return
        for node in self.candidates:
            # the node stays as it is; the fix is the added import
            self.report(node, replacement=node, imports=(IMPORT_TORCH_XLA,))


# --- CUDA-only code and packages ------------------------------------------------------
def has_cuda_source(node: cst.CSTNode) -> bool:
    """Does a string literal inside `node` name a .cu/.cuh file?"""
    finder = _CudaSourceFinder()
    node.visit(finder)
    return finder.found


class _CudaSourceFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = False

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is not None and value.endswith((".cu", ".cuh")):
            self.found = True


@register
class CudaExtensionBuild(Rule):
    code = "XLA110"
    title = "Custom CUDA kernel built with `torch.utils.cpp_extension`"
    category = "C1"
    fix = "manual"
    detects = (
        "`CUDAExtension(...)`, and `load(...)` / `load_inline(...)` from `torch.utils.cpp_extension` that compile "
        "CUDA (a `.cu`/`.cuh` source, `cuda_sources=`, or `with_cuda=True`)."
    )
    why = (
        "A TPU host has no nvcc and no CUDA device: the build fails, or the kernel cannot take XLA tensors. "
        "There is no automatic port: express the kernel with PyTorch ops (XLA fuses elementwise chains itself) "
        "or write it as a Pallas kernel (`torch_xla.experimental.custom_kernel.make_kernel_from_pallas`; "
        "ready-made: `flash_attention`, `gmm`), installed with `pip install torch_xla[pallas]`."
    )
    before = (
        "from torch.utils.cpp_extension import load\n\n"
        "fused = load(name='fused', sources=['fused.cpp', 'fused_kernel.cu'])\n"
    )
    message = (
        "custom CUDA kernel cannot run on TPU; rewrite it with PyTorch ops or as a Pallas kernel "
        "(torch_xla.experimental.custom_kernel)"
    )
    symptoms = (
        "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.",
        "No CUDA runtime is found",
        "RuntimeError: Found no NVIDIA driver on your system",
    )
    references = ("torch_xla/experimental/custom_kernel.py", "docs/source/features/pallas.md")
    valid = (
        "from torch.utils.cpp_extension import load\nop = load(name='op', sources=['op.cpp'])\n",
        "from torch.utils.cpp_extension import CppExtension\next = CppExtension('op', ['op.cpp'])\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.utils.cpp_extension.CUDAExtension"):
            self.report(node)
        elif self.is_call_to(node, "torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline"):
            with_cuda = keyword_arg(node, "with_cuda")
            if (
                keyword_arg(node, "cuda_sources") is not None
                or (with_cuda is not None and isinstance(with_cuda.value, cst.Name) and with_cuda.value.value == "True")
                or has_cuda_source(node)
            ):
                self.report(node)


CUDA_ONLY_PACKAGES = {
    "apex": "use `torch.optim.AdamW`, `torch.nn.LayerNorm` and `torch.autocast('xla', dtype=torch.bfloat16)` "
    "instead of apex fused ops / apex.amp",
    "flash_attn": "use `F.scaled_dot_product_attention` (lowered by XLA) or the Pallas kernel "
    "`torch_xla.experimental.custom_kernel.flash_attention`",
    "xformers": "use `F.scaled_dot_product_attention` or `torch_xla.experimental.custom_kernel.flash_attention`",
    "bitsandbytes": "8-bit optimizers and 4/8-bit layers are CUDA kernels; use `torch.optim.AdamW` with bf16 "
    "weights (or shard with SPMD/FSDPv2 to save memory)",
    "triton": "XLA's Triton support was removed in 2.9 (#9601); write the kernel as a Pallas kernel "
    "(`torch_xla.experimental.custom_kernel.make_kernel_from_pallas`) or with PyTorch ops",
    "cupy": "use torch ops on XLA tensors",
    "pycuda": "use torch ops on XLA tensors",
}


@register
class CudaOnlyPackage(Rule):
    code = "XLA111"
    title = "CUDA-only package imported (apex, flash_attn, xformers, bitsandbytes, triton, cupy)"
    category = "C1"
    fix = "manual"
    detects = (
        "Unguarded imports of apex, flash_attn, xformers, bitsandbytes, triton, cupy or pycuda "
        "(imports inside `try: ... except ImportError` are optional and not reported)."
    )
    why = (
        "These packages ship CUDA kernels: on a TPU VM they fail to install or import (`ImportError`, "
        "`Found no NVIDIA driver`), and their ops cannot take XLA tensors. XLA's own Triton path is gone in 2.9 "
        "(#9601). Each needs a TPU counterpart: plain PyTorch ops, SDPA, or a Pallas kernel from "
        "`torch_xla.experimental.custom_kernel`."
    )
    before = "import torch\nfrom flash_attn import flash_attn_func\n"
    message = "CUDA-only package; no TPU build"
    symptoms = (
        "ModuleNotFoundError: No module named 'flash_attn'",
        "ImportError: libcudart.so: cannot open shared object file",
        "RuntimeError: Found no NVIDIA driver on your system",
    )
    references = ("pytorch/xla #9601", "torch_xla/experimental/custom_kernel.py", "docs/source/features/pallas.md")
    valid = (
        "try:\n    import apex\nexcept ImportError:\n    apex = None\n",
        "import torch_xla.experimental.custom_kernel as ck\n",
        "from .triton import helper\n",
    )

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._check(node, module_name(alias.name))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if not node.relative:
            self._check(node, module_name(node.module))

    def _check(self, node: cst.CSTNode, module: str) -> None:
        package = module.split(".")[0]
        if package in CUDA_ONLY_PACKAGES and not in_import_guard(self, node):
            self.report(node, f"`{package}` is CUDA-only; {CUDA_ONLY_PACKAGES[package]}")


SDP_FLAG_SETTERS = {
    "torch.backends.cuda.enable_flash_sdp",
    "torch.backends.cuda.enable_mem_efficient_sdp",
    "torch.backends.cuda.enable_math_sdp",
    "torch.backends.cuda.enable_cudnn_sdp",
}


@register
class SdpaBackendSelection(Rule):
    code = "XLA112"
    title = "CUDA attention-backend selection (`sdpa_kernel`, `enable_flash_sdp`) does nothing on XLA"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.nn.attention.sdpa_kernel(...)`, `torch.backends.cuda.sdp_kernel(...)` (reported) and the "
        "`torch.backends.cuda.enable_*_sdp(...)` flag setters used as statements (removed)."
    )
    why = (
        "XLA lowers `F.scaled_dot_product_attention` itself; the CUDA backend choice is ignored (verified: "
        "FLASH_ATTENTION, EFFICIENT_ATTENTION and MATH give the same XLA graph on torch_xla 2.9). Code that "
        "relies on flash attention's O(n) memory does not get it. For a fused TPU kernel call "
        "`torch_xla.experimental.custom_kernel.flash_attention` (Pallas). The flag setters are removed; "
        "`with sdpa_kernel(...)` blocks are reported, since dropping them means re-indenting their body."
    )
    before = "import torch\n\ntorch.backends.cuda.enable_flash_sdp(True)\ny = attn(x)\n"
    after = "import torch\n\ny = attn(x)\n"
    message = (
        "CUDA SDPA backend choice is ignored on XLA; drop it (for a fused TPU kernel use "
        "`torch_xla.experimental.custom_kernel.flash_attention`)"
    )
    symptoms = ("FutureWarning: `torch.backends.cuda.sdp_kernel()` is deprecated",)
    references = ("torch_xla/experimental/custom_kernel.py flash_attention", "docs/source/features/pallas.md")
    valid = ("import torch.nn.functional as F\ny = F.scaled_dot_product_attention(q, k, v)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.nn.attention.sdpa_kernel", "torch.backends.cuda.sdp_kernel"):
            self.report(node)
        elif self.is_call_to(node, *SDP_FLAG_SETTERS):
            line = whole_statement(self, node)
            if line is not None:
                self.report(line, replacement=REMOVE)
            else:
                self.report(node)


@register
class PjrtInitMethod(Rule):
    code = "XLA113"
    title = "`init_method='pjrt://'` and `torch_xla.experimental.pjrt` are the pre-2.1 names"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = (
        "`init_process_group(..., init_method='pjrt://')` (rewritten to `xla://`) and imports of the removed "
        "module `torch_xla.experimental.pjrt` (reported)."
    )
    why = (
        "PJRT's rendezvous was renamed `xla://` in 2.1. `pjrt://` is only registered by the legacy "
        "`torch_xla.experimental.pjrt_backend` import, otherwise `RuntimeError: No rendezvous handler for pjrt://`; "
        "both names use the same handler, which `import torch_xla.distributed.xla_backend` registers. "
        "`torch_xla.experimental.pjrt` is gone (`ModuleNotFoundError`); its functions live in `torch_xla.runtime`."
    )
    before = (
        "import torch.distributed as dist\n\n"
        "dist.init_process_group('xla', init_method='pjrt://')\n"
    )
    after = (
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n\n"
        "dist.init_process_group('xla', init_method='xla://')\n"
    )
    message = "`pjrt://` is the old name of the `xla://` rendezvous"
    symptoms = (
        "RuntimeError: No rendezvous handler for pjrt://",
        "ModuleNotFoundError: No module named 'torch_xla.experimental.pjrt'",
    )
    references = ("docs/source/learn/_pjrt.md", "torch_xla/distributed/xla_backend.py")
    valid = (
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n"
        "dist.init_process_group('xla', init_method='xla://')\n",
        "import torch_xla.experimental.pjrt_backend\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.distributed.init_process_group"):
            return
        method = keyword_arg(node, "init_method")
        if method is not None and isinstance(method.value, cst.SimpleString):
            value = string_value(method.value)
            if value is not None and value.startswith("pjrt://"):
                new = same_quotes(method.value, "xla://" + value[len("pjrt://"):])
                self.report(method.value, replacement=new, imports=(IMPORT_XLA_BACKEND,))

    def visit_Import(self, node: cst.Import) -> None:
        if any(module_name(a.name) == "torch_xla.experimental.pjrt" for a in node.names):
            self.report(node, "`torch_xla.experimental.pjrt` was removed; use `torch_xla.runtime`")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = module_name(node.module)
        pulls_pjrt = module == "torch_xla.experimental" and not isinstance(node.names, cst.ImportStar) and any(
            module_name(a.name) == "pjrt" for a in node.names
        )
        if module == "torch_xla.experimental.pjrt" or pulls_pjrt:
            self.report(node, "`torch_xla.experimental.pjrt` was removed; use `torch_xla.runtime`")


@register
class CudaBf16SupportProbe(Rule):
    code = "XLA114"
    title = "`torch.cuda.is_bf16_supported()` is False on TPU"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = "Calls of `torch.cuda.is_bf16_supported()` (typically to choose bf16 vs fp16)."
    why = (
        "Without a CUDA device it returns False, so `torch.bfloat16 if torch.cuda.is_bf16_supported() else "
        "torch.float16` silently picks fp16 on TPU — where autocast is bf16-only (`TPU Autocast only supports "
        "dtype of torch.bfloat16`, autocast then disabled) and HF fp16 raises. "
        "`torch_xla.runtime.is_bf16_supported()` answers for the XLA device (True on TPU and on PJRT CPU)."
    )
    before = "import torch\n\ndtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16\n"
    after = (
        "import torch\nimport torch_xla.runtime as xr\n\n"
        "dtype = torch.bfloat16 if xr.is_bf16_supported() else torch.float16\n"
    )
    message = "`torch.cuda.is_bf16_supported()` is False without a GPU; use `xr.is_bf16_supported()`"
    symptoms = ("TPU Autocast only supports dtype of torch.bfloat16",)
    references = ("torch_xla/runtime.py is_bf16_supported", "docs/source/perf/amp.md")
    valid = ("import torch_xla.runtime as xr\nok = xr.is_bf16_supported()\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.cuda.is_bf16_supported"):
            self.report(node, replacement=expr("xr.is_bf16_supported()"), imports=(IMPORT_XR,))
