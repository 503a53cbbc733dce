"""C5 — ops without an XLA lowering: each runs on the CPU, a device->host->device round trip every time.

The fallback lists were measured with torch_xla 2.9 on PJRT_DEVICE=CPU (`met.executed_fallback_ops()`).
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst

from ..analysis.sparse import SPARSE_MATMULS, SPARSE_METHODS, is_sparse
from ..cst_helpers import is_literal, keyword_arg, method_name, positional_args, string_value
from ..rule import Rule
from ..step_rule import StepContextRule


class _FallbackOp(StepContextRule):
    """Ops without an XLA lowering in 2.9: reported in device code, with the measured counter name."""

    category = "C5"
    fix = "manual"
    functions: ClassVar[dict[str, str]] = {}  # qualified name -> aten counter
    methods: ClassVar[dict[str, str]] = {}  # tensor method -> aten counter

    def counter(self, node: cst.Call) -> str | None:
        for name in self.qualified_names(node.func):
            if name in self.functions:
                return self.functions[name]
        method = method_name(node)
        if method in self.methods and not self._is_torch_function(node.func):
            receiver = node.func.value
            if not self.is_host_value(receiver) and not self.is_cpu_tensor(receiver):
                return self.methods[method]
        return None

    def visit_Call(self, node: cst.Call) -> None:
        counter = self.counter(node)
        if counter is not None and self.in_device_context(node):
            self.report(node, f"{self.message} [{counter}]")


class GridSample(_FallbackOp):
    code = "XLA508"
    needs = ("grid_sample",)
    title = "`grid_sample` runs on the CPU (forward and backward)"
    detects = "`F.grid_sample(...)` in device code (spatial transformers, deformable sampling, optical flow warps)."
    why = (
        "`aten::grid_sampler_2d` and its backward have no XLA lowering in 2.9: each call moves the input and "
        "the grid to the host and back, in both passes."
    )
    before = (
        "import torch\nimport torch.nn.functional as F\n\n"
        "class Warp(torch.nn.Module):\n"
        "    def forward(self, img, grid):\n"
        "        return F.grid_sample(img, grid, align_corners=False)\n"
    )
    message = (
        "`grid_sample` falls back to the CPU every call; express the bilinear sampling with gathers "
        "(floor/ceil indices + `torch.gather` + weights), or sample in the CPU data pipeline"
    )
    symptoms = (
        "aten::grid_sampler_2d",
        "aten::grid_sampler_2d_backward",
        "pt-xla-profiler: Op(s) not lowered: aten::grid_sampler_2d",
    )
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    functions = {
        "torch.nn.functional.grid_sample": "aten::grid_sampler_2d",
        "torch.grid_sampler": "aten::grid_sampler_2d",
    }


class RepeatInterleaveTensor(_FallbackOp):
    code = "XLA509"
    needs = ("repeat_interleave",)
    title = "`repeat_interleave` with a tensor of repeats runs on the CPU"
    detects = (
        "`torch.repeat_interleave(x, repeats)` / `x.repeat_interleave(repeats)` where `repeats` is a tensor, and "
        "the one-argument `torch.repeat_interleave(counts)`. Integer repeats (`repeat_kv(x, n_rep)`) are fine."
    )
    why = (
        "With tensor repeats the output length depends on the data: `aten::repeat_interleave.Tensor` falls back "
        "to the CPU and each new total length is a new graph."
    )
    before = (
        "import torch\n\n"
        "class Expand(torch.nn.Module):\n"
        "    def forward(self, x, lengths):\n"
        "        return torch.repeat_interleave(x, lengths, dim=0)\n"
    )
    message = (
        "tensor `repeats` gives a data-dependent length (CPU fallback + recompiles); use integer repeats, a "
        "padded fixed-size layout, or `torch_xla.experimental.custom_kernel.repeat_with_fixed_output_size`"
    )
    symptoms = ("aten::repeat_interleave.Tensor", "pt-xla-profiler: Op(s) not lowered: aten::repeat_interleave.Tensor")
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report", "torch_xla/experimental/custom_kernel.py")
    valid = (
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.repeat_interleave(x, 2, dim=1)\n",
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x, n_rep: int):\n"
        "        return x.repeat_interleave(n_rep, dim=1)\n",
    )

    def counter(self, node: cst.Call) -> str | None:
        if self.is_call_to(node, "torch.repeat_interleave"):
            args = positional_args(node)
            repeats = args[1].value if len(args) > 1 else getattr(keyword_arg(node, "repeats"), "value", None)
            if len(args) == 1 and repeats is None:
                return "aten::repeat_interleave.Tensor"
        elif method_name(node) == "repeat_interleave" and not self._is_torch_function(node.func):
            args = positional_args(node)
            repeats = args[0].value if args else getattr(keyword_arg(node, "repeats"), "value", None)
        else:
            return None
        if repeats is not None and (
            self.is_tensor(repeats) or self.is_call_to(repeats, "torch.tensor", "torch.as_tensor")
        ):
            return "aten::repeat_interleave.Tensor"
        return None


class CountingOps(_FallbackOp):
    code = "XLA510"
    needs = ("bincount", "bucketize", "histc", "searchsorted")
    title = "`bincount` / `histc` / `searchsorted` / `bucketize` run on the CPU"
    detects = "`torch.bincount`, `torch.histc`, `torch.searchsorted`, `torch.bucketize` and `.bincount()` / `.histc()` in device code."
    why = (
        "None of them is lowered in torch_xla 2.9 (`aten::bincount`, `aten::histc`, `aten::searchsorted.Tensor`, "
        "`aten::bucketize.Tensor`): each call syncs the device and copies the data to the host and back; "
        "`bincount`'s output size also depends on the data."
    )
    before = (
        "import torch\n\n"
        "class ClassBalance(torch.nn.Module):\n"
        "    def forward(self, labels):\n"
        "        return torch.bincount(labels, minlength=10)\n"
    )
    message = (
        "this op falls back to the CPU on XLA; use lowered forms: `F.one_hot(labels, n).sum(0)` for bincount, "
        "`(x[..., None] >= edges).sum(-1)` for bucketize/searchsorted/histc with fixed edges"
    )
    symptoms = (
        "aten::bincount",
        "aten::histc",
        "aten::searchsorted.Tensor",
        "aten::bucketize.Tensor",
        "pt-xla-profiler: Op(s) not lowered: aten::bincount",
    )
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report", "pytorch/xla#2405")
    valid = ("import numpy as np\ncounts = np.bincount(np.array([1, 2]))\n",)
    functions = {
        "torch.bincount": "aten::bincount",
        "torch.histc": "aten::histc",
        "torch.searchsorted": "aten::searchsorted.Tensor",
        "torch.bucketize": "aten::bucketize.Tensor",
    }
    methods = {"bincount": "aten::bincount", "histc": "aten::histc"}


class CtcLoss(_FallbackOp):
    code = "XLA511"
    needs = ("ctcloss", "ctc_loss")
    title = "CTC loss runs on the CPU"
    detects = "`F.ctc_loss(...)` and `nn.CTCLoss()` in device code (speech / OCR models)."
    why = (
        "`aten::_ctc_loss.Tensor` (and its backward) have no XLA lowering in 2.9: every step moves log-probs and "
        "targets to the host and back, and the variable target lengths add dynamic shapes."
    )
    before = (
        "import torch.nn as nn\n\n"
        "class Asr(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.ctc = nn.CTCLoss(blank=0)\n"
    )
    message = (
        "CTC loss falls back to the CPU every step; pad targets to a fixed length and expect the fallback cost, "
        "or implement the CTC forward recursion with `torch_xla.experimental.scan`"
    )
    symptoms = (
        "aten::_ctc_loss.Tensor",
        "aten::_ctc_loss_backward",
        "pt-xla-profiler: Op(s) not lowered: aten::_ctc_loss",
    )
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    functions = {
        "torch.nn.functional.ctc_loss": "aten::_ctc_loss.Tensor",
        "torch.nn.CTCLoss": "aten::_ctc_loss.Tensor",
        "torch.nn.modules.loss.CTCLoss": "aten::_ctc_loss.Tensor",
        "torch.ctc_loss": "aten::_ctc_loss.Tensor",
    }


FFT_FUNCTIONS = (
    "fft ifft fft2 ifft2 fftn ifftn rfft irfft rfft2 irfft2 rfftn irfftn hfft ihfft hfft2 ihfft2 hfftn ihfftn".split()
)


class Fft(_FallbackOp):
    code = "XLA512"
    needs = ("fft", "stft")
    title = "FFTs (`torch.fft.*`, `torch.stft`) run on the CPU"
    detects = "`torch.fft.fft/rfft/irfft/fft2/...`, `torch.stft`, `torch.istft` and `.stft()` in device code."
    why = (
        "torch_xla 2.9 has no FFT lowering: `aten::_fft_r2c`, `aten::_fft_c2c`, `aten::_fft_c2r` fall back to the "
        "CPU on every call (spectrogram front-ends, FNet/Hyena-style mixing, spectral losses)."
    )
    before = (
        "import torch\n\n"
        "class SpectralMix(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.fft.rfft(x, dim=-1).abs()\n"
    )
    message = (
        "FFTs fall back to the CPU on XLA; for fixed sizes multiply by a precomputed DFT matrix (cos/sin "
        "weights, runs on the MXU), or compute spectrograms in the CPU data pipeline"
    )
    symptoms = (
        "aten::_fft_r2c",
        "aten::_fft_c2c",
        "aten::_fft_c2r",
        "pt-xla-profiler: Op(s) not lowered: aten::_fft_r2c",
    )
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    valid = (
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return torch.fft.fftshift(x)\n",
    )
    functions = {
        **{f"torch.fft.{name}": "aten::_fft_r2c / aten::_fft_c2c / aten::_fft_c2r" for name in FFT_FUNCTIONS},
        "torch.stft": "aten::_fft_r2c",
        "torch.istft": "aten::_fft_c2r",
    }
    methods = {"stft": "aten::_fft_r2c", "istft": "aten::_fft_c2r"}


class EmbeddingBag(_FallbackOp):
    code = "XLA513"
    needs = ("embeddingbag", "embedding_bag")
    title = "`EmbeddingBag` runs on the CPU"
    detects = "`nn.EmbeddingBag(...)` and `F.embedding_bag(...)` in device code (recommenders, fastText-style models)."
    why = (
        "`aten::_embedding_bag` (also `_embedding_bag_forward_only` without grad) has no XLA lowering in 2.9, "
        "measured in training and under `no_grad`: the table lookup runs on the host every step."
    )
    before = (
        "import torch.nn as nn\n\n"
        "class Bag(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        '        self.emb = nn.EmbeddingBag(10000, 64, mode="mean")\n'
    )
    message = (
        "EmbeddingBag falls back to the CPU; use `nn.Embedding` on fixed-size padded bags and reduce with a mask "
        "(`(emb(ids) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)`)"
    )
    symptoms = (
        "aten::_embedding_bag",
        "aten::_embedding_bag_forward_only",
        "pt-xla-profiler: Op(s) not lowered: aten::_embedding_bag",
    )
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    functions = {
        "torch.nn.EmbeddingBag": "aten::_embedding_bag",
        "torch.nn.modules.sparse.EmbeddingBag": "aten::_embedding_bag",
        "torch.nn.functional.embedding_bag": "aten::_embedding_bag",
        "torch.embedding_bag": "aten::_embedding_bag",
    }


class Median(_FallbackOp):
    code = "XLA514"
    needs = ("median",)
    title = "`median` / `nanmedian` run on the CPU"
    detects = "`torch.median`, `torch.nanmedian` and `.median()` / `.nanmedian()` on tensors in device code."
    why = (
        "`aten::median`, `aten::median.dim_values` and `aten::nanmedian` are not lowered in torch_xla 2.9 "
        "(measured): each call syncs the device and runs on the host. `sort`, `kthvalue` and `quantile` are lowered."
    )
    before = (
        "import torch\n\n"
        "class RobustNorm(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x - x.median(dim=-1, keepdim=True).values\n"
    )
    message = (
        "median falls back to the CPU on XLA; use `torch.quantile(x, 0.5, dim)` (interpolates for even sizes) or "
        "`x.sort(dim).values` indexed at `(n - 1) // 2` (the same lower median)"
    )
    symptoms = (
        "aten::median",
        "aten::median.dim_values",
        "aten::nanmedian",
        "pt-xla-profiler: Op(s) not lowered: aten::median",
    )
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    valid = ("import pandas as pd\ndf = pd.read_csv('a.csv')\nm = df.median()\n",)
    functions = {"torch.median": "aten::median", "torch.nanmedian": "aten::nanmedian"}
    methods = {"median": "aten::median", "nanmedian": "aten::nanmedian"}


class ScaledMatmul(_FallbackOp):
    code = "XLA519"
    needs = ("_scaled_mm",)
    title = "`torch._scaled_mm` (float8 matmul) runs on the CPU"
    detects = (
        "`torch._scaled_mm(a, b, scale_a=..., scale_b=...)` in device code (float8 training and inference kernels)."
    )
    why = (
        "`aten::_scaled_mm` has no XLA lowering in torch_xla 2.9 (measured: `met.executed_fallback_ops()` lists "
        "it): every call copies both operands to the host, multiplies there and copies the result back, every "
        "step. The float8 speed-up it was written for is lost many times over."
    )
    before = (
        "import torch\n\n"
        "class Fp8Linear(torch.nn.Module):\n"
        "    def forward(self, x, w, sx, sw):\n"
        "        return torch._scaled_mm(x, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)\n"
    )
    message = (
        "`torch._scaled_mm` falls back to the CPU on XLA; multiply in bfloat16 (`(x.to(torch.bfloat16) * sx) @ "
        "(w.to(torch.bfloat16) * sw)`), or keep float8 weights and dequantize before the matmul"
    )
    symptoms = ("aten::_scaled_mm", "pt-xla-profiler: Op(s) not lowered: aten::_scaled_mm")
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    valid = ("import torch\nclass M(torch.nn.Module):\n    def forward(self, a, b):\n        return torch.mm(a, b)\n",)
    functions = {"torch._scaled_mm": "aten::_scaled_mm"}


SPARSE_MESSAGE = (
    "sparse tensors have no XLA backend: moving one to the device raises `NotImplementedError: Could not run "
    "'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the 'SparseXLA' backend`"
)


SPARSE_MATMUL_MESSAGE = (
    "a sparse matmul in device code: its sparse operand cannot be on the XLA device (no SparseXLA backend); "
    "densify it where it is moved (`adj.to_dense().to(device)`): `torch.spmm` then runs as a dense matmul (measured, "
    "no fallback); use `torch.mm` for `torch.sparse.mm` (on dense XLA tensors it falls back to the CPU)"
)


class SparseTensorOnDevice(StepContextRule):
    code = "XLA520"
    needs = ("sparse", "spmm", "smm")
    title = "Sparse tensors cannot live on the XLA device"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        "A sparse tensor (`torch.sparse_coo_tensor(...)`, `torch.sparse_csr_tensor(...)`, `t.to_sparse()`, or a "
        "name assigned one, or the result of one of the module's functions that returns one) moved to a device with "
        "`.to(device)` / `.cuda()`; `.to_sparse()` in device code; `torch.spmm` / `torch.sparse.mm` in device code "
        "(the sparse operand of a graph convolution, moved in another module). The fix densifies before the move: "
        "`s.to_dense().to(device)`."
    )
    why = (
        "torch_xla 2.9 has no SparseXLA kernels: `sparse.to('xla')` and `.to_sparse()` on an XLA tensor raise "
        "`NotImplementedError ... 'SparseXLA' backend` (measured). Densifying first keeps the values, and dense "
        "matmuls are what the TPU runs well; but memory grows to the dense size, and sparse-only calls on the "
        "result (`torch.sparse.mm`, `._values()`, `.coalesce()`) need their dense equivalents: review the fix. "
        "For a large sparse operand keep it on the CPU and move only the dense results."
    )
    before = "import torch\n\nadj = torch.sparse_coo_tensor(index, weight, (n, n))\nadj = adj.to(device)\n"
    after = "import torch\n\nadj = torch.sparse_coo_tensor(index, weight, (n, n))\nadj = adj.to_dense().to(device)\n"
    message = f"{SPARSE_MESSAGE}; densify it first (`.to_dense()`) or keep it on the CPU"
    symptoms = (
        "NotImplementedError: Could not run 'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from "
        "the 'SparseXLA' backend",
    )
    references = ("pytorch/xla#3455 (sparse tensors are not supported)",)
    valid = (
        "import torch\nadj = torch.sparse_coo_tensor(i, v, (3, 3))\nadj = adj.to('cpu')\n",
        "import torch\nadj = torch.sparse_coo_tensor(i, v, (3, 3)).to_dense().to(device)\n",
        "import torch\nx = torch.zeros(3).to(device)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, *SPARSE_MATMULS):
            if self.in_device_context(node):
                self.report(node, SPARSE_MATMUL_MESSAGE)
            return
        method = method_name(node)
        if method in SPARSE_METHODS and not node.args:
            if self.in_device_context(node) and not self._moved_to_host(node):
                self.report(node, f"{SPARSE_MESSAGE}; keep the tensor dense on the device, or sparsify on the CPU")
            return
        if method not in ("to", "cuda") or not self._moves_to_device(node):
            return
        receiver = node.func.value
        if is_sparse(self, receiver):
            dense = cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name("to_dense")))
            self.report(node, replacement=node.with_changes(func=node.func.with_changes(value=dense)))

    def _moves_to_device(self, call: cst.Call) -> bool:
        if method_name(call) == "cuda":
            return True
        args = positional_args(call)
        target = args[0].value if args else getattr(keyword_arg(call, "device"), "value", None)
        if target is None or string_value(target) == "cpu":
            return False
        return not self.qualified_startswith(target, "torch.float", "torch.bfloat16", "torch.half", "torch.int")

    def _moved_to_host(self, node: cst.Call) -> bool:
        """`x.cpu().to_sparse()`, `x.to("cpu").to_sparse()`: sparsified on the host."""
        receiver = node.func.value
        if isinstance(receiver, cst.Call):
            inner = method_name(receiver)
            if inner == "cpu":
                return True
            args = positional_args(receiver)
            return inner == "to" and bool(args) and string_value(args[0].value) == "cpu"
        return False


WEIGHT_NORM_FIX = (
    "register the same reparametrization without the fused kernel: `class WeightNormXla(nn.Module)` with "
    "`forward(self, g, v): return v * (g / torch.norm_except_dim(v, 2, self.dim))` and `right_inverse(self, w): "
    "return torch.norm_except_dim(w, 2, self.dim), w`, then `parametrize.register_parametrization(module, 'weight', "
    "WeightNormXla(dim), unsafe=True)`"
)


class WeightNorm(Rule):
    code = "XLA523"
    needs = ("weight_norm",)
    title = "`weight_norm` runs on the CPU (its fused kernel has no XLA lowering)"
    category = "C5"
    fix = "manual"
    detects = (
        "`torch.nn.utils.weight_norm(module)` and `torch.nn.utils.parametrizations.weight_norm(module)` "
        "(TCNs, WaveNet-style vocoders, GAN discriminators). `dim=None` (one norm for the whole tensor) is fine."
    )
    why = (
        "Both APIs compute the weight with `torch._weight_norm`, which for `dim=0` (the default) or the last "
        "dimension calls the fused `aten::_weight_norm_interface`: torch_xla 2.9 has no lowering for it nor for its "
        "backward, so every forward and backward of every such layer copies the weight to the host and back "
        "(measured: 2 CPU fallbacks per layer per step; a TCN had 84 per step). The same formula written with "
        "lowered ops, `v * (g / torch.norm_except_dim(v, 2, dim))`, runs on the device with no fallback and the same "
        "losses to float rounding (measured, 3 SGD steps). Checkpoints: `weight_norm` saves `weight_g`/`weight_v`; "
        "a parametrization saves `parametrizations.weight.original0`/`original1` (`original0` is g), so old "
        "checkpoints need their keys renamed (torch's own `parametrizations.weight_norm` renames them on load, but "
        "it falls back the same way)."
    )
    before = (
        "import torch.nn as nn\nfrom torch.nn.utils import weight_norm\n\n"
        "class TemporalBlock(nn.Module):\n"
        "    def __init__(self, n_in, n_out, k):\n"
        "        super().__init__()\n"
        "        self.conv = weight_norm(nn.Conv1d(n_in, n_out, k))\n"
    )
    message = (
        "`weight_norm` falls back to the CPU on XLA every forward and backward [aten::_weight_norm_interface]; "
        f"{WEIGHT_NORM_FIX} (checkpoint keys change: weight_g/weight_v -> parametrizations.weight.original0/1)"
    )
    symptoms = (
        "aten::_weight_norm_interface",
        "aten::_weight_norm_interface_backward",
        "pt-xla-profiler: Op(s) not lowered: aten::_weight_norm_interface",
    )
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report", "aten/src/ATen/native/WeightNorm.cpp")
    valid = (
        "import torch.nn as nn\nfrom torch.nn.utils import weight_norm\nconv = weight_norm(nn.Conv1d(2, 2, 3), dim=None)\n",
        "import torch.nn as nn\nfrom torch.nn.utils import spectral_norm\nconv = spectral_norm(nn.Conv1d(2, 2, 3))\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(
            node, "torch.nn.utils.weight_norm", "torch.nn.utils.parametrizations.weight_norm"
        ) or is_literal(getattr(keyword_arg(node, "dim"), "value", None), "None"):
            return
        self.report(node)
