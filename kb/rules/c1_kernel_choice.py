"""C1 — CUDA-only kernels a program chooses: flex attention, and kernels a dependency compiles for CUDA at its first
call (accelerated_scan's warp kernel, Triton), whether called directly or switched on by a flag.

A flag is a keyword argument (`use_flex_sliding_window=True`, `use_accelerated_scan=USE_ACCELERATED_SCAN`), a
module-level constant that one of them names, or a parameter default; it is reported where a person turns it off.
"""

from __future__ import annotations

import re

import libcst as cst

from ..cst_helpers import is_literal, module_name
from ..rule import Rule
from .c1_cuda_only import in_import_guard

FLEX_FUNCTIONS = frozenset(
    {
        "torch.nn.attention.flex_attention.flex_attention",
        "torch.nn.attention.flex_attention.create_block_mask",
        "torch.nn.attention.flex_attention.create_mask",
    }
)
# `use_flex_attn`, `use_flex_sliding_window`, `USE_FLEX_ATTN`, `flex_attention=True`: names that choose flex attention
# (from their start: `disable_flex_attn=True` turns it off)
FLEX_FLAG = re.compile(r"^use_flex(_|$)|^(use_)?flex_(attn|attention)(_|$)", re.IGNORECASE)
# `use_accelerated_scan`, `use_accelerated`, `use_triton_fine_selection`, `use_cuda_kernel`: names that choose a kernel
# built for CUDA at the first call
KERNEL_FLAG = re.compile(r"^use_(accelerated|triton|cuda_kernel|fused_cuda)", re.IGNORECASE)
# packages that compile a CUDA (or Triton) kernel when their op first runs: importing them is the choice
COMPILING_PACKAGES = {
    "accelerated_scan": "its `warp` kernel is CUDA C++ built by `torch.utils.cpp_extension.load_inline`, its `triton` "
    "kernel is Triton",
}


class _FlagRule(Rule):
    """Reports truthy flags whose name matches `flag`: at a keyword literal `True` (fix: `False`), at the module-level
    `NAME = True` a keyword names (fix: `False`), and at a parameter default `True` (reported only)."""

    flag: re.Pattern[str]
    flag_message: str

    def __init__(self) -> None:
        super().__init__()
        self.constants: dict[str, cst.Assign] = {}  # module-level NAME = True
        self.named: list[tuple[str, cst.Arg]] = []  # keywords whose value is a module-level name
        self.reported: set[int] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        target = node.targets[0].target if len(node.targets) == 1 else None
        if isinstance(target, cst.Name) and is_literal(node.value, "True") and self._at_module_level(node):
            self.constants[target.value] = node

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is None or not self.flag.search(node.keyword.value):
            return
        if is_literal(node.value, "True"):
            self._report_flag(node, node.value, node.keyword.value)
        elif isinstance(node.value, cst.Name):
            self.named.append((node.value.value, node))

    def visit_Param(self, node: cst.Param) -> None:
        if self.flag.search(node.name.value) and is_literal(node.default, "True"):
            self._report_flag(node, None, node.name.value, default=True)

    def leave_Module(self, original_node: cst.Module) -> None:
        for name, arg in self.named:
            assign = self.constants.get(name)
            if assign is not None:
                self._report_flag(assign, assign.value, name, via=f" (passed as `{arg.keyword.value}=`)")
        for name, assign in self.constants.items():  # a module-level switch of its own (`USE_FLEX_ATTN = True`)
            if self.flag.search(name):
                self._report_flag(assign, assign.value, name)

    def _report_flag(
        self, node: cst.CSTNode, value: cst.CSTNode | None, name: str, default: bool = False, via: str = ""
    ) -> None:
        if id(node) in self.reported:
            return
        self.reported.add(id(node))
        where = "the default of " if default else ""
        message = f"{where}`{name}`{via} {self.flag_message}"
        if value is None:
            self.report(node, message + "; pass False where the object is built")
        else:
            self.report(node, message, replacement=cst.Name("False"), target=value)

    def _at_module_level(self, node: cst.CSTNode) -> bool:
        return not any(isinstance(a, (cst.FunctionDef, cst.ClassDef)) for a in self.ancestors(node))


FLEX_WHY = (
    "torch_xla 2.9 has no lowering for flex attention (measured on XLA tensors): `flex_attention`, eager or under "
    "`torch.compile`, raises `ValueError: FlexAttention is only supported on CUDA, CPU or HPU devices`, and "
    "`create_block_mask` fails in XLA's compiler (`Cannot concatenate arrays with different element types: S64 vs "
    "S32`). On XLA write the same attention with `F.scaled_dot_product_attention(q, k, v, "
    "attn_mask=mask)`, with the boolean mask the `mask_mod` describes (`mask[q_idx, kv_idx] = mask_mod(b, h, q_idx, "
    "kv_idx)`, built once per shape); a library that offers a non-flex path (a `use_flex_...=False` switch) already "
    "does this."
)


