"""C1 — CUDA-only code and packages: custom kernels, apex/flash_attn/..., SDPA backend flags, the 'xla' device without `import torch_xla`."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import expr, keyword_arg, module_name, positional_args, string_value
from ..rule import IMPORT_TORCH_XLA, IMPORT_XR, Rule


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


# --- the 'xla' device without torch_xla ----------------------------------------------
def is_xla_string(node: cst.CSTNode | None) -> bool:
    value = string_value(node)
    return value is not None and (value == "xla" or value.startswith("xla:"))


class XlaDeviceWithoutImport(Rule):
    code = "XLA109"
    needs = ("xla",)
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
    after = "import torch\nimport torch_xla  # noqa: F401\n\nx = torch.randn(4, device='xla')\n"
    message = "the 'xla' device needs `import torch_xla` first (it registers the backend)"
    symptoms = ("NotImplementedError: Could not run 'aten::empty.memory_format' with arguments from the 'XLA' backend",)
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


class CudaExtensionBuild(Rule):
    code = "XLA110"
    needs = ("cpp_extension",)
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
        "from torch.utils.cpp_extension import load_inline\nop = load_inline('op', cpp_src, functions=['f'])\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.utils.cpp_extension.CUDAExtension"):
            self.report(node)
        elif self.is_call_to(node, "torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline"):
            with_cuda = keyword_arg(node, "with_cuda")
            inline_cuda = self.is_call_to(node, "torch.utils.cpp_extension.load_inline") and (
                len(positional_args(node)) > 2  # load_inline(name, cpp_sources, cuda_sources, ...)
            )
            if (
                inline_cuda
                or keyword_arg(node, "cuda_sources") is not None
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


class CudaOnlyPackage(Rule):
    code = "XLA111"
    needs = ("apex", "flash_attn", "xformers", "bitsandbytes", "triton", "cupy", "pycuda")
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


class SdpaBackendSelection(Rule):
    code = "XLA112"
    needs = ("sdp",)
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
    after = "\ny = attn(x)\n"
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
            self.report_removal(node)


class CudaBf16SupportProbe(Rule):
    code = "XLA114"
    needs = ("is_bf16_supported",)
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
