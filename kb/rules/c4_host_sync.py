"""C4 — host syncs in the training loop: `.item()`, `float(t)`, logging tensors, host copies, tensor-valued branches.

Each one runs the partial graph and waits for the device, every step.
"""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import TEXT, find_nodes, method_name, positional_args, string_value
from ..step_rule import StepContextRule

HOST_SYNC_FIX = (
    "log every N steps after the step barrier, or hand the tensor to "
    "`xm.add_step_closure(fn, args=(loss,))`; accumulate metrics on the device"
)


class ItemInStepLoop(StepContextRule):
    code = "XLA401"
    needs = ("item",)
    title = "`.item()` inside the training loop syncs with the host every step"
    category = "C4"
    fix = "manual"
    detects = (
        "`t.item()` executed in every iteration of a loop that runs `backward()` / `optimizer.step()`, "
        "including `print(loss.item())` and `tqdm.set_postfix(loss=loss.item())`, and in a function that such a "
        "loop runs every step (a helper it calls, a model's `forward` and the methods `forward` calls, in any file "
        "of the tree). Reads in the body of an every-N-steps branch (`if step % N == 0:`) are not flagged."
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
        "def log(v):\n    print(v.item())\n\n"
        "for step, x in enumerate(loader):\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    if step % 100 == 0:\n"
        "        log(loss)\n",
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
        receiver = node.func.value
        if self.is_host_value(receiver) or self.is_cpu_tensor(receiver):
            return
        if self.per_step_loop(node) is None:
            func = self.per_step_function(node)
            if func is not None:
                self.report(
                    node,
                    f"`.item()` in {runs_every_step(func)} copies the value to the host every step; {HOST_SYNC_FIX}",
                )
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


def runs_every_step(func: cst.FunctionDef) -> str:
    """How a message names a function that the step loop reaches (a helper it calls, a model's `forward`)."""
    return f"`{func.name.value}`, which runs every training step,"


CAST_IN_LOOP = "converting a tensor to a Python number in the step loop syncs with the host every step"


class ScalarCastInStepLoop(StepContextRule):
    code = "XLA402"
    needs = ("step", "backward", "sync", "forward")
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
        "    loss = F.cross_entropy(model(x.to(device)), y.to(device))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    history.append(float(loss))\n"
    )
    message = f"{CAST_IN_LOOP}; {HOST_SYNC_FIX}"
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
        if len(args) != 1:
            return
        if self.per_step_loop(node) is not None:
            if self.is_tensor(args[0].value):
                self.report(node, f"{CAST_IN_LOOP}{self._as_index(node)}; {HOST_SYNC_FIX}")
            return
        func = self.per_step_function(node)
        if func is not None and self.is_tensor(args[0].value):
            message = (
                f"converting a tensor to a Python number in `{func.name.value}`, which runs every training step, "
                f"syncs with the host every step{self._as_index(node)}; keep the value on the device (index with "
                "tensors: `index_copy_`, `torch.roll`, masks) or read it every N steps after the barrier"
            )
            self.report(node, message)

    def _as_index(self, node: cst.Call) -> str:
        """`ptr = int(self.queue_ptr)` then `self.queue[:, ptr:ptr + n] = k`: the number becomes a slice bound,
        a constant of the graph, so every new value compiles a new graph."""
        assign = self.parent(node)
        func = self.enclosing_function(node)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and func is not None):
            return ""
        target = assign.targets[0].target
        if not isinstance(target, cst.Name):
            return ""
        for index in find_nodes(func.body, cst.Slice, cst.Index):
            if any(isinstance(n, cst.Name) and n.value == target.value for n in find_nodes(index, cst.Name)):
                return "; used as an index it is a constant of the graph: each new value compiles a new graph"
        return ""


FORMAT_MESSAGE = f"formatting a tensor as text in the step loop reads it on the host every step; {HOST_SYNC_FIX}"
LOG_METHODS = frozenset({"set_postfix", "set_description", "add_scalar", "add_scalars", "info", "debug", "warning"})


