"""C5 — ops with an XLA-friendly equivalent (multinomial without replacement, bicubic upsampling) and packed sequences."""

from __future__ import annotations

import libcst as cst

from ..analysis.context import StepContextRule
from ..cst_helpers import code_of, expr, keyword_arg, method_name, positional_args, string_value
from ..rule import IMPORT_TORCH, register


@register
class MultinomialWithoutReplacement(StepContextRule):
    code = "XLA506"
    title = "`torch.multinomial` without replacement runs on the CPU"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        "`torch.multinomial(p, k)` / `p.multinomial(k)` drawing more than one sample without replacement. When "
        "`p` is a name, the fix samples with the Gumbel-top-k trick: "
        "`torch.topk(torch.log(p) - torch.log(-torch.log(torch.rand_like(p))), k, dim=-1).indices`."
    )
    why = (
        "torch_xla 2.9 lowers `multinomial` for one sample or with replacement only; otherwise it falls back to "
        "the CPU (`aten::multinomial`) with a device round trip each call. Gumbel-top-k draws from the same "
        "distribution with lowered ops (`topk`), but from a different random stream, hence unsafe."
    )
    before = "import torch\n\nidx = torch.multinomial(probs, 4)\n"
    after = (
        "import torch\n\n"
        "idx = torch.topk(torch.log(probs) - torch.log(-torch.log(torch.rand_like(probs))), 4, dim=-1).indices\n"
    )
    message = "`multinomial` without replacement falls back to the CPU (`aten::multinomial`); sample with Gumbel-top-k"
    symptoms = ("aten::multinomial", "pt-xla-profiler: Op(s) not lowered: aten::multinomial")
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    valid = (
        "import torch\nnext_token = torch.multinomial(probs, num_samples=1)\n",
        "import torch\nidx = torch.multinomial(probs, 8, replacement=True)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.multinomial"):
            args = positional_args(node)
            probs = args[0].value if args else getattr(keyword_arg(node, "input"), "value", None)
            rest = args[1:]
        elif method_name(node) == "multinomial" and not self._is_torch_function(node.func):
            probs = node.func.value
            rest = positional_args(node)
        else:
            return
        samples = rest[0].value if rest else getattr(keyword_arg(node, "num_samples"), "value", None)
        replacement = rest[1].value if len(rest) > 1 else getattr(keyword_arg(node, "replacement"), "value", None)
        if samples is None or (isinstance(samples, cst.Integer) and samples.evaluated_value == 1):
            return
        if isinstance(replacement, cst.Name) and replacement.value == "True":
            return
        fixable = (
            replacement is None
            and isinstance(probs, (cst.Name, cst.Attribute))
            and not ({"generator", "out"} & {a.keyword.value for a in node.args if a.keyword is not None})
        )
        if not fixable:
            self.report(node)
            return
        p = code_of(probs)
        k = code_of(samples)
        new = expr(f"torch.topk(torch.log({p}) - torch.log(-torch.log(torch.rand_like({p}))), {k}, dim=-1).indices")
        self.report(node, replacement=new, imports=(IMPORT_TORCH,))


@register
class BicubicInterpolation(StepContextRule):
    code = "XLA507"
    title = "Bicubic interpolation runs on the CPU"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        '`F.interpolate(..., mode="bicubic")`, `nn.Upsample(mode="bicubic")` in device code (the step loop, model '
        'code, a module that uses a device); the fix uses "bilinear".'
    )
    why = (
        "`upsample_bicubic2d` has no XLA lowering in 2.9 (`aten::upsample_bicubic2d` fallback): every call copies "
        "the feature map to the host and back. Bilinear is lowered; it gives slightly different (smoother) "
        "values, hence unsafe."
    )
    before = (
        "import torch.nn.functional as F\n\n"
        "def forward(self, x):\n"
        '    return F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=False)\n'
    )
    after = (
        "import torch.nn.functional as F\n\n"
        "def forward(self, x):\n"
        '    return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)\n'
    )
    message = 'bicubic upsampling falls back to the CPU (`aten::upsample_bicubic2d`); use mode="bilinear"'
    symptoms = ("aten::upsample_bicubic2d", "pt-xla-profiler: Op(s) not lowered: aten::upsample_bicubic2d")
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    valid = (
        "import torch.nn.functional as F\ny = F.interpolate(x, scale_factor=2, mode='bilinear')\n",
        # a one-off resize of checkpoint weights in a helper of a module that names no device: on the CPU
        "import torch.nn.functional as F\ndef resize(pos):\n    return F.interpolate(pos, size=(14, 14), mode='bicubic')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(
            node,
            "torch.nn.functional.interpolate",
            "torch.nn.functional.upsample",
            "torch.nn.Upsample",
            "torch.nn.modules.upsampling.Upsample",
        ):
            return
        mode = keyword_arg(node, "mode")
        if mode is None or string_value(mode.value) != "bicubic":
            return
        if self.in_device_context(node):  # not data preparation or a one-off weight resize on the CPU
            quote = mode.value.value[0]
            self.report(mode.value, replacement=cst.SimpleString(f"{quote}bilinear{quote}"))


@register
class PackedSequences(StepContextRule):
    code = "XLA517"
    title = "Packed sequences: dynamic shapes on XLA, and torch_xla's GRU rejects them"
    category = "C5"
    fix = "manual"
    detects = (
        "`pack_padded_sequence` / `pack_sequence` in device code; the message notes when the module builds an `nn.GRU`."
    )
    why = (
        "`import torch_xla` replaces `torch.nn.GRU` with a scan-based GRU that raises "
        "`AssertionError: PackedSequence is not supported`. For any RNN, packing needs the lengths on the host "
        "(`lengths.cpu()`, a sync) and gives data-dependent shapes (a compile per length pattern)."
    )
    before = (
        "import torch.nn as nn\nfrom torch.nn.utils.rnn import pack_padded_sequence\n\n"
        "class Encoder(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.rnn = nn.GRU(32, 64)\n\n"
        "    def forward(self, x, lengths):\n"
        "        return self.rnn(pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False))\n"
    )
    message = (
        "packed sequences mean host syncs and dynamic shapes on XLA; run the RNN on the padded batch and mask the "
        "outputs (gather the state at `lengths - 1`)"
    )
    symptoms = ("PackedSequence is not supported. Use a regular tensor instead.", "aten::_local_scalar_dense")
    references = ("torch_xla/_patched_functions.py", "torch_xla/experimental/gru.py")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(
            node,
            "torch.nn.utils.rnn.pack_padded_sequence",
            "torch.nn.utils.rnn.pack_sequence",
        ) or not self.in_device_context(node):
            return
        if self.facts().qnames & {"torch.nn.GRU", "torch.nn.modules.rnn.GRU"}:
            self.report(
                node,
                "torch_xla replaces `nn.GRU` with a scan-based GRU that raises `PackedSequence is not supported`; "
                "feed the padded tensor and mask the outputs (gather the state at `lengths - 1`)",
            )
        else:
            self.report(node)
