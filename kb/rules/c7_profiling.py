"""C7 — profiling and monitoring: NVTX ranges, the CUDA profiler, GPU identity queries."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import add_kwarg, dotted, expr, is_cuda_string, keyword_arg
from ..rule import Rule

IMPORT_XP = ("torch_xla.debug.profiler", None, "xp")
NVTX = "torch.cuda.nvtx."
NVTX_STATEMENTS = {NVTX + n for n in ("range_push", "range_pop", "mark", "range_start", "range_end")}


class NvtxRanges(Rule):
    code = "XLA704"
    severity = "note"  # annotates nothing, harmless
    needs = ("nvtx",)
    title = "NVTX ranges annotate nothing on TPU"
    category = "C7"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.cuda.nvtx.range_push/range_pop/mark/range_start/range_end(...)` statements (removed) and "
        "`with torch.cuda.nvtx.range(name):` (becomes `with xp.Trace(name):`)."
    )
    why = (
        "NVTX marks feed Nsight, which does not exist on TPU: the calls succeed (`range_push` returns -2) and "
        "annotate nothing, so profiles show no named regions. TPU traces come from `torch_xla.debug.profiler`: "
        "`xp.Trace(name)` is the scoped annotation (host-side; no graph cut), visible after `xp.start_server(9012)` "
        "and a capture. Removing the push/pop/mark calls keeps the program's meaning."
    )
    before = (
        "import torch\n\ntorch.cuda.nvtx.range_push('forward')\nout = model(x)\ntorch.cuda.nvtx.range_pop()\n"
        "with torch.cuda.nvtx.range('backward'):\n    out.sum().backward()\n"
    )
    after = (
        "import torch_xla.debug.profiler as xp\n"
        "\n"
        "out = model(x)\n"
        "with xp.Trace('backward'):\n"
        "    out.sum().backward()\n"
    )
    message = "NVTX annotates nothing on TPU; remove it or use `torch_xla.debug.profiler` (`xp.Trace`)"
    symptoms = ("No device timeline", "torch.cuda.nvtx.range_push returns -2")
    references = ("torch_xla/debug/profiler.py", "docs/source/learn/migration-to-xla-on-tpus.md")
    valid = ("import torch_xla.debug.profiler as xp\nwith xp.Trace('fwd'):\n    y = f(x)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if names & NVTX_STATEMENTS:
            self.report_removal(node)
        elif NVTX + "range" in names:
            if isinstance(self.parent(node), cst.WithItem) and len(node.args) == 1 and node.args[0].keyword is None:
                self.report(node, replacement=node.with_changes(func=expr("xp.Trace")), imports=(IMPORT_XP,))
            else:
                self.report(node)


CUDA_PROFILER_CALLS = {
    "torch.autograd.profiler.emit_nvtx",
    "torch.cuda.profiler.start",
    "torch.cuda.profiler.stop",
    "torch.cuda.profiler.profile",
    "torch.cuda.profiler.init",
}


PROFILERS = {"torch.profiler.profile", "torch.autograd.profiler.profile", "torch.autograd.profile"}
CUDA_ACTIVITY = {"torch.profiler.ProfilerActivity.CUDA", "torch.autograd.ProfilerActivity.CUDA"}


class CudaProfiler(Rule):
    code = "XLA705"
    needs = ("cuda", "nvtx")
    title = "CUDA profiling (`ProfilerActivity.CUDA`, `use_cuda=True`, nvprof hooks) sees no TPU work"
    category = "C7"
    fix = "manual"
    detects = (
        "`ProfilerActivity.CUDA`, `profile(use_cuda=True)` / `use_device='cuda'`, `torch.autograd.profiler.emit_nvtx` "
        "and `torch.cuda.profiler.*`."
    )
    why = (
        "Without a GPU the PyTorch profiler warns `CUDA is not available, disabling CUDA profiling` and records "
        "only host ops: the XLA device timeline (compiles, executions, transfers) is missing, so the profile "
        "misleads. Use `torch_xla.debug.profiler`: `xp.start_server(9012)`, then `xp.trace_detached(...)` or "
        "`xp.start_trace(log_dir)` / `xp.stop_trace()`, with `xp.Trace('name')` / `xp.StepTrace('train', "
        "step_num=i)` regions; view in TensorBoard/XProf."
    )
    before = (
        "from torch.profiler import ProfilerActivity, profile\n\n"
        "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:\n    step()\n"
    )
    message = "CUDA profiling records no TPU work; use `torch_xla.debug.profiler` (xp.start_server / xp.trace)"
    symptoms = (
        "CUDA is not available, disabling CUDA profiling",
        "gpuGetDeviceCount failed with code 35",
        "No device timeline",
    )
    references = ("torch_xla/debug/profiler.py", "docs/source/learn/xla-profiling.md", "pytorch/xla #8824")
    valid = (
        "from torch.profiler import ProfilerActivity, profile\nwith profile(activities=[ProfilerActivity.CPU]):\n    f()\n",
    )

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self.qualified_names(node) & CUDA_ACTIVITY:
            self.report(node)

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if names & CUDA_PROFILER_CALLS:
            self.report(node)
        elif names & PROFILERS:
            use_cuda = keyword_arg(node, "use_cuda")
            use_device = keyword_arg(node, "use_device")
            if (use_cuda is not None and isinstance(use_cuda.value, cst.Name) and use_cuda.value.value == "True") or (
                use_device is not None and is_cuda_string(use_device.value)
            ):
                self.report(node)


GPU_QUERIES = {
    "torch.cuda.get_device_name": "`xm.xla_device_hw(dev)` / `xr.device_type()` ('TPU')",
    "torch.cuda.get_device_capability": "`xr.device_type()`; for bf16 checks `xr.is_bf16_supported()`",
}


class GpuIdentityQuery(Rule):
    code = "XLA708"
    needs = ("cuda",)
    title = "`torch.cuda.get_device_name()` / `get_device_capability()` raise on TPU"
    category = "C7"
    fix = "manual"
    detects = "Calls of `torch.cuda.get_device_name` and `torch.cuda.get_device_capability` (logging, feature checks)."
    why = (
        "Both initialise CUDA: on a TPU host they raise `RuntimeError: Found no NVIDIA driver on your system`, "
        "often in a startup log line that kills the run before training. The XLA side answers with "
        "`xm.xla_device_hw(dev)` or `xr.device_type()` ('TPU' / 'CPU'); capability gates such as "
        "`>= (8, 0)` for bf16 become `xr.is_bf16_supported()`."
    )
    before = "import torch\n\nprint('running on', torch.cuda.get_device_name(0))\n"
    message = "GPU identity query raises on TPU"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("torch_xla/core/xla_model.py xla_device_hw", "torch_xla/runtime.py device_type")
    valid = ("import torch_xla.runtime as xr\nprint(xr.device_type())\n",)

    def visit_Call(self, node: cst.Call) -> None:
        for name in self.qualified_names(node.func) & GPU_QUERIES.keys():
            self.report(node, f"`{name}()` raises on TPU; use {GPU_QUERIES[name]}")
            return


TENSORBOARD_MODULES = ("torch.utils.tensorboard", "tensorboardX")


class TracedGraphLogging(Rule):
    code = "XLA713"
    needs = ("add_graph",)
    title = "`SummaryWriter.add_graph` cannot trace an XLA model with batch norm"
    category = "C7"
    fix = "safe"
    autofix = True
    detects = (
        "`writer.add_graph(model, inputs)` statements in a module that imports TensorBoard's `SummaryWriter` "
        "(`torch.utils.tensorboard` or `tensorboardX`) outside `torch.no_grad()`."
    )
    why = (
        "`add_graph` records the model's graph with `torch.jit.trace`, which runs one forward pass. On the XLA "
        "device the trace of a batch-norm layer in training mode stops with `RuntimeError: Cannot insert a Tensor "
        "that requires grad as a constant` (measured on torch_xla 2.9: the program dies before its first step, "
        "after printing the whole traced tensor); on CUDA the same call works. Under `torch.no_grad()` the trace "
        "succeeds and logs the same graph: the forward pass and its effects (batch-norm running statistics) are "
        "the same, and `add_graph` keeps none of its autograd state."
    )
    before = (
        "import torch\nfrom torch.utils.tensorboard import SummaryWriter\n\n"
        "writer = SummaryWriter()\nwriter.add_graph(net, torch.zeros(1, 3, 32, 32, device=device))\n"
    )
    after = (
        "import torch\nfrom torch.utils.tensorboard import SummaryWriter\n\n"
        "writer = SummaryWriter()\nwith torch.no_grad():\n    writer.add_graph(net, torch.zeros(1, 3, 32, 32, device=device))\n"
    )
    message = "`add_graph` traces the model: on XLA a batch-norm layer fails the trace; call it under `torch.no_grad()`"
    symptoms = (
        "RuntimeError: Cannot insert a Tensor that requires grad as a constant. Consider making it a parameter or "
        "input, or detaching the gradient",
        "Error occurs, No graph saved",
    )
    references = ("torch/utils/tensorboard/_pytorch_graph.py graph (torch.jit.trace)",)
    valid = (
        "import torch\nfrom torch.utils.tensorboard import SummaryWriter\nw = SummaryWriter()\n"
        "with torch.no_grad():\n    w.add_graph(m, x)\n",
    )

    def __init__(self) -> None:
        super().__init__()
        self.tensorboard = False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = cst.Module([]).code_for_node(node.module) if node.module is not None else ""
        self.tensorboard |= module.startswith(TENSORBOARD_MODULES)

    def visit_Import(self, node: cst.Import) -> None:
        names = [cst.Module([]).code_for_node(alias.name) for alias in node.names]
        self.tensorboard |= any(name.startswith(TENSORBOARD_MODULES) for name in names)

    def visit_Call(self, node: cst.Call) -> None:
        if not (self.tensorboard and isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_graph"):
            return
        if any(self._no_grad(a) for a in self.ancestors(node)):
            return
        line = self.parent(self.parent(node))
        if (
            isinstance(self.parent(node), cst.Expr)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        ):
            body = cst.IndentedBlock(body=[line.with_changes(leading_lines=())])
            wrapped = cst.With(
                items=[cst.WithItem(expr("torch.no_grad()"))], body=body, leading_lines=line.leading_lines
            )
            self.report(node, replacement=wrapped, target=line, imports=(("torch", None, None),))
        else:
            self.report(node)

    def _no_grad(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.With):
            return any(self.is_call_to(item.item, "torch.no_grad", "torch.inference_mode") for item in node.items)
        return False


class LoggingConfigAfterTorchXla(Rule):
    code = "XLA714"
    needs = ("basicconfig",)
    title = "`logging.basicConfig` after `import torch_xla` does nothing"
    category = "C7"
    fix = "safe"
    autofix = True
    detects = (
        "`logging.basicConfig(...)` without `force=` in a file of a torch program. The fix adds `force=True`, which "
        "replaces the root handler torch_xla installed (and any the program added before the call, which the "
        "original call would have kept)."
    )
    why = (
        "`import torch_xla` runs `logging.basicConfig()` itself (torch_xla/__init__.py, measured on 2.9): the root "
        "logger then has a stderr handler and level WARNING, and a later `basicConfig(level=INFO, filename=..., "
        "format=...)` is a no-op. The migrated program loses its INFO records, its format and its log file: the "
        "training log a user (or `xlaport verify`) reads is empty. `force=True` (Python 3.8+) applies the call as "
        "the original program did."
    )
    before = "import logging\n\nimport torch_xla\n\nlogging.basicConfig(level=logging.INFO, filename='train.log')\n"
    after = (
        "import logging\n\nimport torch_xla\n\n"
        "logging.basicConfig(level=logging.INFO, filename='train.log', force=True)\n"
    )
    message = (
        "`import torch_xla` already called `logging.basicConfig()`, so this call does nothing (its level, format "
        "and log file are ignored: INFO records are dropped); pass `force=True`"
    )
    valid = (
        "import logging\nimport torch\n\nlogging.basicConfig(level=logging.INFO, force=True)\n",
        "import logging\n\nlogging.basicConfig(level=logging.INFO)\n",  # no torch: not a program torch_xla joins
    )

    def visit_Module(self, node: cst.Module) -> None:
        self.torch_program = any(_imports_torch(stmt) for stmt in self.analysis.nodes.imports)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.torch_program or not self.is_call_to(node, "logging.basicConfig"):
            return
        if keyword_arg(node, "force") is not None or any(arg.star for arg in node.args):
            return
        # add_kwarg keeps the call's layout (one argument a line stays so, without trailing blanks)
        self.report(node, replacement=add_kwarg(node, "force", cst.Name("True")))


def _imports_torch(stmt: cst.Import | cst.ImportFrom) -> bool:
    """`import torch...` / `from torch... import ...` (torch_xla too)."""
    if isinstance(stmt, cst.ImportFrom):
        names = [dotted(stmt.module) or ""] if stmt.module is not None and not stmt.relative else []
    else:
        names = [dotted(alias.name) or "" for alias in stmt.names]
    return any(name.split(".")[0] in ("torch", "torch_xla") for name in names)
