"""C5 — CUDA mixed precision: `torch.cuda.amp` autocast and GradScaler, float16 (TPUs compute in bfloat16)."""

from __future__ import annotations

import libcst as cst

from xlaport.targets import TARGETS

from ..analysis.devices import analyse, is_cuda_value
from ..analysis.module import Nodes
from ..analysis.saves import flows_to_save
from ..cst_helpers import (
    add_kwarg,
    code_of,
    expr,
    is_cuda_string,
    keyword_arg,
    kwarg,
    method_name,
    parenthesized,
    positional_args,
    string_value,
    with_commas,
)
from ..rule import IMPORT_TORCH, REMOVE
from ..step_rule import StepContextRule

CUDA_AUTOCAST = frozenset({"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"})
DEVICE_AUTOCAST = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
CUDA_SCALER = frozenset({"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"})
DEVICE_SCALER = frozenset({"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"})
FLOAT16 = frozenset({"torch.float16", "torch.half"})
BFLOAT16 = frozenset({"torch.bfloat16"})
BF16_RAISES = (
    "CUDA autocast with bfloat16 raises `RuntimeError: Current CUDA Device does not support bfloat16` on a host "
    'without CUDA; the XLA autocast keeps bfloat16: `torch.autocast("xla", dtype=torch.bfloat16)`'
)
OFF_ON_XLA = (
    "CUDA autocast does not reach XLA tensors, and its `enabled=` is a CUDA test that is False on a TPU: "
    'use `torch.autocast("xla", dtype=torch.bfloat16)` and decide by hand when it is enabled'
)


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


class CudaAutocast(_AmpRule):
    code = "XLA501"
    needs = ("autocast",)
    title = "CUDA autocast does not reach XLA tensors (and raises with bfloat16 without CUDA)"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        '`torch.cuda.amp.autocast(...)`, `torch.autocast("cuda", ...)`, `torch.autocast(device_type="cuda")` '
        'and `torch.amp.autocast("cuda")`, as context managers or decorators. The fix is '
        '`torch.autocast("xla", dtype=torch.bfloat16)`, keeping `enabled=` and `cache_enabled=`.'
    )
    why = (
        "Autocast is per device type: a CUDA autocast region does not touch XLA tensors, so the migrated model "
        "silently runs in float32 (slower, more memory). TPUs do mixed precision in bfloat16, which needs no "
        "loss scaling; with the torch_xla wrapper a float16 dtype only warns "
        "`TPU Autocast only supports dtype of torch.bfloat16` and disables autocast. Unsafe: float16 (or the "
        "float32 the untouched region computes in on XLA) becomes bfloat16, which rounds differently: the "
        "numbers change. Left alone, the CUDA region still runs on XLA, in float32. With `dtype=torch.bfloat16` "
        "it is not a no-op: on a host without CUDA it raises `RuntimeError: Current CUDA Device does not support "
        "bfloat16` when entered (measured, torch 2.9); that fix is safe, the dtype it asked for stays."
    )
    before = "import torch\n\nwith torch.cuda.amp.autocast(dtype=torch.float16):\n    loss = model(x)\n"
    after = 'import torch\n\nwith torch.autocast("xla", dtype=torch.bfloat16):\n    loss = model(x)\n'
    message = (
        "CUDA autocast does not reach XLA tensors (without CUDA it disables itself): the region runs in float32; "
        'use `torch.autocast("xla", dtype=torch.bfloat16)`'
    )
    symptoms = (
        "TPU Autocast only supports dtype of torch.bfloat16",
        # torch's own wording (torch/amp/autocast_mode.py): CUDA autocast where CUDA is missing, and XLA autocast
        # given a dtype it does not take
        "UserWarning: User provided device_type of 'cuda', but CUDA is not available. Disabling",
        "XLA Autocast only supports dtype of torch.bfloat16 currently.",
        "matmul output dtype stays float32",
        "RuntimeError: Current CUDA Device does not support bfloat16. Please switch dtype to float16.",
    )
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
        enabled = found.get("enabled")
        if enabled is not None and analyse(self.analysis.module).cuda_only_switch(enabled.value):
            self.report(node, message=OFF_ON_XLA)  # the bf16 autocast would stay off: a silent float32 run
            return
        args = [cst.Arg(cst.SimpleString('"xla"')), kwarg("dtype", expr("torch.bfloat16"))]
        for name in ("enabled", "cache_enabled"):
            if name in found:
                args.append(kwarg(name, found[name].value))
        replacement = cst.Call(func=expr("torch.autocast"), args=with_commas(args))
        dtype = found.get("dtype")
        if dtype is not None and self.qualified_names(dtype.value) & BFLOAT16:
            # it asked for bfloat16 and keeps it; left alone it raises at start-up on a host without CUDA
            self.report(node, BF16_RAISES, replacement=replacement, imports=(IMPORT_TORCH,), fix="safe")
        else:
            self.report(node, replacement=replacement, imports=(IMPORT_TORCH,))


