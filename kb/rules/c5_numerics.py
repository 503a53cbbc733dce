"""C5 — numerics that differ on TPU: matmul precision, BCE on a sigmoid, tight tolerances, bfloat16 accumulators."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import code_of, expr, keyword_arg, method_name, parenthesized, positional_args, string_value
from ..rule import IMPORT_TORCH, IMPORT_XLA_BACKENDS, MATMUL_PRECISIONS, ImportSpec
from ..scoped_rule import AUTOCASTS
from ..step_rule import StepContextRule

SIGMOID = frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"})


class Float32MatmulPrecision(StepContextRule):
    code = "XLA504"
    needs = ("set_float32_matmul_precision",)
    title = "`torch.set_float32_matmul_precision` does not reach XLA"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        '`torch.set_float32_matmul_precision("highest" | "high" | "medium")`. The fix calls '
        '`torch_xla.backends.set_mat_mul_precision` with "highest" / "high" / "default".'
    )
    why = (
        "The setting only steers CUDA/CPU kernels (TF32). On TPU, float32 matmuls default to one bfloat16 pass "
        "(about 3 significant digits) whatever it says, so parity with the CUDA run drifts. torch_xla has its own "
        "switch: 'default' (1 pass), 'high' (3 passes), 'highest' (6 passes, ~fp32). Higher precision costs "
        "matmul throughput, hence unsafe."
    )
    before = 'import torch\n\ntorch.set_float32_matmul_precision("high")\n'
    after = 'import torch_xla.backends\n\ntorch_xla.backends.set_mat_mul_precision("high")\n'
    message = "the float32 matmul precision of XLA is set by `torch_xla.backends.set_mat_mul_precision`"
    symptoms = ("loss/activation drift vs the CUDA run", "allclose failures")
    references = ("torch_xla/backends/__init__.py", "pytorch/xla#8811")
    valid = ("import torch_xla.backends\ntorch_xla.backends.set_mat_mul_precision('high')\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.set_float32_matmul_precision"):
            return
        args = positional_args(node)
        value = string_value(args[0].value) if len(args) == 1 and len(node.args) == 1 else None
        if value not in MATMUL_PRECISIONS:
            self.report(node)
            return
        replacement = cst.Call(
            func=expr("torch_xla.backends.set_mat_mul_precision"),
            args=[cst.Arg(cst.SimpleString(f'"{MATMUL_PRECISIONS[value]}"'))],
        )
        self.report(node, replacement=replacement, imports=(IMPORT_XLA_BACKENDS,))


class BceOnSigmoid(StepContextRule):
    code = "XLA505"
    needs = ("binary_cross_entropy", "bceloss", "log")
    title = "BCE on sigmoid outputs saturates in bfloat16: use the logits form"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        "`F.binary_cross_entropy(torch.sigmoid(z), y)` (rewritten to `F.binary_cross_entropy_with_logits(z, y)`), "
        "`torch.log(torch.sigmoid(z))` / `torch.log(1 - torch.sigmoid(z))` (rewritten to `F.logsigmoid(z)` / "
        "`F.logsigmoid(-z)`), and `nn.BCELoss()` in code that applies a sigmoid (manual)."
    )
    why = (
        "In bfloat16 `sigmoid(10)` rounds to exactly 1.0, so `log(1 - p)` hits BCE's clamp (loss 100) or gives "
        "NaN; XLA's fusion can also round differently from eager. The logits forms compute the same loss "
        "stably. Values change in the last bits, hence unsafe."
    )
    before = (
        "import torch\nimport torch.nn.functional as F\n\n"
        "loss = F.binary_cross_entropy(torch.sigmoid(logits), target)\n"
    )
    after = "import torch.nn.functional as F\n\nloss = F.binary_cross_entropy_with_logits(logits, target)\n"
    message = "BCE on sigmoid probabilities saturates in bfloat16; use `BCEWithLogitsLoss` on the logits"
    symptoms = ("loss is 100.0", "loss is nan", "NaN in BCE under bfloat16")
    references = ("pytorch/xla PR #4311",)
    valid = (
        "import torch.nn.functional as F\nloss = F.binary_cross_entropy_with_logits(z, y)\n",
        "import torch\nloss_fn = torch.nn.BCELoss()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.nn.functional.binary_cross_entropy"):
            self._functional_bce(node)
        elif self.is_call_to(node, "torch.log"):
            self._log_sigmoid(node)
        elif self.is_call_to(node, "torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss") and self._uses_sigmoid(node):
            self.report(
                node,
                "`BCELoss` on sigmoid outputs saturates in bfloat16 (loss 100 / NaN); drop the final sigmoid and use "
                "`nn.BCEWithLogitsLoss()`",
            )

    def _sigmoid_argument(self, node: cst.CSTNode) -> cst.BaseExpression | None:
        if not isinstance(node, cst.Call):
            return None
        if self.qualified_names(node.func) & SIGMOID and len(node.args) == 1 and node.args[0].keyword is None:
            return node.args[0].value
        if method_name(node) == "sigmoid" and not node.args:
            return node.func.value
        return None

    def _functional_bce(self, node: cst.Call) -> None:
        args = list(node.args)
        logits = self._sigmoid_argument(args[0].value) if args and args[0].keyword is None else None
        if logits is None:
            if self._uses_sigmoid(node):
                self.report(node)
            return
        func = node.func
        imports: tuple[ImportSpec, ...] = ()
        if isinstance(func, cst.Attribute):
            new_func = func.with_changes(attr=cst.Name("binary_cross_entropy_with_logits"))
        else:
            new_func = cst.Name("binary_cross_entropy_with_logits")
            imports = (("torch.nn.functional", "binary_cross_entropy_with_logits", None),)
        args[0] = args[0].with_changes(value=logits)
        self.report(node, replacement=node.with_changes(func=new_func, args=args), imports=imports)

    def _log_sigmoid(self, node: cst.Call) -> None:
        if len(node.args) != 1 or node.args[0].keyword is not None:
            return
        inner = node.args[0].value
        logits = self._sigmoid_argument(inner)
        if logits is not None:
            replacement = cst.Call(func=expr("torch.nn.functional.logsigmoid"), args=[cst.Arg(logits)])
        elif (
            isinstance(inner, cst.BinaryOperation)
            and isinstance(inner.operator, cst.Subtract)
            and isinstance(inner.left, (cst.Integer, cst.Float))
            and float(inner.left.value) == 1.0
            and self._sigmoid_argument(inner.right) is not None
        ):
            negated = cst.UnaryOperation(
                operator=cst.Minus(), expression=parenthesized(self._sigmoid_argument(inner.right))
            )
            replacement = cst.Call(func=expr("torch.nn.functional.logsigmoid"), args=[cst.Arg(negated)])
        else:
            return
        self.report(
            node,
            "`log(sigmoid(z))` underflows in bfloat16; use `F.logsigmoid(z)` (and `F.logsigmoid(-z)` for log(1 - sigmoid(z)))",
            replacement=replacement,
            imports=(IMPORT_TORCH,),
        )

    def _uses_sigmoid(self, node: cst.CSTNode) -> bool:
        """Weak evidence (a sigmoid somewhere in the module), so only where the module computes in low
        precision (bfloat16, half or autocast): a float32 program's BCE behaves as on a GPU."""
        facts = self.facts()
        low_precision = (
            facts.uses_bf16
            or bool(facts.qnames & AUTOCASTS)
            or any(method_name(c) == "half" for c in self.module_nodes().calls)
            or facts.uses("torch.float16", "torch.half")
        )
        sigmoid = bool(facts.qnames & (SIGMOID | {"torch.nn.Sigmoid"})) or any(
            method_name(c) == "sigmoid" for c in self.module_nodes().calls
        )
        return low_precision and sigmoid