class FlexAttention(_FlagRule):
    code = "XLA115"
    needs = ("flex",)
    title = "Flex attention (`torch.nn.attention.flex_attention`) has no XLA lowering"
    category = "C1"
    fix = "unsafe"
    autofix = True
    detects = (
        "Calls of `flex_attention`, `create_block_mask`, `create_mask` from `torch.nn.attention.flex_attention` "
        "(reported), and the flags that choose them: a keyword `use_flex_...=True` / `flex_attn=True`, the "
        "module-level constant `USE_FLEX_ATTN = True` such a keyword names, or a parameter defaulting to flex. "
        "The fix turns a flag given as `True` off."
    )
    why = FLEX_WHY + (
        " Turning the flag off runs the library's own non-flex path: the same attention, computed by other "
        "kernels (float rounding differs), so the fix is unsafe: compare the losses (`xlaport verify`)."
    )
    before = "from mylib import Transformer\n\nmodel = Transformer(dim=256, use_flex_attn=True)\n"
    after = "from mylib import Transformer\n\nmodel = Transformer(dim=256, use_flex_attn=False)\n"
    message = (
        "flex attention has no XLA lowering (it raises on XLA tensors at the first step); use "
        "`F.scaled_dot_product_attention(q, k, v, attn_mask=mask)` with the mask its `mask_mod` describes"
    )
    flag_message = (
        "chooses flex attention, which has no XLA lowering (it raises at the first step); turn it off to use the "
        "library's scaled-dot-product path"
    )
    symptoms = (
        "ValueError: FlexAttention is only supported on CUDA, CPU or HPU devices. Found input tensors on xla device.",
        "RuntimeError: Cannot concatenate arrays with different element types: S64 vs S32.",
    )
    references = ("pytorch.org/blog/flexattention", "torch/nn/attention/flex_attention.py")
    valid = (
        "import torch.nn.functional as F\ny = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n",
        "from mylib import Transformer\nmodel = Transformer(dim=256, use_flex_attn=False)\n",
        "flexible = True\nlayout = make(flex=2)\n",
        "out = attn(seq, disable_flex_attn=True)\n",
    )
    flag = FLEX_FLAG

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func).isdisjoint(FLEX_FUNCTIONS):
            self.report(node)


class RuntimeCudaKernel(_FlagRule):
    code = "XLA116"
    needs = ("accelerated", "use_triton", "use_cuda_kernel", "use_fused_cuda")
    title = "A dependency compiles a CUDA kernel at its first call (chosen by an import or a flag)"
    category = "C1"
    fix = "unsafe"
    autofix = True
    detects = (
        "Imports of packages that build a CUDA or Triton kernel when their op first runs (`accelerated_scan`), "
        "and the flags that choose such a kernel in a library: a keyword `use_accelerated...=True`, "
        "`use_triton...=True`, `use_cuda_kernel...=True` (as `AssocScan(use_accelerated=True)` does for "
        "accelerated_scan), the module-level constant such a keyword names (`USE_ACCELERATED_SCAN = True`), or a "
        "parameter defaulting to it. The fix turns a flag given as `True` off."
    )
    why = (
        "The kernel is compiled for CUDA when the op first runs (`torch.utils.cpp_extension.load_inline` with CUDA "
        "sources, or Triton): a TPU host has no nvcc, no CUDA architecture and no CUDA tensors, so the first step "
        "fails (`IndexError` in `_get_cuda_arch_flags`, `CUDA_HOME` not set, `Found no NVIDIA driver`), on any host "
        "without CUDA. The libraries that offer such a switch keep a PyTorch path for the same operation (an "
        "associative scan, an attention): turning the flag off runs it on XLA. Same operation, other kernels: "
        "float rounding differs, so the fix is unsafe: compare the losses (`xlaport verify`)."
    )
    before = "from assoc_scan import AssocScan\n\nscan = AssocScan(use_accelerated=True)\n"
    after = "from assoc_scan import AssocScan\n\nscan = AssocScan(use_accelerated=False)\n"
    message = (
        "a kernel compiled for CUDA at the first call; no CUDA on a TPU host: turn off the flag that chose it "
        "(`use_accelerated...=False`) or use a PyTorch implementation of the op"
    )
    flag_message = (
        "chooses a kernel compiled for CUDA (or Triton) at the first call: the first step fails on a TPU host; "
        "turn it off to use the library's PyTorch path"
    )
    symptoms = (
        "in _get_cuda_arch_flags",
        "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.",
    )
    references = ("torch/utils/cpp_extension.py load_inline", "pytorch/xla #9601 (Triton removed)")
    valid = (
        "from assoc_scan import AssocScan\nscan = AssocScan(use_accelerated=False)\n",
        "try:\n    from accelerated_scan.warp import scan\nexcept ImportError:\n    scan = None\n",
        "from accelerate import Accelerator\naccelerator = Accelerator()\n",
    )
    flag = KERNEL_FLAG

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._check_import(node, module_name(alias.name))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if not node.relative:
            self._check_import(node, module_name(node.module))

    def _check_import(self, node: cst.CSTNode, module: str) -> None:
        package = module.split(".")[0]
        if package in COMPILING_PACKAGES and not in_import_guard(self, node):
            self.report(
                node,
                f"`{package}` compiles a CUDA kernel at the first call: {COMPILING_PACKAGES[package]}; no CUDA on a "
                "TPU host: use a PyTorch implementation of the op (e.g. a scan by cumulative sums in log space)",
            )