HALF_REASON = "the code still trains in float16 (fix XLA503 first)"


class CudaGradScaler(_AmpRule):
    """What the fix does with each scaler. When every use is one of `scaler.scale(loss).backward()`,
    `scaler.step(opt)`, `scaler.update()`, `scaler.unscale_(opt)`, the scaler goes: `loss.backward()`, `opt.step()`.
    Scalers built with `enabled=`, used in other ways (state_dict, get_scale, passed around, `None` when off) or not
    bound to a name are built with `enabled=False` instead: a disabled GradScaler passes every call through, so every
    use stays valid. A scaler built on the training device's variable (`torch.amp.GradScaler(device_type)`) counts
    as a CUDA one. In code that still trains in float16 it is reported for a manual change (float16 without loss
    scaling underflows).
    """

    code = "XLA502"
    needs = ("gradscaler",)
    title = "GradScaler is not needed with bfloat16 and syncs with the host every step"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        '`torch.cuda.amp.GradScaler()`, `torch.amp.GradScaler("cuda")`, `torch.GradScaler()` and the uses of the '
        "scaler. The fix removes the scaler where its uses allow it (`scaler.scale(loss).backward()` becomes "
        "`loss.backward()`), else builds it with `enabled=False`; float16 training is reported for a manual change."
    )
    why = (
        "Loss scaling exists for float16's narrow exponent range; bfloat16 (TPU mixed precision) has float32's "
        "range and needs none. On XLA tensors the CUDA scaler still runs its inf/NaN check, which reads a value "
        "on the host every step (`aten::_local_scalar_dense`), and `scaler.step` bypasses `xm.optimizer_step` "
        "(no gradient all-reduce in multi-process runs). Unsafe: without loss scaling, steps the scaler would "
        "skip (inf/NaN gradients) are taken and small float16 gradients are no longer rescued: the numbers "
        "change. Left alone (the default), the scaler keeps working on XLA tensors with the same numbers: torch keeps "
        "a CUDA GradScaler enabled when torch_xla is installed, and the CUDA autocast it pairs with computes in "
        "float32 on XLA, where its power-of-two scaling is exact. It costs one host read per step (`found_inf` "
        "in `scaler.step`, measured with torch_xla 2.9: 1 host transfer per step, no recompiles after "
        "warm-up); XLA406 places its step barrier after `scaler.update()`. torch_xla 2.9 has no GradScaler "
        "of its own, and torch's scaler does not use `torch_xla.amp.syncfree` optimizers: there is no sync-free "
        "loss scaling to switch to."
    )
    before = (
        "import torch\n\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "for x, y in loader:\n"
        '    with torch.autocast("xla", dtype=torch.bfloat16):\n'
        "        loss = model(x, y)\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.unscale_(optimizer)\n"
        "    scaler.step(optimizer)\n"
        "    scaler.update()\n"
    )
    after = (
        "import torch\n\n"
        "for x, y in loader:\n"
        '    with torch.autocast("xla", dtype=torch.bfloat16):\n'
        "        loss = model(x, y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    message = (
        "GradScaler: kept by default (dropping loss scaling changes the numbers); on XLA it works but reads its "
        "inf check on the host every step (a cost in time, not in correctness); `--unsafe-fixes` removes it with "
        "XLA501 (bfloat16 autocast needs no loss scaling)"
    )
    symptoms = (
        "UserWarning: torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
        "aten::_local_scalar_dense",
        "pt-xla-profiler: TransferFromDeviceTime too frequent",
    )
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
        half_training = self._trains_in_float16(found)
        for call in found.calls:
            if not self._is_scaler(call) or id(call) in tracked_calls:
                continue
            if half_training:  # float16 without loss scaling underflows: as for a bound scaler, by hand
                self.report(call, f"remove the GradScaler by hand (bfloat16 needs no loss scaling): {HALF_REASON}")
            else:
                self._disable(call, "it is not bound to a name")
        for key, assigns in tracked.items():
            self._handle(key, assigns, found, half_training)

    def _is_scaler(self, call: cst.Call) -> bool:
        names = self.qualified_names(call.func)
        if names & CUDA_SCALER:
            return True
        if names & DEVICE_SCALER:
            args = positional_args(call)
            device = args[0].value if args else getattr(keyword_arg(call, "device"), "value", None)
            return device is None or _accelerator(device) or self._holds_accelerator(device)
        return False

    def _holds_accelerator(self, device: cst.BaseExpression) -> bool:
        """A variable the program assigns the CUDA (or, migrated, the XLA) device to: `device_type = "cuda"`,
        also in a conditional. The scaler follows the device type, whatever the device's spelling."""
        if not isinstance(device, cst.Name):
            return False
        values = self.assigned_values(device)
        branches = [b for v in values for b in ((v.body, v.orelse) if isinstance(v, cst.IfExp) else (v,))]
        return any(_accelerator(b) for b in branches)

    def _trains_in_float16(self, found: Nodes) -> bool:
        """`.half()` or a float16 dtype outside a CUDA autocast call (which XLA501 turns into bfloat16)."""
        source = self.analysis.source
        if source is not None and "half" not in source and "float16" not in source:
            return False  # no import-resolved name is torch.float16 or torch.half unless the text spells it
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
            reason = HALF_REASON
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
                reason = reason or f"`{self._first_line(use)}` is not a known scaler use"
                continue
            edits.append(edit)
        if reason is not None and half_training:
            for assign in assigns:
                self.report(assign.value, f"remove the GradScaler by hand (bfloat16 needs no loss scaling): {reason}")
            return
        if reason is not None:
            for assign in assigns:
                self._disable(assign.value, reason)
            return
        for node, replacement in edits:
            self.report(node, replacement=replacement)

    def _disable(self, call: cst.Call, reason: str) -> None:
        """Where the scaler cannot go, it is built disabled: a disabled GradScaler passes every call through
        (`scale` returns the loss, `step` steps, `update`/`unscale_` do nothing; no host read), so every use
        stays valid and the program keeps its shape."""
        enabled = keyword_arg(call, "enabled")
        off = cst.Name("False")
        if enabled is not None:
            args = [a.with_changes(value=off) if a is enabled else a for a in call.args]
            replacement = call.with_changes(args=args)
        else:
            replacement = add_kwarg(call, "enabled", off)
        message = (
            "GradScaler built with `enabled=False` on XLA (bfloat16 needs no loss scaling; a disabled scaler "
            f"passes every call through and reads nothing on the host); not removed: {reason}"
        )
        self.report(call, message, replacement=replacement)

    def _first_line(self, use: cst.CSTNode) -> str:
        """The first line of the statement holding `use`, without the comments above it (one line of message)."""
        stmt = self.statement_of(use) or use
        if hasattr(stmt, "leading_lines"):
            stmt = stmt.with_changes(leading_lines=())
        return code_of(stmt).strip().splitlines()[0]

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


