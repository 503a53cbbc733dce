"""C4 — lazy-tensor execution: host syncs in the step loop, missing step barriers, recompilation.

XLA records tensor ops into a graph and runs it at a barrier. Reading a value on the host
(`.item()`, `float(t)`, `print(t)`, `if t > 0:`) runs a partial graph first and waits for it;
a loop without a barrier grows one huge graph; every new input shape compiles a new graph.
The context these checks share (step loops, tensors, scopes) is `kb.analysis.context.StepContextRule`.
"""

from __future__ import annotations

import libcst as cst

from ..analysis.context import ORDER_OPS, StepContextRule
from ..cst_helpers import DATALOADERS, add_kwarg, identifier, method_name
from ..rule import (
    IMPORT_PL,
    IMPORT_TORCH_XLA,
    IMPORT_XM,
    expr,
    keyword_arg,
    positional_args,
    register,
    string_value,
)

HOST_SYNC_FIX = (
    "log every N steps after the step barrier, or hand the tensor to "
    "`xm.add_step_closure(fn, args=(loss,))`; accumulate metrics on the device"
)

MULTIPROCESS_SIGNALS = (
    "torch_xla.launch",
    "torch_xla.torch_xla.launch",
    "torch_xla.distributed.xla_multiprocessing.spawn",
    "torch.multiprocessing.spawn",
    "torch.distributed.init_process_group",
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
    "torch_xla.runtime.world_size",
    "torch_xla.runtime.global_ordinal",
)
# Code that already reduces gradients (or needs no reduce): xm.optimizer_step would reduce twice.
GRADIENT_REDUCERS = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.distributed.fsdp",
    "torch_xla.distributed.fsdp",
    "torch_xla.distributed.spmd",
    "torch_xla.runtime.use_spmd",
    "accelerate",
    "torch_xla.core.xla_model.reduce_gradients",
    "torch_xla.core.xla_model.all_reduce",
)


# ======================================================================================
# Host syncs inside the training loop
# ======================================================================================


