"""C2 — CUDA / device assumptions: device handles, CUDA-only calls, device-type checks."""

from __future__ import annotations

import libcst as cst

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
        replacement = node.with_changes(func=func.with_changes(attr=cst.Name("to")), args=_commas(args))
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
            names = self.qualified_names(target.target)
            if any(n.startswith("torch.backends.cudnn.") for n in names):
                stmt = self.parent(node)
                if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                    self.report(stmt, replacement=REMOVE)
                else:
                    self.report(node)
                return


def _commas(args: list[cst.Arg]) -> list[cst.Arg]:
    """Arguments with clean `, ` separators (the last one without)."""
    out = []
    for i, arg in enumerate(args):
        comma = cst.MaybeSentinel.DEFAULT if i == len(args) - 1 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        out.append(arg.with_changes(comma=comma))
    return out
