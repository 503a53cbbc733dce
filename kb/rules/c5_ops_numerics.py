"""C5 — unsupported ops, CPU fallback and numerics: CUDA AMP, fp16, ops without an XLA lowering.

The fallback lists were measured with torch_xla 2.9 on PJRT_DEVICE=CPU (`met.executed_fallback_ops()`):
each op below ran on the CPU, which costs a device->host->device round trip every time it runs.
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst

from ..analysis.context import StepContextRule
from ..analysis.module import Nodes
from ..cst_helpers import code_of, kwarg, method_name, parenthesized, with_commas
from ..rule import (
    IMPORT_TORCH,
    REMOVE,
    ImportSpec,
    expr,
    is_cuda_string,
    keyword_arg,
    positional_args,
    register,
    string_value,
)

IMPORT_XLA_BACKENDS: ImportSpec = ("torch_xla.backends", None, None)

CUDA_AUTOCAST = frozenset({"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"})
DEVICE_AUTOCAST = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
CUDA_SCALER = frozenset({"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"})
DEVICE_SCALER = frozenset({"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"})
FLOAT16 = frozenset({"torch.float16", "torch.half"})
SIGMOID = frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"})


class _AmpRule(StepContextRule):
    def cuda_autocast_args(self, call: cst.Call) -> dict[str, cst.Arg] | None:
        """The arguments of a CUDA autocast call by name (enabled/dtype/cache_enabled), else None."""
        names = self.qualified_names(call.func)
        if any(a.star for a in call.args):
            return None
        positional = positional_args(call)
        if names & CUDA_AUTOCAST:
            order = ("enabled", "dtype", "cache_enabled")
        elif names & DEVICE_AUTOCAST:
            device = positional[0].value if positional else getattr(keyword_arg(call, "device_type"), "value", None)
            if not is_cuda_string(device):
                return None
            positional = positional[1:]
            order = ("dtype", "enabled", "cache_enabled")
        else:
            return None
        found = dict(zip(order, positional, strict=False))
        found.update({a.keyword.value: a for a in call.args if a.keyword is not None})
        return found

    def inside_cuda_autocast(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, cst.Call) and self.cuda_autocast_args(a) is not None for a in self.ancestors(node))


@register
class CudaAutocast(_AmpRule):
    code = "XLA501"
    title = "CUDA autocast does nothing on XLA tensors"
    category = "C5"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.cuda.amp.autocast(...)`, `torch.autocast(\"cuda\", ...)`, `torch.autocast(device_type=\"cuda\")` "
        "and `torch.amp.autocast(\"cuda\")`, as context managers or decorators. The fix is "
        "`torch.autocast(\"xla\", dtype=torch.bfloat16)`, keeping `enabled=` and `cache_enabled=`."
    )
    why = (
        "Autocast is per device type: a CUDA autocast region does not touch XLA tensors, so the migrated model "
        "silently runs in float32 (slower, more memory). TPUs do mixed precision in bfloat16, which needs no "
        "loss scaling; with the torch_xla wrapper a float16 dtype only warns "
        "`TPU Autocast only supports dtype of torch.bfloat16` and disables autocast."
    )
    before = (
        "import torch\n\n"
        "with torch.cuda.amp.autocast(dtype=torch.float16):\n"
        "    loss = model(x)\n"
    )
    after = (
        "import torch\n\n"
        "with torch.autocast(\"xla\", dtype=torch.bfloat16):\n"
        "    loss = model(x)\n"
    )
    message = "CUDA autocast is a no-op on XLA tensors; use `torch.autocast(\"xla\", dtype=torch.bfloat16)`"
    symptoms = ("TPU Autocast only supports dtype of torch.bfloat16", "matmul output dtype stays float32")
    references = ("pytorch/xla docs: perf/amp.md", "torch_xla/amp/autocast_mode.py")
    valid = (
        "import torch\nwith torch.autocast('xla', dtype=torch.bfloat16):\n    y = model(x)\n",
        "import torch\nwith torch.autocast('cpu'):\n    y = model(x)\n",
        "import torch\nwith torch.autocast(device_type=device.type):\n    y = model(x)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        found = self.cuda_autocast_args(node)
        if found is None:
            if self.qualified_names(node.func) & CUDA_AUTOCAST:
                self.report(node)  # *args / **kwargs: rewrite by hand
            return
        args = [cst.Arg(cst.SimpleString('"xla"')), kwarg("dtype", expr("torch.bfloat16"))]
        for name in ("enabled", "cache_enabled"):
            if name in found:
                args.append(kwarg(name, found[name].value))
        replacement = cst.Call(func=expr("torch.autocast"), args=with_commas(args))
        self.report(node, replacement=replacement, imports=(IMPORT_TORCH,))


@register
class CudaGradScaler(_AmpRule):
    code = "XLA502"
    title = "GradScaler is not needed with bfloat16 and syncs with the host every step"
    category = "C5"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.cuda.amp.GradScaler()`, `torch.amp.GradScaler(\"cuda\")`, `torch.GradScaler()` and the uses of "
        "the scaler. When every use is one of `scaler.scale(loss).backward()`, `scaler.step(opt)`, "
        "`scaler.update()`, `scaler.unscale_(opt)`, the fix removes the scaler: `loss.backward()`, `opt.step()`. "
        "Scalers built with `enabled=`, used in other ways (state_dict, get_scale, passed around) or in code that "
        "still trains in float16 are reported for a manual change."
    )
    why = (
        "Loss scaling exists for float16's narrow exponent range; bfloat16 (TPU mixed precision) has float32's "
        "range and needs none. On XLA tensors the CUDA scaler still runs its inf/NaN check, which reads a value "
        "on the host every step (`aten::_local_scalar_dense`), and `scaler.step` bypasses `xm.optimizer_step` "
        "(no gradient all-reduce in multi-process runs)."
    )
    before = (
        "import torch\n\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "for x, y in loader:\n"
        "    with torch.autocast(\"xla\", dtype=torch.bfloat16):\n"
        "        loss = model(x, y)\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.unscale_(optimizer)\n"
        "    scaler.step(optimizer)\n"
        "    scaler.update()\n"
    )
    after = (
        "import torch\n\n"
        "for x, y in loader:\n"
        "    with torch.autocast(\"xla\", dtype=torch.bfloat16):\n"
        "        loss = model(x, y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    message = "bfloat16 needs no loss scaling and the CUDA GradScaler syncs every step; remove the scaler"
    symptoms = ("aten::_local_scalar_dense", "pt-xla-profiler: TransferFromDeviceTime too frequent")
    references = ("pytorch/xla docs: perf/amp.md (best practices)", "huggingface/accelerate PR #1926")
    valid = (
        "import torch\nloss.backward()\noptimizer.step()\n",
        "import torch\nscaler = torch.amp.GradScaler('cpu')\n",
    )

    def visit_Module(self, node: cst.Module) -> None:
        found = self.module_nodes()
        tracked: dict[str, list[cst.Assign]] = {}
        for assign in found.assigns:
            if (
                isinstance(assign, cst.Assign)
                and len(assign.targets) == 1
                and isinstance(assign.value, cst.Call)
                and self._is_scaler(assign.value)
            ):
                tracked.setdefault(code_of(assign.targets[0].target), []).append(assign)
        tracked_calls = {id(a.value) for assigns in tracked.values() for a in assigns}
        for call in found.calls:
            if self._is_scaler(call) and id(call) not in tracked_calls:
                self.report(call, "GradScaler not bound to a name; remove it by hand (bfloat16 needs no loss scaling)")
        half_training = self._trains_in_float16(found)
        for key, assigns in tracked.items():
            self._handle(key, assigns, found, half_training)

    def _is_scaler(self, call: cst.Call) -> bool:
        names = self.qualified_names(call.func)
        if names & CUDA_SCALER:
            return True
        if names & DEVICE_SCALER:
            args = positional_args(call)
            device = args[0].value if args else getattr(keyword_arg(call, "device"), "value", None)
            return device is None or is_cuda_string(device)
        return False

    def _trains_in_float16(self, found: Nodes) -> bool:
        """`.half()` or a float16 dtype outside a CUDA autocast call (which XLA501 turns into bfloat16)."""
        for call in found.calls:
            if method_name(call) == "half" and not call.args:
                return True
        for name in found.names:
            if self.qualified_names(name) & FLOAT16 and not self.inside_cuda_autocast(name):
                return True
        return False

    def _handle(self, key: str, assigns: list[cst.Assign], found: Nodes, half_training: bool) -> None:
        reason = None
        if any(keyword_arg(a.value, "enabled") is not None for a in assigns):
            reason = "built with `enabled=`"
        elif half_training:
            reason = "the code still trains in float16 (fix XLA503 first)"
        edits: list[tuple[cst.CSTNode, object]] = []
        for assign in assigns:
            line = self.parent(assign)
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                edits.append((line, REMOVE))
            else:
                reason = reason or "assigned inside a compound statement"
        targets = {id(a.targets[0].target) for a in assigns}
        for use in self._uses(key, found):
            if id(use) in targets or any(id(anc) in targets for anc in self.ancestors(use)):
                continue
            edit = self._rewrite(use)
            if edit is None:
                reason = reason or f"`{code_of(self.statement_of(use) or use).strip()}` is not a known scaler use"
                continue
            edits.append(edit)
        if reason is not None:
            for assign in assigns:
                self.report(assign.value, f"remove the GradScaler by hand (bfloat16 needs no loss scaling): {reason}")
            return
        for node, replacement in edits:
            self.report(node, replacement=replacement)

    def _uses(self, key: str, found: Nodes) -> list[cst.CSTNode]:
        uses = []
        for name in found.names:
            if code_of(name) != key:
                continue
            parent = self.parent(name)
            if isinstance(parent, cst.Attribute) and parent.attr is name:
                continue
            if isinstance(parent, cst.Arg) and parent.keyword is name:
                continue
            if isinstance(name, cst.Name) and isinstance(parent, cst.Attribute) and code_of(parent) == key:
                continue  # `self` inside `self.scaler`
            uses.append(name)
        return uses

    def _rewrite(self, use: cst.CSTNode) -> tuple[cst.CSTNode, object] | None:
        method = self.parent(use)
        call = self.parent(method)
        if not (isinstance(method, cst.Attribute) and method.value is use and isinstance(call, cst.Call)):
            return None
        args = positional_args(call)
        name = method.attr.value
        if name == "scale" and len(args) == 1 and len(call.args) == 1:
            backward_attr = self.parent(call)
            backward = self.parent(backward_attr)
            if (
                isinstance(backward_attr, cst.Attribute)
                and backward_attr.attr.value == "backward"
                and isinstance(backward, cst.Call)
                and self._is_statement(backward)
            ):
                func = cst.Attribute(value=parenthesized(args[0].value), attr=cst.Name("backward"))
                return backward, backward.with_changes(func=func)
            return None
        if name == "step" and len(args) == 1 and len(call.args) == 1 and self._is_statement(call):
            return call, cst.Call(func=cst.Attribute(value=parenthesized(args[0].value), attr=cst.Name("step")))
        if (name == "update" and not call.args) or (name == "unscale_" and len(call.args) == 1):
            line = self.parent(self.parent(call))
            if self._is_statement(call) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                return line, REMOVE
        return None

    def _is_statement(self, call: cst.Call) -> bool:
        return isinstance(self.parent(call), cst.Expr)


@register
class Float16(_AmpRule):
    code = "XLA503"
    title = "float16 on TPU: use bfloat16"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        "`.half()`, `dtype=torch.float16` / `torch.half` arguments (`.to(torch.float16)`, "
        "`from_pretrained(torch_dtype=torch.float16)`, `torch.zeros(..., dtype=torch.half)`), "
        "`dtype = torch.float16` assignments and `torch_dtype=\"float16\"`. The fix uses bfloat16."
    )
    why = (
        "TPUs compute in bfloat16; float16 is emulated, slower, and its narrow range overflows without a "
        "GradScaler (which XLA502 removes). bfloat16 keeps float32's range with fewer mantissa bits, so results "
        "change slightly: check the numerics after the switch."
    )
    before = "import torch\n\nmodel = model.half()\nx = torch.zeros(4, dtype=torch.float16)\n"
    after = "import torch\n\nmodel = model.bfloat16()\nx = torch.zeros(4, dtype=torch.bfloat16)\n"
    message = "float16 is not the TPU's reduced precision; use bfloat16"
    symptoms = ("inf/NaN loss in float16 without a GradScaler", "slow float16 ops on TPU")
    references = ("pytorch/xla docs: perf/amp.md",)
    valid = (
        "import torch\nif x.dtype == torch.float16:\n    pass\n",
        "import numpy as np\na = np.zeros(3, dtype=np.float16)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) == "half" and not node.args:
            self.report(node.func.attr, replacement=cst.Name("bfloat16"))
            return
        for keyword in ("torch_dtype", "dtype"):
            arg = keyword_arg(node, keyword)
            if arg is not None and string_value(arg.value) in ("float16", "half", "fp16"):
                quote = arg.value.value[0]
                self.report(arg.value, replacement=cst.SimpleString(f"{quote}bfloat16{quote}"))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self.qualified_names(node) & FLOAT16 and self._is_dtype_value(node):
            self.report(node, replacement=node.with_changes(attr=cst.Name("bfloat16")))

    def visit_Name(self, node: cst.Name) -> None:  # `from torch import float16`
        parent = self.parent(node)
        if isinstance(parent, (cst.Attribute, cst.ImportAlias)):
            return
        if self.qualified_names(node) & FLOAT16 and self._is_dtype_value(node):
            self.report(node, replacement=expr("torch.bfloat16"), imports=(IMPORT_TORCH,))

    def _is_dtype_value(self, node: cst.CSTNode) -> bool:
        parent = self.parent(node)
        if isinstance(parent, cst.Arg):
            return not self.inside_cuda_autocast(node)  # XLA501 rewrites the whole call
        if isinstance(parent, (cst.Assign, cst.AnnAssign)):
            return parent.value is node
        return isinstance(parent, cst.DictElement) and parent.value is node


PRECISIONS = {"highest": "highest", "high": "high", "medium": "default"}


@register
class Float32MatmulPrecision(StepContextRule):
    code = "XLA504"
    title = "`torch.set_float32_matmul_precision` does not reach XLA"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        "`torch.set_float32_matmul_precision(\"highest\" | \"high\" | \"medium\")`. The fix calls "
        "`torch_xla.backends.set_mat_mul_precision` with \"highest\" / \"high\" / \"default\"."
    )
    why = (
        "The setting only steers CUDA/CPU kernels (TF32). On TPU, float32 matmuls default to one bfloat16 pass "
        "(about 3 significant digits) whatever it says, so parity with the CUDA run drifts. torch_xla has its own "
        "switch: 'default' (1 pass), 'high' (3 passes), 'highest' (6 passes, ~fp32). Higher precision costs "
        "matmul throughput, hence unsafe."
    )
    before = "import torch\n\ntorch.set_float32_matmul_precision(\"high\")\n"
    after = "import torch\nimport torch_xla.backends\n\ntorch_xla.backends.set_mat_mul_precision(\"high\")\n"
    message = "the float32 matmul precision of XLA is set by `torch_xla.backends.set_mat_mul_precision`"
    symptoms = ("loss/activation drift vs the CUDA run", "allclose failures")
    references = ("torch_xla/backends/__init__.py", "pytorch/xla#8811")
    valid = ("import torch_xla.backends\ntorch_xla.backends.set_mat_mul_precision('high')\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.set_float32_matmul_precision"):
            return
        args = positional_args(node)
        value = string_value(args[0].value) if len(args) == 1 and len(node.args) == 1 else None
        if value not in PRECISIONS:
            self.report(node)
            return
        replacement = cst.Call(
            func=expr("torch_xla.backends.set_mat_mul_precision"),
            args=[cst.Arg(cst.SimpleString(f'"{PRECISIONS[value]}"'))],
        )
        self.report(node, replacement=replacement, imports=(IMPORT_XLA_BACKENDS,))


@register
class BceOnSigmoid(StepContextRule):
    code = "XLA505"
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
    after = (
        "import torch\nimport torch.nn.functional as F\n\n"
        "loss = F.binary_cross_entropy_with_logits(logits, target)\n"
    )
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
            negated = cst.UnaryOperation(operator=cst.Minus(), expression=parenthesized(self._sigmoid_argument(inner.right)))
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
        facts = self.facts()
        return bool(facts.qnames & (SIGMOID | {"torch.nn.Sigmoid"})) or any(
            method_name(c) == "sigmoid" for c in self.module_nodes().calls
        )


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
    detects = "`F.interpolate(..., mode=\"bicubic\")`, `nn.Upsample(mode=\"bicubic\")`; the fix uses \"bilinear\"."
    why = (
        "`upsample_bicubic2d` has no XLA lowering in 2.9 (`aten::upsample_bicubic2d` fallback): every call copies "
        "the feature map to the host and back. Bilinear is lowered; it gives slightly different (smoother) "
        "values, hence unsafe."
    )
    before = (
        "import torch.nn.functional as F\n\n"
        "y = F.interpolate(x, scale_factor=2, mode=\"bicubic\", align_corners=False)\n"
    )
    after = (
        "import torch.nn.functional as F\n\n"
        "y = F.interpolate(x, scale_factor=2, mode=\"bilinear\", align_corners=False)\n"
    )
    message = "bicubic upsampling falls back to the CPU (`aten::upsample_bicubic2d`); use mode=\"bilinear\""
    symptoms = ("aten::upsample_bicubic2d", "pt-xla-profiler: Op(s) not lowered: aten::upsample_bicubic2d")
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    valid = ("import torch.nn.functional as F\ny = F.interpolate(x, scale_factor=2, mode='bilinear')\n",)

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
        if mode is not None and string_value(mode.value) == "bicubic":
            quote = mode.value.value[0]
            self.report(mode.value, replacement=cst.SimpleString(f"{quote}bilinear{quote}"))


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
            if not self.is_host_value(node.func.value):
                return self.methods[method]
        return None

    def visit_Call(self, node: cst.Call) -> None:
        counter = self.counter(node)
        if counter is not None and self.in_device_context(node):
            self.report(node, f"{self.message} [{counter}]")


@register
class GridSample(_FallbackOp):
    code = "XLA508"
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
    symptoms = ("aten::grid_sampler_2d", "aten::grid_sampler_2d_backward", "pt-xla-profiler: Op(s) not lowered: aten::grid_sampler_2d")
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    functions = {"torch.nn.functional.grid_sample": "aten::grid_sampler_2d", "torch.grid_sampler": "aten::grid_sampler_2d"}


@register
class RepeatInterleaveTensor(_FallbackOp):
    code = "XLA509"
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
        if repeats is not None and (self.is_tensor(repeats) or self.is_call_to(repeats, "torch.tensor", "torch.as_tensor")):
            return "aten::repeat_interleave.Tensor"
        return None


@register
class CountingOps(_FallbackOp):
    code = "XLA510"
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


@register
class CtcLoss(_FallbackOp):
    code = "XLA511"
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
    symptoms = ("aten::_ctc_loss.Tensor", "aten::_ctc_loss_backward", "pt-xla-profiler: Op(s) not lowered: aten::_ctc_loss")
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


@register
class Fft(_FallbackOp):
    code = "XLA512"
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
    symptoms = ("aten::_fft_r2c", "aten::_fft_c2c", "aten::_fft_c2r", "pt-xla-profiler: Op(s) not lowered: aten::_fft_r2c")
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    valid = ("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return torch.fft.fftshift(x)\n",)
    functions = {
        **{f"torch.fft.{name}": "aten::_fft_r2c / aten::_fft_c2c / aten::_fft_c2r" for name in FFT_FUNCTIONS},
        "torch.stft": "aten::_fft_r2c",
        "torch.istft": "aten::_fft_c2r",
    }
    methods = {"stft": "aten::_fft_r2c", "istft": "aten::_fft_c2r"}


@register
class EmbeddingBag(_FallbackOp):
    code = "XLA513"
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
        "        self.emb = nn.EmbeddingBag(10000, 64, mode=\"mean\")\n"
    )
    message = (
        "EmbeddingBag falls back to the CPU; use `nn.Embedding` on fixed-size padded bags and reduce with a mask "
        "(`(emb(ids) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)`)"
    )
    symptoms = ("aten::_embedding_bag", "aten::_embedding_bag_forward_only", "pt-xla-profiler: Op(s) not lowered: aten::_embedding_bag")
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    functions = {
        "torch.nn.EmbeddingBag": "aten::_embedding_bag",
        "torch.nn.modules.sparse.EmbeddingBag": "aten::_embedding_bag",
        "torch.nn.functional.embedding_bag": "aten::_embedding_bag",
        "torch.embedding_bag": "aten::_embedding_bag",
    }


@register
class Median(_FallbackOp):
    code = "XLA514"
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
    symptoms = ("aten::median", "aten::median.dim_values", "aten::nanmedian", "pt-xla-profiler: Op(s) not lowered: aten::median")
    references = ("pytorch/xla troubleshoot.md: Get A Metrics Report",)
    valid = ("import pandas as pd\ndf = pd.read_csv('a.csv')\nm = df.median()\n",)
    functions = {"torch.median": "aten::median", "torch.nanmedian": "aten::nanmedian"}
    methods = {"median": "aten::median", "nanmedian": "aten::nanmedian"}


# ======================================================================================
# Numerics
# ======================================================================================

TIGHT_TOLERANCE = 1e-3
CLOSE_CALLS = frozenset({"torch.allclose", "torch.isclose", "torch.testing.assert_close", "torch.testing.assert_allclose"})


@register
class TightTolerance(StepContextRule):
    code = "XLA515"
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


@register
class Bfloat16Accumulator(StepContextRule):
    code = "XLA516"
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


@register
class PackedSequences(StepContextRule):
    code = "XLA517"
    title = "Packed sequences: dynamic shapes on XLA, and torch_xla's GRU rejects them"
    category = "C5"
    fix = "manual"
    detects = "`pack_padded_sequence` / `pack_sequence` in device code; the message notes when the module builds an `nn.GRU`."
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