@register
class ItemInStepLoop(StepContextRule):
    code = "XLA401"
    title = "`.item()` inside the training loop syncs with the host every step"
    category = "C4"
    fix = "manual"
    detects = (
        "`t.item()` executed in every iteration of a loop that runs `backward()` / `optimizer.step()`, "
        "including `print(loss.item())` and `tqdm.set_postfix(loss=loss.item())`. Reads in the body of an "
        "every-N-steps branch (`if step % N == 0:`) are not flagged."
    )
    why = (
        "`.item()` must return a Python number, so XLA cuts the lazy graph there, compiles and runs the partial "
        "graph, and copies the value back, every step. The step loop runs as two graphs and waits on the device: "
        "counters `aten::_local_scalar_dense` and `TransferFromDeviceTime` grow per step; with `PT_XLA_DEBUG=1`: "
        "`TransferFromDeviceTime too frequent`. No error, just a much slower run."
    )
    before = (
        "for x, y in loader:\n"
        "    loss = loss_fn(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    print(loss.item())\n"
    )
    message = f"`.item()` in the step loop copies the value to the host every step; {HOST_SYNC_FIX}"
    symptoms = (
        "aten::_local_scalar_dense",
        "pt-xla-profiler: TransferFromDeviceTime too frequent",
        "Compilation Cause: most likely user code trying to access tensor value before torch_xla.sync",
    )
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats", "pytorch/xla#2120")
    valid = (
        "import torch_xla.core.xla_model as xm\n"
        "for x, y in loader:\n"
        "    loss = model(x).sum()\n"
        "    loss.backward()\n"
        "    xm.optimizer_step(optimizer)\n"
        "    xm.add_step_closure(lambda v: print(v.item()), args=(loss,))\n",
        "def log(v):\n    print(v.item())\n\nfor x in loader:\n    loss = model(x)\n    loss.backward()\n    log(loss)\n",
        "for epoch in range(3):\n"
        "    for x in loader:\n"
        "        loss = model(x)\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "    print(loss.item())\n",
        "for x in loader:\n    total += model(x).sum().item()\n",
        "import torch_xla\n"
        "for step, x in enumerate(loader):\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    torch_xla.sync()\n"
        "    if step % 100 == 0:\n"
        "        print(loss.item())\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) != "item" or node.args:
            return
        if self.per_step_loop(node) is None or self.is_host_value(node.func.value):
            return
        message = None
        for anc in self.ancestors(node):
            if isinstance(anc, cst.Call) and method_name(anc) in ("set_postfix", "set_description"):
                message = (
                    f"`tqdm.{method_name(anc)}(... .item())` syncs with the host every step; update the progress bar "
                    "every N steps or from `xm.add_step_closure(fn, args=(loss,))`"
                )
                break
            if isinstance(anc, cst.BaseStatement):
                break
        self.report(node, message)


@register
class ScalarCastInStepLoop(StepContextRule):
    code = "XLA402"
    title = "`float(t)` / `int(t)` / `bool(t)` on a tensor in the training loop syncs every step"
    category = "C4"
    fix = "manual"
    detects = (
        "`float()`, `int()`, `bool()` and `math.isnan/isinf/isfinite()` applied to a tensor (a loss, a model "
        "output, a reduction such as `.sum()`) inside a loop that runs the training step. `float(args.lr)` and "
        "other Python values are not flagged."
    )
    why = (
        "Converting a lazy XLA tensor to a Python number is a hidden `.item()`: the partial graph is compiled and "
        "run, and the value is copied to the host every step (`aten::_local_scalar_dense`, "
        "`TransferFromDeviceTime`). The run is silently slower."
    )
    before = (
        "import torch.nn.functional as F\n\n"
        "for x, y in loader:\n"
        "    loss = F.cross_entropy(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    history.append(float(loss))\n"
    )
    message = f"converting a tensor to a Python number in the step loop syncs with the host every step; {HOST_SYNC_FIX}"
    symptoms = ("aten::_local_scalar_dense", "pt-xla-profiler: TransferFromDeviceTime too frequent")
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats", "pytorch/xla#2120")
    valid = (
        "for x, y in loader:\n    loss = model(x)\n    loss.backward()\n    optimizer.step()\n    lr = float(args.lr)\n",
        "for step, x in enumerate(loader):\n    loss = model(x)\n    loss.backward()\n    n = int(step)\n",
        "loss = model(x)\nloss.backward()\nprint(float(loss))\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not (
            self.is_builtin(node.func, "float", "int", "bool")
            or self.is_call_to(node, "math.isnan", "math.isinf", "math.isfinite")
        ):
            return
        args = positional_args(node)
        if len(args) != 1 or self.per_step_loop(node) is None:
            return
        if self.is_tensor(args[0].value):
            self.report(node)


LOG_METHODS = frozenset({"set_postfix", "set_description", "add_scalar", "add_scalars", "info", "debug", "warning"})


@register
class TensorLoggedInStepLoop(StepContextRule):
    code = "XLA403"
    title = "Printing or logging a tensor in the training loop syncs every step"
    category = "C4"
    fix = "manual"
    detects = (
        "`print(loss)`, f-strings with a tensor, `pbar.set_postfix(loss=loss)`, `writer.add_scalar(tag, loss, "
        "step)`, `logger.info(f\"{loss}\")` and `wandb.log({...: loss})` inside the training-step loop."
    )
    why = (
        "Formatting a lazy tensor reads its value: XLA runs the pending graph and copies the value to the host "
        "every step. TensorBoard's `add_scalar` calls `.item()` itself. Counters `aten::_local_scalar_dense` / "
        "`TransferFromDeviceTime` grow per step."
    )
    before = (
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    print(f\"loss {loss}\")\n"
    )
    message = f"logging a tensor in the step loop reads it on the host every step; {HOST_SYNC_FIX}"
    symptoms = ("aten::_local_scalar_dense", "pt-xla-profiler: TransferFromDeviceTime too frequent")
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats",)
    valid = (
        "for step, x in enumerate(loader):\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    print(f\"step {step}\")\n",
        "import torch_xla.core.xla_model as xm\n"
        "for x in loader:\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    xm.optimizer_step(optimizer)\n"
        "    xm.add_step_closure(lambda v: print(v), args=(loss,))\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        is_print = isinstance(node.func, cst.Name) and self.is_builtin(node.func, "print")
        is_log = method_name(node) in LOG_METHODS or self.is_call_to(node, "wandb.log")
        if not (is_print or is_log) or self.per_step_loop(node) is None:
            return
        if any(self._logs_tensor(arg.value) for arg in node.args):
            self.report(node)

    def _logs_tensor(self, value: cst.CSTNode) -> bool:
        if isinstance(value, cst.FormattedString):
            return any(
                isinstance(part, cst.FormattedStringExpression) and self._logs_tensor(part.expression)
                for part in value.parts
            )
        if isinstance(value, cst.Dict):
            return any(isinstance(e, cst.DictElement) and self._logs_tensor(e.value) for e in value.elements)
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Modulo):
            right = value.right
            items = [e.value for e in right.elements] if isinstance(right, cst.Tuple) else [right]
            return any(self._logs_tensor(i) for i in items)
        if isinstance(value, cst.Call) and self.is_builtin(value.func, "str", "repr", "format"):
            return any(self._logs_tensor(a.value) for a in value.args)
        return self.is_tensor(value)


HOST_COPY_METHODS = frozenset({"cpu", "tolist", "numpy"})


@register
class HostCopyInStepLoop(StepContextRule):
    code = "XLA404"
    title = "`.cpu()` / `.tolist()` / `.numpy()` in the training loop copies to the host every step"
    category = "C4"
    fix = "manual"
    detects = "`.cpu()`, `.tolist()`, `.numpy()` and `.to(\"cpu\")` executed in every iteration of the step loop."
    why = (
        "Moving a lazy tensor to the CPU executes the pending graph and waits for the device-to-host transfer "
        "every step (`TransferFromDeviceTime` grows per step, the step runs as several graphs)."
    )
    before = (
        "for x, y in loader:\n"
        "    out = model(x)\n"
        "    loss = criterion(out, y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    preds.extend(out.argmax(-1).cpu().tolist())\n"
    )
    message = (
        "copying to the host in the step loop waits for the device every step; keep results on the device "
        "(accumulate, concatenate after the loop) or copy them in `xm.add_step_closure(fn, args=(t,))`"
    )
    symptoms = ("pt-xla-profiler: TransferFromDeviceTime too frequent", "TransferFromDeviceTime")
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats",)
    valid = (
        "for x in loader:\n    loss = model(x)\n    loss.backward()\n    optimizer.step()\n"
        "preds = model(x).cpu().numpy()\n",
        "for x in loader:\n    x = x.to(device)\n    loss = model(x)\n    loss.backward()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = method_name(node)
        to_cpu = name == "to" and len(node.args) == 1 and string_value(node.args[0].value) == "cpu"
        if not (name in HOST_COPY_METHODS and not node.args) and not to_cpu:
            return
        # report a chain like `t.cpu().numpy()` once, at its outermost call
        parent = self.parent(node)
        grand = self.parent(parent) if isinstance(parent, cst.Attribute) else None
        if isinstance(grand, cst.Call) and method_name(grand) in HOST_COPY_METHODS:
            return
        if self.per_step_loop(node) is not None and not self.is_host_value(node.func.value):
            self.report(node)


@register
class TensorControlFlow(StepContextRule):
    code = "XLA405"
    title = "Python `if` / `while` on a tensor value syncs and splits the graph"
    category = "C4"
    fix = "manual"
    detects = (
        "`if`, `elif`, `while`, conditional expressions and `assert` whose condition is a tensor: "
        "`if loss > best:`, `if mask.any():`, `while err > tol:`, `assert torch.isfinite(loss)`, in the step loop "
        "or in a model's `forward`."
    )
    why = (
        "Python needs a real bool, so `bool(t)` reads the value on the host (`aten::_local_scalar_dense`) and "
        "XLA traces one graph per branch taken: extra compiles and a host round trip every step."
    )
    before = (
        "import torch\n\n"
        "for x, y in loader:\n"
        "    loss = model(x, y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if torch.isnan(loss).any():\n"
        "        break\n"
    )
    message = (
        "the condition reads a tensor on the host every step and branches the graph; keep it on the device "
        "(`torch.where`, masks, fixed trip counts) or check it every N steps after the barrier"
    )
    symptoms = (
        "aten::_local_scalar_dense",
        "pt-xla-profiler: CompileTime too frequent",
        "Compilation Cause: most likely user code trying to access tensor value before torch_xla.sync",
    )
    references = ("pytorch/xla perf/recompilation.md: #3 From control flow",)
    valid = (
        "for step, x in enumerate(loader):\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % 100 == 0:\n"
        "        save()\n",
        "class M(nn.Module):\n"
        "    def forward(self, x, mask=None, return_dict: bool = True):\n"
        "        if mask is None:\n"
        "            mask = x\n"
        "        if return_dict:\n"
        "            return {'x': x}\n"
        "        if x.shape[1] > 8:\n"
        "            x = x[:, :8]\n"
        "        return x\n",
    )

    def _check(self, test: cst.BaseExpression) -> None:
        func = self.enclosing_function(test)
        in_forward = func is not None and func.name.value == "forward" and self.step_loop(test) is None
        if (self.step_loop(test) is not None or in_forward) and self._is_tensor_condition(test):
            self.report(test)

    def _is_tensor_condition(self, test: cst.BaseExpression) -> bool:
        if isinstance(test, cst.BooleanOperation):
            return self._is_tensor_condition(test.left) or self._is_tensor_condition(test.right)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self._is_tensor_condition(test.expression)
        return self.is_tensor(test)

    def visit_If(self, node: cst.If) -> None:
        self._check(node.test)

    def visit_While(self, node: cst.While) -> None:
        self._check(node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._check(node.test)

    def visit_Assert(self, node: cst.Assert) -> None:
        self._check(node.test)


# ======================================================================================
# Step barriers and the data path
# ======================================================================================


@register
class MissingStepBarrier(StepContextRule):
    code = "XLA406"
    title = "Training loop without a step barrier: the lazy graph grows across iterations"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "A loop that runs `loss.backward()` and `optimizer.step()` but never `torch_xla.sync()`, "
        "`xm.mark_step()`, `xm.optimizer_step(...)` or `with torch_xla.step():`, and does not iterate an "
        "`MpDeviceLoader` (which syncs after each batch). The fix inserts `torch_xla.sync()` after `optimizer.step()`."
    )
    why = (
        "Without a barrier nothing tells XLA where a step ends: the traced graph keeps growing with every "
        "iteration until something reads a value, compile time grows super-linearly and host memory grows. "
        "Nothing fails; the run gets slower and slower."
    )
    before = (
        "import torch\n\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n"
        "    optimizer.zero_grad()\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    after = (
        "import torch\n"
        "import torch_xla\n\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n"
        "    optimizer.zero_grad()\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    torch_xla.sync()\n"
    )
    message = "no step barrier in this loop: the XLA graph grows every iteration; call `torch_xla.sync()` after `optimizer.step()`"
    symptoms = ("pt-xla-profiler: CompileTime too frequent", "step time grows with every iteration")
    references = ("pytorch/xla xla-advanced.md: Barriers", "pytorch/xla#8824", "pytorch/xla#1155")
    valid = (
        "import torch_xla\n"
        "for x, y in loader:\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    torch_xla.sync()\n",
        "import torch_xla.core.xla_model as xm\n"
        "for x, y in loader:\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    xm.optimizer_step(optimizer, barrier=True)\n",
        "import torch_xla.distributed.parallel_loader as pl\n"
        "device_loader = pl.MpDeviceLoader(loader, device)\n"
        "for x, y in device_loader:\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        "import torch_xla\n"
        "for x, y in loader:\n"
        "    with torch_xla.step():\n"
        "        loss = model(x)\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        "for epoch in range(3):\n    scheduler.step()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_optimizer_step(node):
            return
        loop = self._innermost_loop(node)
        if loop is None or not self.contains_backward(loop.body) or self.contains_sync(loop.body):
            return
        for anc in [loop, *self.ancestors(loop)]:
            if isinstance(anc, cst.For) and self.iterates_device_loader(anc):
                return
        if isinstance(loop, cst.For) and self.plain_dataloader_name(loop) is not None:
            self.report(
                node,
                "no step barrier in this loop: the XLA graph grows every iteration; wrapping the DataLoader in "
                "`pl.MpDeviceLoader` (XLA408) syncs after each batch, or call `torch_xla.sync()` after `optimizer.step()`",
            )
            return
        line = self.parent(self.parent(node))
        if isinstance(self.parent(node), cst.Expr) and isinstance(line, cst.SimpleStatementLine):
            sync = cst.SimpleStatementLine(body=[cst.Expr(expr("torch_xla.sync()"))])
            self.report(line, replacement=cst.FlattenSentinel([line, sync]), imports=(IMPORT_TORCH_XLA,))
        else:
            self.report(node)

    def _innermost_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(anc, (cst.For, cst.While)) and child is anc.body:
                return anc
            child = anc
        return None


@register
class MultiProcessOptimizerStep(StepContextRule):
    code = "XLA407"
    title = "`optimizer.step()` in multi-process training skips the gradient all-reduce"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "`optimizer.step()` in the training loop of a script that runs several processes (`torch_xla.launch`, "
        "`xmp.spawn`, `mp.spawn`, `init_process_group`, `DistributedSampler`) but neither wraps the model in "
        "DDP/FSDP nor uses SPMD, accelerate or its own gradient all-reduce."
    )
    why = (
        "On XLA, data parallelism without DDP relies on `xm.optimizer_step(optimizer)`, which all-reduces the "
        "gradients before stepping. A plain `optimizer.step()` updates each replica with its own gradients: the "
        "replicas silently diverge. (With DDP keep `optimizer.step()`, or gradients are reduced twice.)"
    )
    before = (
        "import torch_xla\n"
        "import torch_xla.runtime as xr\n"
        "from torch.utils.data.distributed import DistributedSampler\n\n"
        "def train(index):\n"
        "    sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal())\n"
        "    for x, y in loader:\n"
        "        loss = model(x, y)\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        torch_xla.sync()\n\n"
        "torch_xla.launch(train)\n"
    )
    after = (
        "import torch_xla\n"
        "import torch_xla.runtime as xr\n"
        "from torch.utils.data.distributed import DistributedSampler\n"
        "import torch_xla.core.xla_model as xm\n\n"
        "def train(index):\n"
        "    sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal())\n"
        "    for x, y in loader:\n"
        "        loss = model(x, y)\n"
        "        loss.backward()\n"
        "        xm.optimizer_step(optimizer)\n"
        "        torch_xla.sync()\n\n"
        "torch_xla.launch(train)\n"
    )
    message = (
        "multi-process training without DDP: `optimizer.step()` does not all-reduce gradients, replicas diverge; "
        "use `xm.optimizer_step(optimizer)`"
    )
    symptoms = ("replicas diverge", "loss differs between ranks")
    references = ("torch_xla/core/xla_model.py: optimizer_step", "pytorch/xla test/test_train_mp_mnist.py")
    valid = (
        "import torch_xla\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "def train(index):\n"
        "    ddp = DDP(model, gradient_as_bucket_view=True)\n"
        "    for x in loader:\n"
        "        loss = ddp(x)\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "torch_xla.launch(train)\n",
        "for x in loader:\n    loss = model(x)\n    loss.backward()\n    optimizer.step()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_optimizer_step(node) or node.args:
            return
        loop = self.step_loop(node)
        if loop is None or not self.contains_backward(loop.body):
            return
        facts = self.facts()
        if not facts.uses(*MULTIPROCESS_SIGNALS) or facts.uses(*GRADIENT_REDUCERS):
            return
        replacement = cst.Call(func=expr("xm.optimizer_step"), args=[cst.Arg(node.func.value)])
        self.report(node, replacement=replacement, imports=(IMPORT_XM,))


@register
class PlainDataLoaderInStepLoop(StepContextRule):
    code = "XLA408"
    title = "Training loop iterates a plain DataLoader instead of `pl.MpDeviceLoader`"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "`for batch in loader:` (also through `enumerate`/`tqdm`) in a training-step loop, where `loader` is "
        "a local `torch.utils.data.DataLoader`. The fix iterates `pl.MpDeviceLoader(loader, torch_xla.device())`."
    )
    why = (
        "A plain DataLoader yields CPU batches: each step waits for the host-to-device copy, and there is no "
        "barrier between steps. `MpDeviceLoader` prefetches batches onto the device in the background and runs "
        "`torch_xla.sync()` after each batch. Existing `.to(device)` calls on the batches become no-ops."
    )
    before = (
        "from torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(ds, batch_size=32, shuffle=True, drop_last=True)\n"
        "for x, y in loader:\n"
        "    loss = model(x, y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    after = (
        "from torch.utils.data import DataLoader\n"
        "import torch_xla\n"
        "import torch_xla.distributed.parallel_loader as pl\n\n"
        "loader = DataLoader(ds, batch_size=32, shuffle=True, drop_last=True)\n"
        "for x, y in pl.MpDeviceLoader(loader, torch_xla.device()):\n"
        "    loss = model(x, y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    message = "iterate `pl.MpDeviceLoader(loader, torch_xla.device())`: device prefetch and a step barrier per batch"
    symptoms = ("TransferToDeviceTime", "input pipeline bound", "graph grows across iterations")
    references = ("torch_xla/distributed/parallel_loader.py: MpDeviceLoader", "pytorch/xla test/test_train_mp_mnist.py")
    valid = (
        "import torch_xla.distributed.parallel_loader as pl\n"
        "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(ds)\n"
        "for x, y in pl.MpDeviceLoader(loader, device):\n"
        "    loss = model(x)\n"
        "    loss.backward()\n",
        "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(ds)\n"
        "for x, y in loader:\n"
        "    preds.append(model(x))\n",
        "def train(loader):\n    for x in loader:\n        loss = model(x)\n        loss.backward()\n",
    )

    def visit_For(self, node: cst.For) -> None:
        if not self.runs_step(node) or self.iterates_device_loader(node):
            return
        name = self.plain_dataloader_name(node)
        if name is None:
            return
        wrapped = cst.Call(
            func=expr("pl.MpDeviceLoader"),
            args=[
                cst.Arg(name, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(expr("torch_xla.device()")),
            ],
        )
        self.report(name, replacement=wrapped, imports=(IMPORT_TORCH_XLA, IMPORT_PL))


# ======================================================================================
# Dynamic shapes: masks, data-dependent ops, padding, partial batches, generation
# ======================================================================================


class _MaskRule(StepContextRule):
    def is_mask(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """A boolean mask index: `x > 0`, `mask`, `~mask`, `a & b`, `m.bool()`, `torch.isnan(x)`,
        or a name assigned from one (`keep = labels != -100`)."""
        if depth > 4:
            return False
        if isinstance(node, cst.Comparison):
            return all(isinstance(c.operator, ORDER_OPS) for c in node.comparisons)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            return self.is_mask(node.expression, depth + 1)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
            return self.is_mask(node.left, depth + 1) or self.is_mask(node.right, depth + 1)
        if isinstance(node, (cst.Name, cst.Attribute)) and (identifier(node) or "").lower().endswith("mask"):
            return True
        if isinstance(node, cst.Name):
            return any(self.is_mask(v, depth + 1) for v in self.assigned_values(node))
        if isinstance(node, cst.Call):
            if method_name(node) == "bool":
                return True
            return self.is_call_to(
                node, "torch.isnan", "torch.isinf", "torch.isfinite", "torch.logical_and", "torch.logical_or",
                "torch.logical_not",
            )
        return False

    def mask_index(self, node: cst.Subscript) -> cst.BaseExpression | None:
        if not self.facts().uses("torch"):
            return None
        if self.is_host_value(node.value) or not self.in_device_context(node):
            return None
        for element in node.slice:
            if isinstance(element.slice, cst.Index) and self.is_mask(element.slice.value):
                return element.slice.value
        return None

    def is_store(self, node: cst.Subscript) -> bool:
        parent = self.parent(node)
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or isinstance(parent, cst.Del)


MASK_ALTERNATIVES = (
    "keep shapes static: `torch.where(mask, x, 0)`, `x * mask`, `x.masked_fill(~mask, v)`, "
    "masked sums `(x * mask).sum() / mask.sum()`"
)


@register
class BooleanMaskIndexing(_MaskRule):
    code = "XLA409"
    title = "Boolean-mask indexing `x[mask]` has a data-dependent shape"
    category = "C4"
    fix = "manual"
    detects = (
        "Reads like `x[mask]`, `x[x > 0]`, `logits[labels != -100]`, `x[:, ~pad_mask]` in the training loop or "
        "model code (not in Dataset / collate code, which runs on the CPU)."
    )
    why = (
        "The result's size depends on the mask's values. XLA needs static shapes: it computes the mask on the "
        "host (`aten::nonzero` CPU fallback, a device-to-host sync) and compiles a new graph for every distinct "
        "count of True values."
    )
    before = (
        "import torch\n\n"
        "class Head(torch.nn.Module):\n"
        "    def forward(self, logits, labels):\n"
        "        return logits[labels != -100].mean()\n"
    )
    message = f"`x[mask]` has a data-dependent shape (`aten::nonzero` fallback + recompiles); {MASK_ALTERNATIVES}"
    symptoms = (
        "aten::nonzero",
        "pt-xla-profiler: Op(s) not lowered: aten::nonzero",
        "pt-xla-profiler: CompileTime too frequent",
    )
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats 1", "pytorch/xla#4248")
    valid = (
        "import numpy as np\narr = np.arange(5)\npos = arr[arr > 2]\n",
        "import torch\nclass DS(torch.utils.data.Dataset):\n    def __getitem__(self, i):\n"
        "        t = self.items[i]\n        return t[t > 0]\n",
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x, idx):\n        return x[idx]\n",
    )

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if not self.is_store(node) and self.mask_index(node) is not None:
            self.report(node)


@register
class BooleanMaskAssignment(_MaskRule):
    code = "XLA410"
    title = "Boolean-mask assignment `x[mask] = v` runs a dynamic `index_put`"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "Assignments through a boolean mask (`x[mask] = v`, `x[x < 0] = 0`, `labels[pad_mask] = -100`) in device "
        "code. `x[x <cmp> ...] = <number>` is rewritten to `x.masked_fill_(x <cmp> ..., <number>)`; other masks or "
        "values are reported for a manual rewrite."
    )
    why = (
        "Masked assignment lowers to `index_put` with the mask's nonzero indices: XLA evaluates the mask early "
        "(`aten::nonzero`, a host sync) and the graph depends on how many elements are True, so it recompiles. "
        "`masked_fill_` / `torch.where(mask, v, x)` keep the shape static."
    )
    before = (
        "import torch\n\n"
        "class Relu(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        x = x.clone()\n"
        "        x[x < 0] = 0.0\n"
        "        return x\n"
    )
    after = (
        "import torch\n\n"
        "class Relu(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        x = x.clone()\n"
        "        x.masked_fill_(x < 0, 0.0)\n"
        "        return x\n"
    )
    message = (
        "`x[mask] = v` is a dynamic index_put (`aten::nonzero`); use `x.masked_fill_(mask, v)` when mask has x's "
        "shape, or `x = torch.where(mask, v, x)`"
    )
    symptoms = ("aten::nonzero", "pt-xla-profiler: Op(s) not lowered: aten::nonzero")
    references = ("pytorch/xla#4248",)
    valid = (
        "import torch\ndef f(x):\n    x.masked_fill_(x < 0, 0.0)\n    return x\n",
        "import torch\ndef f(x, i):\n    x[i] = 0\n    return x\n",
    )

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Subscript):
            return
        target = node.targets[0].target
        mask = self.mask_index(target)
        if mask is None:
            return
        stmt = self.parent(node)
        if self._same_shape_mask(target, mask) and _is_number(node.value) and isinstance(stmt, cst.SimpleStatementLine):
            call = cst.Call(
                func=cst.Attribute(value=target.value, attr=cst.Name("masked_fill_")),
                args=[
                    cst.Arg(mask, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(node.value),
                ],
            )
            self.report(node, replacement=cst.Expr(call))
        else:
            self.report(node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Subscript) and self.mask_index(node.target) is not None:
            self.report(node)

    def _same_shape_mask(self, target: cst.Subscript, mask: cst.BaseExpression) -> bool:
        """`x[x < 0]`: a comparison on the indexed tensor itself has exactly its shape."""
        return (
            len(target.slice) == 1
            and isinstance(mask, cst.Comparison)
            and target.value.deep_equals(mask.left)
            and isinstance(target.value, (cst.Name, cst.Attribute))
        )


def _is_number(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float))


DYNAMIC_SHAPE_FUNCTIONS = {
    "torch.nonzero": "aten::nonzero",
    "torch.argwhere": "aten::nonzero",
    "torch.masked_select": "aten::masked_select",
    "torch.unique": "aten::_unique2",
    "torch.unique_consecutive": "aten::unique_consecutive",
}
DYNAMIC_SHAPE_METHODS = {
    "nonzero": "aten::nonzero",
    "argwhere": "aten::nonzero",
    "masked_select": "aten::masked_select",
    "unique": "aten::_unique2",
    "unique_consecutive": "aten::unique_consecutive",
}


@register
class DataDependentShapeOp(StepContextRule):
    code = "XLA411"
    title = "`nonzero` / `masked_select` / `unique` / one-argument `torch.where` have data-dependent shapes"
    category = "C4"
    fix = "manual"
    detects = (
        "`torch.nonzero`, `torch.argwhere`, `torch.where(cond)` with one argument, `torch.masked_select`, "
        "`torch.unique`, `torch.unique_consecutive` and their method forms, in device code."
    )
    why = (
        "Their output size depends on the data. In torch_xla 2.9 they run on the CPU (`aten::nonzero`, "
        "`aten::masked_select`, `aten::_unique2`, `aten::unique_consecutive` counters), which syncs the device, "
        "and each new result size compiles a new graph."
    )
    before = (
        "import torch\n\n"
        "class Pool(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        idx = torch.nonzero(x > 0)\n"
        "        return x[idx[:, 0]]\n"
    )
    message = (
        "data-dependent output shape (CPU fallback + a new graph per size); use fixed-size forms: "
        "`torch.where(cond, a, b)`, `masked_fill`, multiply by the mask, `topk` with a fixed k"
    )
    symptoms = (
        "aten::nonzero",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_consecutive",
        "pt-xla-profiler: Op(s) not lowered: aten::nonzero",
    )
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats 1", "pytorch/xla#4248")
    valid = (
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, c, a, b):\n        return torch.where(c, a, b)\n",
        "import numpy as np\nidx = np.arange(3).nonzero()\n",
        "import torch\ndef collate(batch):\n    return torch.unique(torch.tensor(batch))\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        op = next((DYNAMIC_SHAPE_FUNCTIONS[n] for n in names if n in DYNAMIC_SHAPE_FUNCTIONS), None)
        if op is None and "torch.where" in names and len(node.args) == 1 and node.args[0].keyword is None:
            op = "aten::nonzero"
        if op is None and method_name(node) in DYNAMIC_SHAPE_METHODS and not self._is_torch_function(node.func):
            if not self.is_host_value(node.func.value):
                op = DYNAMIC_SHAPE_METHODS[method_name(node)]
        if op is not None and self.in_device_context(node):
            self.report(node, f"{self.message} [{op}]")


COLLATORS = frozenset(
    {
        "DataCollatorWithPadding",
        "DataCollatorForSeq2Seq",
        "DataCollatorForTokenClassification",
        "DataCollatorForLanguageModeling",
        "DataCollatorForWholeWordMask",
    }
)


def _is_collator(names: set[str]) -> bool:
    return any(n.startswith("transformers.") and n.rsplit(".", 1)[-1] in COLLATORS for n in names)


@register
class PadToLongest(StepContextRule):
    code = "XLA412"
    title = "Tokenizer pads to the longest sequence: a new input shape per batch"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "Tokenizer calls (`tokenizer(...)`, `tokenizer.pad(...)`, `batch_encode_plus`) with `padding=True` or "
        "`padding=\"longest\"`. When `max_length` is given, the fix pads to it: `padding=\"max_length\"`."
    )
    why = (
        "Each batch gets the length of its longest sequence, so XLA sees a new shape and compiles a new graph "
        "almost every step (`UncachedCompile` grows, `pt-xla-profiler: CompileTime too frequent`). Fixed lengths "
        "(or a few buckets) compile once. Padding more changes the compute per step, and losses that do not "
        "mask pads change: review the fix."
    )
    before = "enc = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors=\"pt\")\n"
    after = "enc = tokenizer(texts, padding=\"max_length\", truncation=True, max_length=128, return_tensors=\"pt\")\n"
    message = (
        "padding to the longest sequence gives XLA a new shape (a new compile) per batch; pad to a fixed "
        "`max_length` (`padding=\"max_length\"`) or to a few bucket sizes"
    )
    symptoms = ("pt-xla-profiler: CompileTime too frequent", "UncachedCompile", "CompileTime")
    references = ("huggingface/accelerate examples/nlp_example.py", "huggingface/trl#2001", "pytorch/xla#1509")
    valid = (
        "enc = tokenizer(texts, padding=\"max_length\", max_length=128)\n",
        "import torch\nconv = torch.nn.Conv2d(3, 8, 3, padding=1)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        padding = keyword_arg(node, "padding")
        if padding is None or not _pads_to_longest(padding.value):
            return
        names = self.qualified_names(node.func)
        if _is_collator(names) or any(n.startswith("torch") for n in names):
            return  # collators: XLA413
        if keyword_arg(node, "max_length") is not None:
            new_value = cst.SimpleString('"max_length"')
            self.report(padding.value, replacement=new_value)
        else:
            self.report(node)


def _pads_to_longest(value: cst.CSTNode) -> bool:
    return (isinstance(value, cst.Name) and value.value == "True") or string_value(value) == "longest"


@register
class CollatorPadsToLongest(StepContextRule):
    code = "XLA413"
    title = "Collator pads each batch to its longest sequence"
    category = "C4"
    fix = "manual"
    detects = (
        "HF `DataCollatorWithPadding` / `DataCollatorForSeq2Seq` / `DataCollatorForTokenClassification` / "
        "`DataCollatorForLanguageModeling` without `pad_to_multiple_of` or `padding=\"max_length\"`, and "
        "`torch.nn.utils.rnn.pad_sequence` (always pads to the longest)."
    )
    why = (
        "Dynamic padding makes the batch length vary from step to step; on XLA every new length is a new "
        "graph to compile (`CompileTime too frequent`). Reported ORPO training went from ~10 min to ~2 s per step "
        "after padding to a fixed length."
    )
    before = "from transformers import DataCollatorWithPadding\n\ncollator = DataCollatorWithPadding(tokenizer)\n"
    message = (
        "the collator pads to the longest sequence of each batch (a new XLA compile per length); pass "
        "`padding=\"max_length\", max_length=N` or `pad_to_multiple_of=64`/`128` to bound the shapes"
    )
    symptoms = ("pt-xla-profiler: CompileTime too frequent", "UncachedCompile")
    references = ("huggingface/trl#2001", "pytorch/xla#1509", "pytorch/xla#3356")
    valid = (
        "from transformers import DataCollatorWithPadding\n"
        "collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=128)\n",
        "from transformers import DataCollatorWithPadding\n"
        "collator = DataCollatorWithPadding(tokenizer, padding='max_length', max_length=256)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.nn.utils.rnn.pad_sequence"):
            self.report(
                node,
                "`pad_sequence` pads to the longest sequence of the batch (a new XLA compile per length); pad to a "
                "fixed length (`F.pad` to N) or a few bucket sizes",
            )
            return
        if not _is_collator(self.qualified_names(node.func)):
            return
        if keyword_arg(node, "pad_to_multiple_of") is not None:
            return
        padding = keyword_arg(node, "padding")
        if padding is not None and string_value(padding.value) in ("max_length", "do_not_pad"):
            return
        self.report(node)


@register
class DataLoaderWithoutDropLast(StepContextRule):
    code = "XLA414"
    title = "Training DataLoader without `drop_last=True`: the last partial batch compiles a new graph"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "`DataLoader(...)` used for training (`shuffle=True`, or iterated by the training-step loop) without a "
        "`drop_last` argument. The fix adds `drop_last=True`."
    )
    why = (
        "When the dataset size is not a multiple of the batch size, the last batch of every epoch has another "
        "shape: one more compile (minutes on large models), and in multi-replica runs uneven batch counts can "
        "hang collectives. `drop_last=True` drops at most `batch_size - 1` samples per epoch."
    )
    before = "from torch.utils.data import DataLoader\n\nloader = DataLoader(train_ds, batch_size=64, shuffle=True)\n"
    after = (
        "from torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(train_ds, batch_size=64, shuffle=True, drop_last=True)\n"
    )
    message = "the last partial batch has a new shape (one more XLA compile per epoch); pass `drop_last=True`"
    symptoms = ("UncachedCompile", "CompileTime", "hang at the end of an epoch (multi-replica)")
    references = ("pytorch/xla#2749", "pytorch/xla troubleshoot.md: static shapes")
    valid = (
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=64, shuffle=True, drop_last=False)\n",
        "from torch.utils.data import DataLoader\nval_loader = DataLoader(val_ds, batch_size=64)\n",
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_sampler=sampler, shuffle=True)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *DATALOADERS):
            return
        if keyword_arg(node, "drop_last") is not None or keyword_arg(node, "batch_sampler") is not None:
            return
        batch_size = keyword_arg(node, "batch_size")
        if batch_size is not None and isinstance(batch_size.value, cst.Name) and batch_size.value.value == "None":
            return
        shuffle = keyword_arg(node, "shuffle")
        shuffled = shuffle is not None and isinstance(shuffle.value, cst.Name) and shuffle.value.value == "True"
        if shuffled or self._iterated_by_step_loop(node):
            self.report(node, replacement=add_kwarg(node, "drop_last", cst.Name("True")))

    def _iterated_by_step_loop(self, call: cst.Call) -> bool:
        assign = self.parent(call)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
            return False
        target = assign.targets[0].target
        if not isinstance(target, cst.Name):
            return False
        scope_node = self.scope_node(call)
        for loop in self.module_nodes().fors:
            if self.scope_node(loop) is not scope_node:
                continue
            name = self.iterated_name(loop)
            if name is not None and name.value == target.value and self.runs_step(loop):
                return True
        return False