TIGHT_TOLERANCE = 1e-3
CLOSE_CALLS = frozenset(
    {"torch.allclose", "torch.isclose", "torch.testing.assert_close", "torch.testing.assert_allclose"}
)


class TightTolerance(StepContextRule):
    code = "XLA515"
    needs = ("close",)
    title = "float32 parity check with a tight tolerance will fail on TPU"
    category = "C5"
    fix = "manual"
    detects = (
        "`torch.allclose` / `torch.isclose` / `torch.testing.assert_close` with the default tolerances or an "
        "`rtol`/`atol` below 1e-3, in code that runs on a device."
    )
    why = (
        "TPU float32 matmuls use one bfloat16 pass by default (~3 significant digits), and XLA fuses ops, which "
        "changes rounding (even bf16 round trips get elided). Bit-for-bit or 1e-5 parity with a CUDA/CPU reference "
        "fails although the migration is correct."
    )
    before = (
        "import torch\nimport torch_xla\n\n"
        "out = model(x.to(torch_xla.device()))\n"
        "assert torch.allclose(out.cpu(), reference)\n"
    )
    message = (
        "XLA float32 matmuls default to one bfloat16 pass: compare with bf16-aware tolerances (rtol ~1e-2) or set "
        "`torch_xla.backends.set_mat_mul_precision('highest')` for parity runs; sync before comparing"
    )
    symptoms = ("allclose failures", "Mismatched elements", "Greatest relative difference")
    references = ("pytorch/xla#8811", "torch_xla/backends/__init__.py")
    valid = (
        "import torch\nimport torch_xla\nassert torch.allclose(a, b, rtol=1e-2, atol=1e-2)\n",
        "import torch\nassert torch.allclose(a, b)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        is_method = method_name(node) == "allclose" and not self._is_torch_function(node.func)
        if not (self.is_call_to(node, *CLOSE_CALLS) or is_method):
            return
        if not self.facts().device_code:
            return
        given = [arg for arg in (keyword_arg(node, "rtol"), keyword_arg(node, "atol")) if arg is not None]
        if any(not _is_tight(arg.value) for arg in given):
            return  # a loose (or computed) tolerance was chosen on purpose
        self.report(node)


def _is_tight(value: cst.CSTNode) -> bool:
    if isinstance(value, (cst.Float, cst.Integer)):
        return float(value.value.replace("_", "")) < TIGHT_TOLERANCE
    return False


class Bfloat16Accumulator(StepContextRule):
    code = "XLA516"
    needs = ("bf16", "bfloat16")
    title = "Running sums of bfloat16 tensors stop growing"
    category = "C5"
    fix = "manual"
    detects = (
        "`total += loss` style accumulation of tensors inside the training loop of code that trains in "
        "bfloat16 (`.bfloat16()`, `torch.bfloat16`, `XLA_USE_BF16`)."
    )
    why = (
        "bfloat16 has 8 bits of mantissa: once a running sum is large, small additions round away "
        "(4096 + 1 == 4096). Epoch losses and metric counts come out wrong with no error."
    )
    before = (
        "import torch\n\n"
        "model = model.to(torch.bfloat16)\n"
        "running_loss = 0.0\n"
        "for x, y in loader:\n"
        "    loss = model(x, y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    running_loss += loss.detach()\n"
    )
    message = "accumulate in float32: `running += loss.detach().float()` (or keep an fp32 tensor accumulator)"
    symptoms = ("epoch loss stops changing", "metric sums too small")
    references = ("pytorch/xla PR #2425",)
    valid = (
        "import torch\nmodel = model.to(torch.bfloat16)\ntotal = 0.0\n"
        "for x in loader:\n    loss = model(x)\n    loss.backward()\n    optimizer.step()\n"
        "    total += loss.detach().float()\n",
    )

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if not isinstance(node.operator, cst.AddAssign) or not self.facts().uses_bf16:
            return
        if self.step_loop(node) is None or not self.is_tensor(node.value):
            return
        value = node.value
        if isinstance(value, cst.Call) and method_name(value) in ("float", "double"):
            return
        self.report(node)


HALF_DTYPES = frozenset({"torch.float16", "torch.half", "torch.bfloat16"})


class BatchNormKeptInFloat32(StepContextRule):
    code = "XLA524"
    needs = ("batchnorm",)
    title = "BatchNorm kept in float32 in a float16/bfloat16 network: max-pool backward fails on XLA"
    category = "C5"
    fix = "manual"
    detects = (
        "A BatchNorm layer cast back to float32 (`m.float()` under `isinstance(m, nn.BatchNorm2d)`, a BatchNorm "
        "subclass too) in a module that casts its network to float16 or bfloat16 (`.half()`, `.bfloat16()`, "
        "`.to(torch.float16)`)."
    )
    why = (
        "With float16 input and float32 weights, CPU and CUDA batch norm return the input's float16; torch_xla's "
        "returns float32, and the network mixes precisions where CUDA did not: the next float16 convolution "
        "raises `RuntimeError: Input type (float) and bias type (c10::Half) should be the same`, and where a "
        "max-pool feeds the BatchNorm, XLA's HLO verifier rejects the backward (`Seen floating point types of "
        "different precisions in %select-and-scatter ... but mixed precision is disallowed`: a float32 gradient "
        "for a float16 input). bfloat16 fails the same way. Casting the output back is not enough (the gradient "
        "stays float32); normalising a float32 copy of the input is: `super().forward(x.float()).to(x.dtype)`, "
        "the arithmetic CUDA does for this mix. No safe rewrite: the layer's class must change."
    )
    before = (
        "import torch.nn as nn\n\n"
        "net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.MaxPool2d(2), nn.BatchNorm2d(8), nn.ReLU())\n"
        "for m in net.modules():\n"
        "    if isinstance(m, nn.BatchNorm2d):\n"
        "        m.float()\n"
        "    else:\n"
        "        m.half()\n"
    )
    message = (
        "BatchNorm kept in float32 while the network is float16/bfloat16: XLA's batch norm returns float32 (CUDA "
        "returns the input's dtype), so the next float16 layer or max-pool's backward fails (`mixed precision is "
        "disallowed`); normalise a float32 copy and cast back: `super().forward(x.float()).to(x.dtype)` in a "
        "BatchNorm subclass, or keep the whole network in one dtype"
    )
    symptoms = (
        "Seen floating point types of different precisions in %select-and-scatter",
        "but mixed precision is disallowed",
        "RuntimeError: Input type (float) and bias type (c10::Half) should be the same",
    )
    references = ("tests/kb/test_xla_mixed_precision.py (torch_xla 2.9, PJRT_DEVICE=CPU)",)
    valid = (
        "import torch.nn as nn\nnet = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n"
        "for m in net.modules():\n    if isinstance(m, nn.BatchNorm2d):\n        m.float()\n",
        "import torch.nn as nn\nnet = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).half()\n"
        "for m in net.modules():\n    if isinstance(m, nn.Linear):\n        m.float()\n",
        "import torch.nn as nn\nnet = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).half()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return
        if not (func.attr.value == "float" and not node.args or self._to_float32(node)):
            return
        if self._under_batchnorm_test(node, func.value.value) and self._network_is_half():
            self.report(node)

    def _to_float32(self, node: cst.Call) -> bool:
        if method_name(node) != "to":
            return False
        dtype = keyword_arg(node, "dtype")
        args = [dtype] if dtype is not None else positional_args(node)
        return any(self.qualified_names(a.value) & {"torch.float32", "torch.float"} for a in args)

    def _under_batchnorm_test(self, node: cst.Call, name: str) -> bool:
        """In the true branch of `if isinstance(name, <a BatchNorm class>)` (or of `... if ... else ...`)."""
        child: cst.CSTNode = node
        for anc in self.ancestors(node):
            if (
                isinstance(anc, (cst.If, cst.IfExp))
                and child is anc.body
                and self._isinstance_batchnorm(anc.test, name)
            ):
                return True
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
                return False
            child = anc
        return False

    def _isinstance_batchnorm(self, test: cst.BaseExpression, name: str) -> bool:
        if not (isinstance(test, cst.Call) and code_of(test.func) == "isinstance" and len(test.args) == 2):
            return False
        subject, kinds = test.args[0].value, test.args[1].value
        classes = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
        return code_of(subject) == name and any(self._batchnorm_class(c) for c in classes)

    def _batchnorm_class(self, node: cst.BaseExpression) -> bool:
        """`nn.BatchNorm2d`, `SyncBatchNorm`, `_BatchNorm`, or a class of this module that derives from one."""
        if "BatchNorm" in code_of(node):
            return True
        if not isinstance(node, cst.Name):
            return False
        defined = [c for c in self.analysis.module.body if isinstance(c, cst.ClassDef) and c.name.value == node.value]
        return any("BatchNorm" in code_of(base.value) for c in defined for base in c.bases)

    def _network_is_half(self) -> bool:
        """Does the module cast something to float16 or bfloat16?"""
        for call in self.analysis.nodes.calls:
            name = method_name(call)
            if name in ("half", "bfloat16") and not call.args:
                return True
            if name == "to" and any(self.qualified_names(a.value) & HALF_DTYPES for a in call.args):
                return True
        return False
