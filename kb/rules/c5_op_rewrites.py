"""C5 — ops with an XLA-friendly equivalent (multinomial without replacement, bicubic upsampling) and packed sequences."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import code_of, expr, keyword_arg, method_name, positional_args, string_value, with_commas
from ..cst_walk import walk
from ..rule import IMPORT_TORCH
from ..step_rule import StepContextRule


class MultinomialWithoutReplacement(StepContextRule):
    code = "XLA506"
    needs = ("multinomial",)
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


class BicubicInterpolation(StepContextRule):
    code = "XLA507"
    needs = ("interpolate", "upsample")
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


class PackedSequences(StepContextRule):
    code = "XLA517"
    needs = ("pack_",)
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


class NegativeSliceBeyondSize(StepContextRule):
    code = "XLA518"
    title = "A negative slice start larger than the dimension raises on XLA tensors"
    category = "C5"
    fix = "safe"
    autofix = True
    detects = (
        "`x[:, -n:]` or `x[..., t - span:]` on a tensor (a start computed at run time) with no size test around it "
        "(`x if x.size(1) <= n else x[:, -n:]` is left alone). The fix clamps the start as CPU and CUDA do: "
        "`x[:, -min(n, x.size(1)):]`, `x[..., max(t - span, -x.size(-1)):]`. It needs evidence that `x` is a "
        "tensor; an untyped `forward` argument without it is reported for a manual look, one used as a list "
        "is not reported (lists clamp)."
    )
    why = (
        "CPU and CUDA tensors clamp a slice start below `-size` to the whole dimension, and autoregressive "
        "sampling loops rely on it (`idx_cond = idx[:, -context_size:]` while the prompt is still shorter than "
        "the context; a window `t - span` frames back at the start of a video). torch_xla 2.9 checks the bound "
        "and raises `RuntimeError: Value out of range (expected to be in range of [-4, 3], but got -256)` at the "
        "first short input. Safe: the clamped start selects the same elements on every device. A start of `-0` "
        "(`n == 0`) selects the whole dimension everywhere, XLA included: nothing to clamp."
    )
    before = "import torch\n\nidx = torch.cat((idx, nxt), dim=1)\nidx_cond = idx[:, -context_size:]\n"
    after = "import torch\n\nidx = torch.cat((idx, nxt), dim=1)\nidx_cond = idx[:, -min(context_size, idx.size(1)):]\n"
    message = (
        "a slice start below `-size` raises `Value out of range` on XLA tensors (CPU and CUDA clamp it); "
        "clamp it: `-min(n, x.size(dim))`, `max(start, -x.size(dim))`"
    )
    symptoms = ("RuntimeError: Value out of range (expected to be in range of",)
    references = ("tenstorrent/tt-xla#4465 (the same strict aten.slice bound)",)
    valid = (
        "import torch\nidx = torch.cat((idx, nxt), dim=1)\n"
        "idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]\n",
        "import torch\nidx = torch.cat((idx, nxt), dim=1)\nlast = idx[:, -1:]\n",
        "text = line[-trailing:]\n",
        "import torch\nkeys = torch.cat((cache, new), dim=1)\nkeep = min(keys.size(1), window)\nkeys = keys[:, -keep:]\n",
        "import torch\nframes = torch.stack(video, dim=1)\nprev = frames[:, t - 1 :]\ntail = frames[:, frames.size(1) - n :]\n",
        "import torch\nframes = torch.stack(video, dim=1)\nclip = frames[:, t - span :] if t >= span else frames[:, :t]\n",
        "import torch\nclass Mix(torch.nn.Module):\n    def forward(self, x, past, n):\n        past = past[-n:]\n"
        "        return torch.stack(past + [x])\n",
    )

    def visit_Subscript(self, node: cst.Subscript) -> None:
        indexes = [element.slice for element in node.slice]
        at = next((at for at, i in enumerate(indexes) if type(i) is cst.Slice and _runtime_negative(i.lower)), None)
        if at is None:
            return
        values = [i.value for i in indexes if type(i) is cst.Index]
        if any(type(v) is cst.Name and v.value == "None" for v in values):
            return  # a new axis: the positions no longer name the tensor's dims
        ellipses = [
            i for i, index in enumerate(indexes) if type(index) is cst.Index and type(index.value) is cst.Ellipsis
        ]
        if len(ellipses) > 1:
            return
        index = indexes[at]
        if self._size_tested(node) or self._clamped(index.lower) or not self.is_tensor(node.value):
            return
        dim = at - len(indexes) if ellipses and at > ellipses[0] else at  # after `...`: counted from the right
        self._report(node, index, dim)

    def _report(self, node: cst.Subscript, index: cst.Slice, dim: int) -> None:
        if not isinstance(node.value, (cst.Name, cst.Attribute)):
            self.report(node)  # the receiver has side effects or costs: clamp by hand
            return
        if not self.is_known_tensor(node.value):  # an untyped `forward` argument may be a list: `.size` would raise
            self.report(node, f"{self.message} (if `{code_of(node.value)}` is a tensor: nothing here says so)")
            return
        size = expr(f"{code_of(node.value)}.size({dim})")
        bound = index.lower
        if isinstance(bound, cst.UnaryOperation):  # `-n` -> `-min(n, x.size(d))`
            args = with_commas([cst.Arg(bound.expression), cst.Arg(size)])
            clamped = cst.UnaryOperation(cst.Minus(), cst.Call(cst.Name("min"), args))
        else:  # `i - k` -> `max(i - k, -x.size(d))`
            args = with_commas([cst.Arg(bound), cst.Arg(cst.UnaryOperation(cst.Minus(), size))])
            clamped = cst.Call(cst.Name("max"), args)
        self.report(node, replacement=node.deep_replace(index.lower, clamped))

    def _clamped(self, bound: cst.BaseExpression) -> bool:
        """`keep = min(keys.size(1), window + n - 1)`, `x.size(1) - n`: the code bounds it by a size already;
        `enc[i - k:i] if i >= k else ...`: a test compares the two sides of the difference."""
        if isinstance(bound, cst.BinaryOperation):
            return any(_reads_size(n) for n in walk(bound)) or self._compared(bound, code_of(bound.right))
        bound = bound.expression if isinstance(bound, cst.UnaryOperation) else bound
        if not isinstance(bound, cst.Name):
            return False
        values = self.assigned_values(bound)
        return bool(values) and all(
            isinstance(v, cst.Call) and code_of(v.func) == "min" and any(_reads_size(n) for n in walk(v))
            for v in values
        )

    def _compared(self, node: cst.BinaryOperation, right: str) -> bool:
        """Is `node` (`i - k`) under a test that reads both `i` and `k`?"""
        left = code_of(node.left)
        for anc in self.ancestors(node):
            test = anc.test if isinstance(anc, (cst.If, cst.IfExp, cst.While)) else None
            if test is not None:
                read = {code_of(n) for n in walk(test) if isinstance(n, (cst.Name, cst.Attribute))}
                if {left, right} <= read:
                    return True
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
                return False
        return False

    def _size_tested(self, node: cst.CSTNode) -> bool:
        """Is `node` under a test that reads a size (`if idx.size(1) > n`, `x if len(x) <= n else x[-n:]`)?"""
        for anc in self.ancestors(node):
            test = anc.test if isinstance(anc, (cst.If, cst.IfExp, cst.While)) else None
            if test is not None and any(_reads_size(n) for n in walk(test)):
                return True
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
                return False
        return False


def _runtime_negative(bound: cst.BaseExpression | None) -> bool:
    """A start that can be below `-size` at run time: `-n`, `-self.block_size`, `-cfg["ctx"]` (a negated value
    that is not a literal), `t - span`, `i - self.k` (a name minus a value that is not a literal: `t - 1` is left
    alone)."""
    if isinstance(bound, cst.UnaryOperation) and isinstance(bound.operator, cst.Minus):
        return isinstance(bound.expression, (cst.Name, cst.Attribute, cst.Subscript))
    if isinstance(bound, cst.BinaryOperation) and isinstance(bound.operator, cst.Subtract):
        # a position minus a length: `self.seq_len - t` (a capacity minus what it holds) stays >= 0 by design
        return isinstance(bound.left, cst.Name) and isinstance(bound.right, (cst.Name, cst.Attribute, cst.Subscript))
    return False


def _reads_size(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.Call):
        return method_name(node) in ("size", "dim", "numel") or code_of(node.func) == "len"
    return isinstance(node, cst.Attribute) and node.attr.value in ("shape", "ndim")