GENERATE_KWARGS = frozenset(
    {"max_new_tokens", "max_length", "do_sample", "num_beams", "input_ids", "attention_mask", "temperature", "top_k", "top_p"}
)


@register
class GenerateWithDynamicCache(StepContextRule):
    code = "XLA415"
    title = "HF `generate()` with the default dynamic KV cache recompiles every token"
    category = "C4"
    fix = "manual"
    detects = (
        "`model.generate(...)` in a module that uses transformers/peft/trl, without `cache_implementation=` "
        "(or a `generation_config` / `past_key_values` that could set it)."
    )
    why = (
        "The default DynamicCache grows by one position per generated token, so every decoding step has new "
        "shapes and XLA compiles a new graph per token: generation is extremely slow but correct. A static cache "
        "(`cache_implementation=\"static\"`, updated in place with `index_copy_`) keeps the shapes fixed."
    )
    before = (
        "from transformers import AutoModelForCausalLM\n\n"
        "model = AutoModelForCausalLM.from_pretrained(path)\n"
        "out = model.generate(**inputs, max_new_tokens=32)\n"
    )
    message = (
        "the dynamic KV cache changes shape every token (one XLA compile per token); pass "
        "`cache_implementation=\"static\"` (and pad prompts to a fixed length)"
    )
    symptoms = ("pt-xla-profiler: CompileTime too frequent", "generation recompiles every token")
    references = ("huggingface/transformers#31126", "huggingface/transformers PR #31129")
    valid = (
        "from transformers import AutoModelForCausalLM\n"
        "out = model.generate(**inputs, max_new_tokens=32, cache_implementation='static')\n",
        "out = sampler.generate(prompt, max_new_tokens=3)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) != "generate":
            return
        facts = self.facts()
        if not facts.uses("transformers", "peft", "trl") or facts.sets_static_cache:
            return
        keywords = {a.keyword.value for a in node.args if a.keyword is not None}
        if keywords & {"cache_implementation", "generation_config", "past_key_values"}:
            return
        if keywords & GENERATE_KWARGS or any(a.star == "**" for a in node.args):
            self.report(node)


TIME_CALLS = frozenset(
    {"time.time", "time.perf_counter", "time.monotonic", "time.time_ns", "time.perf_counter_ns", "timeit.default_timer"}
)
WAIT_CALLS = frozenset({"torch_xla.core.xla_model.wait_device_ops", "torch.cuda.synchronize"})


@register
class UnsyncedTiming(StepContextRule):
    code = "XLA416"
    title = "Timing training steps without waiting for the device measures tracing, not execution"
    category = "C4"
    fix = "manual"
    detects = (
        "`time.time()` / `time.perf_counter()` read after training-step code (backward, optimizer step, a step "
        "loop) with no `xm.wait_device_ops()` / `torch_xla.sync(wait=True)` / value read in between."
    )
    why = (
        "XLA is lazy and asynchronous: after the Python code of a step returns, the device may not have run it "
        "yet (and the first steps include compilation). The clock then measures graph tracing; throughput "
        "numbers are wrong with no error."
    )
    before = (
        "import time\n\n"
        "start = time.time()\n"
        "for x, y in loader:\n"
        "    loss = model(x, y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "elapsed = time.time() - start\n"
    )
    message = (
        "the clock is read before the device finished; call `torch_xla.sync()` and `xm.wait_device_ops()` "
        "before reading it, and leave the first (compiling) steps out of the measurement"
    )
    symptoms = ("implausibly fast step times", "step time jumps when logging is added")
    references = ("pytorch/xla#8824",)
    valid = (
        "import time\nimport torch_xla.core.xla_model as xm\n"
        "start = time.time()\n"
        "for x in loader:\n    loss = model(x)\n    loss.backward()\n    optimizer.step()\n"
        "xm.wait_device_ops()\n"
        "elapsed = time.time() - start\n",
        "import time\nstart = time.time()\nload()\nelapsed = time.time() - start\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *TIME_CALLS):
            return
        stmt = self.statement_of(node)
        block = self.parent(stmt) if stmt is not None else None
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return
        body = list(block.body)
        index = next(i for i, s in enumerate(body) if s is stmt)
        stepped = False
        for previous in reversed(body[:index]):
            found = self.nodes_in(previous, enter_functions=False)
            if isinstance(previous, cst.SimpleStatementLine) and any(
                self.qualified_names(c.func) & TIME_CALLS for c in found.calls
            ):
                break  # the start of this measurement
            if any(self._waits(c) for c in found.calls):
                return
            if any(self._is_step(c) for c in found.calls):
                stepped = True
        if stepped:
            self.report(node)

    def _waits(self, call: cst.Call) -> bool:
        if self.qualified_names(call.func) & WAIT_CALLS or method_name(call) in ("item", "cpu", "tolist"):
            return True
        name = (identifier(call.func) or "").lower()
        if "wait" in name or "synchronize" in name:  # the project's own helper, e.g. `_wait(device)`
            return True
        if self.is_call_to(call, "torch_xla.sync", "torch_xla.torch_xla.sync"):
            wait = keyword_arg(call, "wait")
            return wait is not None and isinstance(wait.value, cst.Name) and wait.value.value == "True"
        return False

    def _is_step(self, call: cst.Call) -> bool:
        return method_name(call) in ("backward",) or self.is_optimizer_step(call) or self.is_call_to(
            call, "torch_xla.core.xla_model.optimizer_step"
        )