class Float16(_AmpRule):
    code = "XLA503"
    targets = TARGETS  # detection, message and fix hold on TorchTPU too
    needs = ("half", "float16", "fp16")
    title = "float16 on TPU: use bfloat16"
    category = "C5"
    fix = "unsafe"
    autofix = True
    detects = (
        "`.half()`, `dtype=torch.float16` / `torch.half` arguments (`.to(torch.float16)`, "
        "`from_pretrained(torch_dtype=torch.float16)`, `torch.zeros(..., dtype=torch.half)`), "
        '`dtype = torch.float16` assignments and `torch_dtype="float16"`. The fix uses bfloat16.'
    )
    why = (
        "TPUs compute in bfloat16; float16 is emulated, slower, and its narrow range overflows without a "
        "GradScaler (which XLA502 removes). bfloat16 keeps float32's range with fewer mantissa bits, so results "
        "change slightly: check the numerics after the switch. float16 in what a program saves (`torch.save`, "
        "`save_pretrained`, a state dict filled for a save) is a file format its readers expect, not a "
        "computation on the TPU: it is left alone."
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
        if self.facts().cpu_script:
            return  # float16 on the CPU of a script that names no device: nothing moves to the TPU
        if method_name(node) == "half" and not node.args:
            self._report(node.func.attr, cst.Name("bfloat16"))
            return
        for keyword in ("torch_dtype", "dtype"):
            arg = keyword_arg(node, keyword)
            if arg is not None and string_value(arg.value) in ("float16", "half", "fp16"):
                quote = arg.value.value[0]
                self._report(arg.value, cst.SimpleString(f"{quote}bfloat16{quote}"))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self.qualified_names(node) & FLOAT16 and self._is_dtype_value(node):
            self._report(node, node.with_changes(attr=cst.Name("bfloat16")))

    def visit_Name(self, node: cst.Name) -> None:  # `from torch import float16`
        parent = self.parent(node)
        if isinstance(parent, (cst.Attribute, cst.ImportAlias)):
            return
        if self.qualified_names(node) & FLOAT16 and self._is_dtype_value(node):
            self._report(node, expr("torch.bfloat16"), (IMPORT_TORCH,))

    def _report(self, node: cst.CSTNode, replacement: cst.CSTNode, imports: tuple = ()) -> None:
        if not flows_to_save(self, node):  # a float16 checkpoint is a file format its readers expect: no TPU matter
            self.report(node, replacement=replacement, imports=imports)

    def _is_dtype_value(self, node: cst.CSTNode) -> bool:
        if self.facts().cpu_script:
            return False
        parent = self.parent(node)
        if isinstance(parent, cst.Arg):
            return not self.inside_cuda_autocast(node)  # XLA501 rewrites the whole call
        if isinstance(parent, (cst.Assign, cst.AnnAssign)):
            return parent.value is node
        return isinstance(parent, cst.DictElement) and parent.value is node


def _accelerator(node: cst.CSTNode | None) -> bool:
    return is_cuda_value(node) or string_value(node) == "xla"
