"""C1 — environment variables set in code: bf16 switches, `PJRT_DEVICE`, `CUDA_VISIBLE_DEVICES`."""

from __future__ import annotations

import libcst as cst

from ..analysis.env import EnvWrite
from ..cst_helpers import positional_args, same_quotes, string_value
from ..env_rule import EnvWriteRule

# --- environment variables ----------------------------------------------------------
BF16_ENV_VARS = {"XLA_USE_BF16", "XLA_DOWNCAST_BF16", "XLA_USE_FP16", "XLA_DOWNCAST_FP16"}


class EnvVarBf16(EnvWriteRule):
    code = "XLA106"
    needs = ("xla_",)
    title = "`XLA_USE_BF16` / `XLA_DOWNCAST_BF16` env vars: cast explicitly instead"
    category = "C1"
    fix = "manual"
    detects = (
        "Code that sets `XLA_USE_BF16`, `XLA_DOWNCAST_BF16`, `XLA_USE_FP16` or `XLA_DOWNCAST_FP16` "
        '(`os.environ[...] = ...`, `setdefault`, `update`, `os.putenv`) to anything but "0".'
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

    def check_write(self, write: EnvWrite) -> None:
        if write.key in BF16_ENV_VARS and string_value(write.value) != "0":
            self.report(
                write.node,
                f"`{write.key}` is deprecated and hides the real dtype; use "
                "`torch.autocast('xla', dtype=torch.bfloat16)` or `model.to(torch.bfloat16)`",
            )


class PjrtDeviceGpu(EnvWriteRule):
    code = "XLA107"
    needs = ("pjrt_device", "gpu_num_devices", "set_device_type")
    title = "`PJRT_DEVICE=CUDA` / `GPU`: XLA:GPU was removed in 2.9"
    category = "C1"
    fix = "unsafe"
    autofix = True
    detects = (
        'Code that sets `PJRT_DEVICE` to "CUDA"/"GPU" (env writes, `torch_xla.runtime.set_device_type`), '
        "and code that sets `GPU_NUM_DEVICES`."
    )
    why = (
        "torch_xla 2.9 has no CUDA PJRT plugin: the first device use raises `RuntimeError: No PjRtPlugin registered "
        "for: CUDA. Make sure the environment variable PJRT_DEVICE is set to a correct device name.` "
        'The rewrite sets "TPU"; it is unsafe because the script then needs a TPU (on a CPU test host the value '
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
    valid = (
        'import os\nos.environ["PJRT_DEVICE"] = "TPU"\n',
        'import os\nos.environ.setdefault("PJRT_DEVICE", "CPU")\n',
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch_xla.runtime.set_device_type"):
            args = positional_args(node)
            self._check_value(args[0].value if args else None)
            return
        super().visit_Call(node)

    def check_write(self, write: EnvWrite) -> None:
        if write.key == "PJRT_DEVICE":
            self._check_value(write.value)
        elif write.key == "GPU_NUM_DEVICES":
            self.report(write.node, "`GPU_NUM_DEVICES` belongs to the removed XLA:GPU; delete it")

    def _check_value(self, value: cst.BaseExpression | None) -> None:
        text = string_value(value)
        if isinstance(value, cst.SimpleString) and text is not None and text.upper() in {"CUDA", "GPU"}:
            self.report(value, replacement=same_quotes(value, "TPU"))


class CudaVisibleDevicesInCode(EnvWriteRule):
    code = "XLA108"
    needs = ("cuda_visible_devices",)
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

    def check_write(self, write: EnvWrite) -> None:
        if write.key == "CUDA_VISIBLE_DEVICES":
            self.report(write.node)