class TensorLoggedInStepLoop(StepContextRule):
    code = "XLA403"
    needs = ("step", "backward", "sync", "forward")
    title = "Printing or logging a tensor in the training loop syncs every step"
    category = "C4"
    fix = "manual"
    detects = (
        "`print(loss)`, f-strings with a tensor, `pbar.set_postfix(loss=loss)`, `writer.add_scalar(tag, loss, "
        'step)`, `logger.info(f"{loss}")` and `wandb.log({...: loss})` inside the training-step loop; and text '
        'formatted from a tensor wherever it goes (`print0(f"norm {norm:.4f}")` through a helper, '
        '`f.write("%f" % loss)`), the gradient norm that `clip_grad_norm_` returns included; the same in a function '
        "that the loop runs every step (a helper, a model's `forward` and the methods it calls)."
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
        '    print(f"loss {loss}")\n'
    )
    message = f"logging a tensor in the step loop reads it on the host every step; {HOST_SYNC_FIX}"
    symptoms = ("aten::_local_scalar_dense", "pt-xla-profiler: TransferFromDeviceTime too frequent")
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats",)
    valid = (
        "for step, x in enumerate(loader):\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        '    print(f"step {step}")\n',
        "import torch_xla.core.xla_model as xm\n"
        "for x in loader:\n"
        "    loss = model(x)\n"
        "    loss.backward()\n"
        "    xm.optimizer_step(optimizer)\n"
        "    xm.add_step_closure(lambda v: print(v), args=(loss,))\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        # where the call runs first (walks up the tree), whether it logs a tensor last (a data-flow question):
        # most logging and formatting runs in no step
        if not self._is_log_call(node):
            return
        loop = self.per_step_loop(node)
        func = self.per_step_function(node) if loop is None else None
        if (loop is None and func is None) or not any(self._logs_tensor(arg.value) for arg in node.args):
            return
        if loop is not None:
            self.report(node)
        else:
            self.report(
                node, f"logging a tensor in {runs_every_step(func)} reads it on the host every step; {HOST_SYNC_FIX}"
            )

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        self._check_text(node)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, cst.Modulo) and isinstance(node.left, TEXT):
            self._check_text(node)

    def _check_text(self, node: cst.BaseExpression) -> None:
        """Text built from a tensor wherever it goes (`print0(f"{norm:.4f}")`, `log.write("%f" % loss)`): the
        formatting itself reads the value. Inside a print or log call the call is reported instead."""
        loop = self.per_step_loop(node)  # first, as in visit_Call
        func = self.per_step_function(node) if loop is None else None
        if loop is None and func is None:
            return
        for anc in self.ancestors(node):
            if isinstance(anc, cst.Call) and self._is_log_call(anc):
                return
            if isinstance(anc, (cst.FormattedString, cst.BinaryOperation)) and self._logs_tensor(anc):
                return  # reported at the outermost text
            if isinstance(anc, cst.BaseStatement):
                break
        if not self._logs_tensor(node):
            return
        if loop is not None:
            self.report(node, FORMAT_MESSAGE)
        else:
            self.report(
                node,
                f"formatting a tensor as text in {runs_every_step(func)} reads it on the host every "
                f"step; {HOST_SYNC_FIX}",
            )

    def _is_log_call(self, node: cst.Call) -> bool:
        is_print = isinstance(node.func, cst.Name) and self.is_builtin(node.func, "print")
        return is_print or method_name(node) in LOG_METHODS or self.is_call_to(node, "wandb.log")

    def _logs_tensor(self, value: cst.CSTNode) -> bool:
        if isinstance(value, cst.FormattedString):
            return any(
                isinstance(part, cst.FormattedStringExpression) and self._logs_tensor(part.expression)
                for part in value.parts
            )
        if isinstance(value, cst.Dict):
            return any(isinstance(e, cst.DictElement) and self._logs_tensor(e.value) for e in value.elements)
        if (
            isinstance(value, cst.BinaryOperation)
            and isinstance(value.operator, cst.Modulo)
            and isinstance(value.left, TEXT)
        ):
            right = value.right
            items = [e.value for e in right.elements] if isinstance(right, cst.Tuple) else [right]
            return any(self._logs_tensor(i) for i in items)
        if isinstance(value, cst.Call) and self.is_builtin(value.func, "str", "repr", "format"):
            return any(self._logs_tensor(a.value) for a in value.args)
        if isinstance(value, cst.Name) and any(self._to_number(v) for v in self.assigned_values(value)):
            return False  # `lossf = lossf.item()`: the code reads it as a number (the conversion is XLA401's)
        return self.is_tensor(value)

    def _to_number(self, value: cst.CSTNode) -> bool:
        if not isinstance(value, cst.Call):
            return False
        return method_name(value) in ("item", "tolist") or self.is_builtin(value.func, "float", "int")


HOST_COPY_METHODS = frozenset({"cpu", "tolist", "numpy"})


class HostCopyInStepLoop(StepContextRule):
    code = "XLA404"
    needs = ("step", "backward", "sync", "forward")
    title = "`.cpu()` / `.tolist()` / `.numpy()` in the training loop copies to the host every step"
    category = "C4"
    fix = "manual"
    detects = (
        '`.cpu()`, `.tolist()`, `.numpy()` and `.to("cpu")` executed in every iteration of the step loop, or in a '
        "function that the loop runs every step (a helper, a model's `forward` and the methods it calls)."
    )
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
        if self.is_host_value(node.func.value) or self.is_cpu_tensor(node.func.value):
            return
        if self.per_step_loop(node) is not None:
            self.report(node)
        elif (func := self.per_step_function(node)) is not None:
            self.report(
                node,
                f"copying to the host in {runs_every_step(func)} waits for the device every step; "
                "keep results on the device or copy them in `xm.add_step_closure(fn, args=(t,))`",
            )


CONTAINERS = (cst.List, cst.Tuple, cst.Dict, cst.ListComp, cst.DictComp)


class TensorControlFlow(StepContextRule):
    code = "XLA405"
    needs = ("step", "backward", "sync", "forward")
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
        # where the test runs first (a walk up the tree), whether it tests a tensor last (a data-flow question):
        # most tests run in no step
        func = self.enclosing_function(test)
        in_step_loop = self.step_loop(test) is not None
        if in_step_loop or (func is not None and func.name.value == "forward"):
            if self._is_tensor_condition(test):
                self.report(test)
            return
        func = self.per_step_function(test)
        if func is not None and self._is_tensor_condition(test):
            self.report(test, f"`{func.name.value}` runs every training step: {self.message}")

    def _is_tensor_condition(self, test: cst.BaseExpression) -> bool:
        if isinstance(test, cst.BooleanOperation):
            return self._is_tensor_condition(test.left) or self._is_tensor_condition(test.right)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self._is_tensor_condition(test.expression)
        if isinstance(test, cst.Name) and any(isinstance(v, CONTAINERS) for v in self.assigned_values(test)):
            return False  # `masks = []` ... `masks = torch.stack(masks)`: `if masks:` may test the list
        return self.is_tensor(test) and not self.is_cpu_tensor(test)

    def visit_If(self, node: cst.If) -> None:
        self._check(node.test)

    def visit_While(self, node: cst.While) -> None:
        self._check(node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._check(node.test)

    def visit_Assert(self, node: cst.Assert) -> None:
        self._check(node.test)
