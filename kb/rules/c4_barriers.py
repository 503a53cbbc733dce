"""C4 — step barriers: a loop without one grows one huge graph; timing without one measures tracing, not running."""

from __future__ import annotations

import libcst as cst

from ..analysis import steps
from ..analysis.devices import imports_torch_xla
from ..cst_helpers import code_of, expr, identifier, keyword_arg, method_name
from ..rule import IMPORT_PL, IMPORT_TORCH_XLA, IMPORT_XM
from ..step_rule import StepContextRule

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


class MissingStepBarrier(StepContextRule):
    """Where the barrier goes. The innermost loop that runs the update gets one `torch_xla.sync()` per iteration:
    after the update (after `scaler.update()` when that follows) or after the call of the helper that runs it; two
    updates in one iteration (a GAN) get one barrier, after the last; when the last is under a condition the others
    are not under (`if enc_opt is not None: enc_opt.step()`, a scaled step in `if`, a plain one in `else`), after
    that whole `if`, so that it runs whenever any update ran.

    In a tree migration the update may be in another module: a function, a method of an object the loop's class
    builds (`self.trainer.optimize(opt)`) or a callable object (a loss scaler whose `__call__` steps, passed in by
    every caller); the barrier goes in the loop that iterates the batches, never also in the helper. A call that
    hands the optimizer to code the analysis cannot see (a parameter, an object of unknown class) is reported for a
    manual barrier. `MpDeviceLoader` and accelerate-prepared loaders sync after each batch: their loops need none.
    """

    code = "XLA406"
    title = "Training loop without a step barrier: the lazy graph grows across iterations"
    category = "C4"
    fix = "safe"
    autofix = True
    detects = (
        "A training loop that runs an optimizer update (`optimizer.step()`, `scaler.step(optimizer)`, "
        "`xm.optimizer_step(optimizer)` without `barrier=True`), in its body or in a helper it calls, "
        "with no step barrier (`torch_xla.sync()`, `xm.mark_step()`, `with torch_xla.step():`) and no "
        "`MpDeviceLoader`. The fix adds one `torch_xla.sync()` per iteration, after the update."
    )
    why = (
        "Without a barrier nothing tells XLA where a step ends: the traced graph keeps growing with every "
        "iteration until something reads a value, compile time grows super-linearly and host memory grows. "
        "Nothing fails; the run gets slower and slower (nanoGPT through `scaler.step`: 3.1 s -> 16.3 s a step "
        "over 7 steps; with the barrier 15-24 ms). Safe: a barrier only says where a step ends; every tensor "
        "keeps its value, so the program computes the same numbers."
    )
    before = (
        "import torch\n\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n"
        "    x, y = x.to(device), y.to(device)\n"
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
        "    x, y = x.to(device), y.to(device)\n"
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

    def visit_Module(self, node: cst.Module) -> None:
        if steps.trains_on_cpu(self):  # a script that names no device trains on the CPU: no lazy graph
            return
        for site in steps.barrier_sites(self):
            message = self.message
            if site.helper:
                message = (
                    f"no step barrier in this loop: `{site.helper}` runs the optimizer step, once per iteration; "
                    "the XLA graph grows every iteration; call `torch_xla.sync()` after it"
                )
            sync = cst.SimpleStatementLine(body=[cst.Expr(expr("torch_xla.sync()"))])
            replacement = cst.FlattenSentinel([site.after, sync])
            self.report(site.call, message, replacement, imports=(IMPORT_TORCH_XLA,), target=site.after)
        for call in steps.uncertain_steps(self):
            name = code_of(call.func)
            message = (
                f"`{name}` gets the optimizer, but its code is out of sight (a parameter, an object of unknown class): "
                "if it runs the optimizer step, the loop that runs this line has no step barrier and the XLA graph "
                "grows every iteration; then add one `torch_xla.sync()` per iteration of that loop, after the step"
            )
            self.report(call, message, fix="manual")


class MultiProcessOptimizerStep(StepContextRule):
    code = "XLA407"
    needs = ("step",)
    title = "`optimizer.step()` in multi-process training skips the gradient all-reduce"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "`optimizer.step()` in the training loop of torch_xla code that runs several processes (`torch_xla.launch`, "
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
        if not imports_torch_xla(self.analysis.module):
            return  # CUDA data-parallel code reduces its gradients somewhere (a DDP/FSDP wrap, maybe in another file)
        replacement = cst.Call(func=expr("xm.optimizer_step"), args=[cst.Arg(node.func.value)])
        self.report(node, replacement=replacement, imports=(IMPORT_XM,))


class PlainDataLoaderInStepLoop(StepContextRule):
    code = "XLA408"
    needs = ("step", "backward", "sync")
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
        "    loss = model(x.to(device), y.to(device))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    after = (
        "from torch.utils.data import DataLoader\n"
        "import torch_xla\n"
        "import torch_xla.distributed.parallel_loader as pl\n\n"
        "loader = DataLoader(ds, batch_size=32, shuffle=True, drop_last=True)\n"
        "for x, y in pl.MpDeviceLoader(loader, torch_xla.device()):\n"
        "    loss = model(x.to(device), y.to(device))\n"
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
        if not self.runs_step(node) or self.iterates_device_loader(node) or steps.prepared_by_accelerate(self, node):
            return
        if self.facts().cpu_script:  # a script that names no device feeds a CPU model
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


TIME_CALLS = frozenset(
    {"time.time", "time.perf_counter", "time.monotonic", "time.time_ns", "time.perf_counter_ns", "timeit.default_timer"}
)


WAIT_CALLS = frozenset({"torch_xla.core.xla_model.wait_device_ops", "torch.cuda.synchronize"})


class UnsyncedTiming(StepContextRule):
    code = "XLA416"
    needs = ("time",)
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
        return (
            method_name(call) in ("backward",)
            or self.is_optimizer_step(call)
            or self.is_call_to(call, "torch_xla.core.xla_model.optimizer_step")
        )
