"""C7 — infrastructure: checkpoints, ranks and collectives, barriers, logging, profiling, SPMD/FSDP."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from ..cst_helpers import kwarg, same_quotes, whole_statement
from ..rule import (
    IMPORT_XM,
    IMPORT_XR,
    REMOVE,
    Rule,
    expr,
    is_cuda_string,
    keyword_arg,
    positional_args,
    register,
    string_value,
)
from .c1_environment import env_writes

IMPORT_XP = ("torch_xla.debug.profiler", None, "xp")


def calls_in(node: cst.CSTNode) -> Iterator[cst.Call]:
    """Every call inside `node` (itself included), outermost first."""
    if isinstance(node, cst.Call):
        yield node
    for child in node.children:
        yield from calls_in(child)


def holds_state_dict(node: cst.CSTNode) -> bool:
    """`m.state_dict()`, or a dict literal with such a value (a checkpoint dict)."""
    if isinstance(node, cst.Call):
        return isinstance(node.func, cst.Attribute) and node.func.attr.value == "state_dict"
    if isinstance(node, cst.Dict):
        return any(holds_state_dict(e.value) for e in node.elements if isinstance(e, cst.DictElement))
    return False


@register
class TorchSaveDeviceTensors(Rule):
    code = "XLA701"
    title = "`torch.save(model.state_dict())` writes XLA tensors: use `xm.save`"
    category = "C7"
    fix = "unsafe"
    autofix = True
    detects = (
        "`torch.save(x.state_dict(), path)` and `torch.save({... x.state_dict() ...}, path)` (checkpoint dicts). "
        "Calls with extra arguments (`pickle_protocol=`, ...) are reported without a rewrite."
    )
    why = (
        "A `torch.save` of device tensors pickles them as XLA tensors: loading needs torch_xla and a device and "
        "puts them back on `xla:0`; on a CPU-only host it fails with `don't know how to restore data location of "
        "torch.FloatStorage (tagged with xla:0)` (transformers #4963). `xm.save(data, path)` first syncs and copies "
        "every tensor of the (nested) object to the CPU, then writes. Unsafe because `xm.save` writes only on "
        "each host's master process (`master_only=True`): code that saves a different file per rank must pass "
        "`master_only=False`. Prefer `.state_dict()`: `xm.save` converts plain tensors, not `nn.Parameter`s."
    )
    before = "import torch\n\ntorch.save(model.state_dict(), 'model.pt')\n"
    after = (
        "import torch\nimport torch_xla.core.xla_model as xm\n\nxm.save(model.state_dict(), 'model.pt')\n"
    )
    message = "`torch.save` of device tensors reloads onto xla:0; use `xm.save` (CPU copy, master process writes)"
    symptoms = (
        "don't know how to restore data location of torch.FloatStorage (tagged with xla:0)",
        "RuntimeError: don't know how to restore data location of torch.storage.UntypedStorage (tagged with xla:0)",
        "Attempted to access the data pointer on an invalid python storage",
    )
    references = (
        "docs/source/learn/pytorch-on-xla-devices.md Saving and Loading",
        "docs/source/learn/troubleshoot.md XLA Tensor Quirks",
        "huggingface/transformers #4963",
        "torch_xla/core/xla_model.py save",
    )
    valid = (
        "import torch_xla.core.xla_model as xm\nxm.save(model.state_dict(), 'm.pt')\n",
        "import torch\ntorch.save(metrics, 'metrics.pt')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.save"):
            return
        args = positional_args(node)
        data = args[0].value if args else getattr(keyword_arg(node, "obj"), "value", None)
        if data is None or not holds_state_dict(data):
            return
        if len(args) == 2 and len(node.args) == 2:
            self.report(node, replacement=node.with_changes(func=expr("xm.save")), imports=(IMPORT_XM,))
        else:
            self.report(node, self.message + "; drop the extra torch.save arguments")


RANK_CALLS = {
    "torch_xla.core.xla_model.is_master_ordinal",
    "torch_xla.core.xla_model.get_ordinal",
    "torch_xla.core.xla_model.get_local_ordinal",
    "torch_xla.runtime.global_ordinal",
    "torch_xla.runtime.local_ordinal",
    "torch_xla.runtime.process_index",
    "torch.distributed.get_rank",
    "torch.distributed.get_node_local_rank",
}
XM = "torch_xla.core.xla_model."
COLLECTIVES = {
    *(
        XM + n
        for n in (
            "rendezvous",
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "mesh_reduce",
            "reduce_gradients",
            "optimizer_step",
            "collective_permute",
            "broadcast_master_param",
        )
    ),
    *(
        "torch.distributed." + n
        for n in (
            "barrier",
            "all_reduce",
            "all_gather",
            "all_gather_object",
            "broadcast",
            "broadcast_object_list",
            "reduce",
            "reduce_scatter",
            "gather",
            "scatter",
        )
    ),
}


@register
class CollectiveUnderRankGuard(Rule):
    code = "XLA702"
    title = "Collective called inside a rank check: the other replicas never join"
    category = "C7"
    fix = "manual"
    detects = (
        "`xm.rendezvous`, `xm.all_reduce`, `xm.mesh_reduce`, `xm.optimizer_step`, `dist.barrier`, `dist.all_reduce`... "
        "inside an `if` whose test reads the rank (`xm.is_master_ordinal()`, `xr.global_ordinal() == 0`, "
        "`dist.get_rank() == 0`)."
    )
    why = (
        "XLA collectives (and `xm.rendezvous`, which syncs the graph before and after) must be called by every "
        "replica; when only the master calls one, it waits for peers that never come: the job hangs without an "
        "error (pytorch/xla #2712, #2224, #4571 — the classic case was `if xm.is_master_ordinal(): xm.save(...)` "
        "when `xm.save` still contained a rendezvous). Move the collective out of the rank check and keep only "
        "the host-side work (printing, writing files) inside it."
    )
    before = (
        "import torch_xla.core.xla_model as xm\n\n"
        "if xm.is_master_ordinal():\n    write_report()\n    xm.rendezvous('report_written')\n"
    )
    message = "collective inside a rank check: the other replicas never call it, so the job hangs; call it on all ranks"
    symptoms = ("hang at xm.rendezvous", "Termination timeout for all reduce RendezvousKey")
    references = ("pytorch/xla #2712", "pytorch/xla #2224", "pytorch/xla #4571", "docs/source/learn/_pjrt.md")
    valid = (
        "import torch_xla.core.xla_model as xm\nif xm.is_master_ordinal():\n    print('x')\nxm.rendezvous('done')\n",
        "import torch_xla.core.xla_model as xm\nif ready:\n    xm.rendezvous('x')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & COLLECTIVES:
            return
        child: cst.CSTNode = node
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return
            if isinstance(anc, cst.If) and child is not anc.test and self._reads_rank(anc.test):
                self.report(node)
                return
            child = anc

    def _reads_rank(self, test: cst.BaseExpression) -> bool:
        return any(self.qualified_names(call.func) & RANK_CALLS for call in calls_in(test))


@register
class DistBarrierNoop(Rule):
    code = "XLA703"
    title = "`dist.barrier()` does not wait on the `xla` process group"
    category = "C7"
    fix = "unsafe"
    autofix = True
    detects = "`torch.distributed.barrier()` without arguments (calls with `group=`/`device_ids=` are reported)."
    why = (
        "torch_xla 2.9's `ProcessGroupXla.barrier()` returns a finished work object without talking to the other "
        "replicas, so \"rank 0 writes, barrier, everyone reads\" races silently. `xm.rendezvous(tag)` is a real "
        "barrier: an XLA collective that every replica must call, and it runs `torch_xla.sync()` before and after "
        "(a graph cut, maybe an extra compile, if placed mid-step) — hence unsafe. Under a gloo group used only "
        "for host coordination the original barrier worked; keep it there."
    )
    before = "import torch.distributed as dist\n\ndist.barrier()\n"
    after = "import torch.distributed as dist\nimport torch_xla.core.xla_model as xm\n\nxm.rendezvous('barrier')\n"
    message = "`dist.barrier()` is a no-op on the xla process group; use `xm.rendezvous('tag')` on all replicas"
    symptoms = ("race after dist.barrier()", "hang at xm.rendezvous")
    references = ("torch_xla/distributed/xla_backend.py ProcessGroupXla.barrier", "docs/source/learn/_pjrt.md")
    valid = ("import torch_xla.core.xla_model as xm\nxm.rendezvous('ckpt')\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.distributed.barrier"):
            return
        if node.args:
            self.report(node)
        else:
            self.report(node, replacement=expr("xm.rendezvous('barrier')"), imports=(IMPORT_XM,))


NVTX = "torch.cuda.nvtx."
NVTX_STATEMENTS = {NVTX + n for n in ("range_push", "range_pop", "mark", "range_start", "range_end")}


@register
class NvtxRanges(Rule):
    code = "XLA704"
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
        "import torch\nimport torch_xla.debug.profiler as xp\n\nout = model(x)\n"
        "with xp.Trace('backward'):\n    out.sum().backward()\n"
    )
    message = "NVTX annotates nothing on TPU; remove it or use `torch_xla.debug.profiler` (`xp.Trace`)"
    symptoms = ("No device timeline", "torch.cuda.nvtx.range_push returns -2")
    references = ("torch_xla/debug/profiler.py", "docs/source/learn/migration-to-xla-on-tpus.md")
    valid = ("import torch_xla.debug.profiler as xp\nwith xp.Trace('fwd'):\n    y = f(x)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if names & NVTX_STATEMENTS:
            line = whole_statement(self, node)
            if line is not None:
                self.report(line, replacement=REMOVE)
            else:
                self.report(node)
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


@register
class CudaProfiler(Rule):
    code = "XLA705"
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
    valid = ("from torch.profiler import ProfilerActivity, profile\nwith profile(activities=[ProfilerActivity.CPU]):\n    f()\n",)

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


@register
class RankZeroPrint(Rule):
    code = "XLA706"
    title = "`if dist.get_rank() == 0: print(...)`: use `xm.master_print`"
    category = "C7"
    fix = "unsafe"
    autofix = True
    detects = (
        "`if dist.get_rank() == 0:` (or `0 == dist.get_rank()`) whose body only prints, without `else`. "
        "Prints with `sep=`/`end=` are reported without a rewrite."
    )
    why = (
        "A torch_xla program launched with `torch_xla.launch` often never creates a torch.distributed process "
        "group (gradients are reduced by `xm.optimizer_step`), and then `dist.get_rank()` raises `ValueError: "
        "Default process group has not been initialized, please make sure to call init_process_group.` "
        "`xm.master_print(...)` prints on the global master only (`local=False` by default) and needs no process "
        "group. Unsafe: it also prints when no group exists, and `file=` becomes `fd=`."
    )
    before = "import torch.distributed as dist\n\nif dist.get_rank() == 0:\n    print('epoch', epoch, loss)\n"
    after = (
        "import torch.distributed as dist\nimport torch_xla.core.xla_model as xm\n\nxm.master_print('epoch', epoch, loss)\n"
    )
    message = "rank-0 print through torch.distributed; use `xm.master_print(...)` (no process group needed)"
    symptoms = (
        "ValueError: Default process group has not been initialized, please make sure to call init_process_group.",
        "Output duplicated per host/process",
    )
    references = ("torch_xla/core/xla_model.py master_print", "xla_migration_facts §6 caveat 3")
    valid = (
        "import torch_xla.core.xla_model as xm\nxm.master_print('hi')\n",
        "import torch.distributed as dist\nif dist.get_rank() == 0:\n    save(model)\n",
        "import torch.distributed as dist\nif dist.get_rank() == 1:\n    print('x')\n",
    )

    KEYWORDS = {"file": "fd", "flush": "flush"}

    def visit_If(self, node: cst.If) -> None:
        if node.orelse is not None or not self._is_rank_zero(node.test):
            return
        lines = node.body.body if isinstance(node.body, cst.IndentedBlock) else [node.body]
        prints: list[cst.Call] = []
        for line in lines:
            if not (isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) and len(line.body) == 1):
                return
            small = line.body[0]
            if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
                return
            call = small.value
            if not (isinstance(call.func, cst.Name) and call.func.value == "print"):
                return
            prints.append(call)
        if any(a.keyword is not None and a.keyword.value not in self.KEYWORDS for p in prints for a in p.args):
            self.report(node, self.message + " (drop `sep=`/`end=`)")
            return
        new_lines = []
        for i, call in enumerate(prints):
            args = [
                a.with_changes(keyword=cst.Name(self.KEYWORDS[a.keyword.value])) if a.keyword is not None else a
                for a in call.args
            ]
            new_call = call.with_changes(func=expr("xm.master_print"), args=args)
            new_lines.append(
                cst.SimpleStatementLine(
                    body=[cst.Expr(new_call)], leading_lines=node.leading_lines if i == 0 else ()
                )
            )
        self.report(node, replacement=cst.FlattenSentinel(new_lines), imports=(IMPORT_XM,))

    def _is_rank_zero(self, test: cst.BaseExpression) -> bool:
        if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
            return False
        target = test.comparisons[0]
        if not isinstance(target.operator, cst.Equal):
            return False
        sides = [test.left, target.comparator]
        zero = [s for s in sides if isinstance(s, cst.Integer) and s.value == "0"]
        ranks = [
            s for s in sides if isinstance(s, cst.Call) and not s.args and self.is_call_to(s, "torch.distributed.get_rank")
        ]
        return bool(zero and ranks)


SAMPLERS = {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}


@register
class SamplerRankFromDist(Rule):
    code = "XLA707"
    title = "`DistributedSampler` rank/world from torch.distributed: use `xr.world_size()` / `xr.global_ordinal()`"
    category = "C7"
    fix = "safe"
    autofix = True
    detects = (
        "`DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank())`, and samplers that "
        "leave `num_replicas`/`rank` out (or None), which makes the sampler ask torch.distributed itself."
    )
    why = (
        "torch_xla processes usually have no torch.distributed group, and the sampler then raises `ValueError: "
        "Default process group has not been initialized`; replicas that skip the sampler train on the same data. "
        "The XLA runtime knows both numbers: `num_replicas=xr.world_size(), rank=xr.global_ordinal()` (the "
        "pytorch/xla MNIST example). With an `xla` process group the values are identical, so the rewrite keeps "
        "the meaning. `MpDeviceLoader` does not shard data by itself."
    )
    before = (
        "import torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\n\n"
        "sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True)\n"
    )
    after = (
        "import torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\n"
        "import torch_xla.runtime as xr\n\n"
        "sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal(), shuffle=True)\n"
    )
    message = "sampler shards by torch.distributed; use `num_replicas=xr.world_size(), rank=xr.global_ordinal()`"
    symptoms = (
        "ValueError: Default process group has not been initialized, please make sure to call init_process_group.",
        "Every replica trains on the same data",
    )
    references = ("pytorch/xla test/test_train_mp_mnist.py", "torch_xla/distributed/parallel_loader.py")
    valid = (
        "import torch_xla.runtime as xr\nfrom torch.utils.data import DistributedSampler\n"
        "s = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal())\n",
        "from torch.utils.data import DistributedSampler\ns = DistributedSampler(ds, world, rank)\n",
    )

    SLOTS = (
        (1, "num_replicas", "torch.distributed.get_world_size", "xr.world_size()"),
        (2, "rank", "torch.distributed.get_rank", "xr.global_ordinal()"),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & SAMPLERS or any(a.star for a in node.args):
            return
        positional = positional_args(node)
        new_args = list(node.args)
        added = []
        for index, keyword, dist_call, xr_code in self.SLOTS:
            arg = positional[index] if len(positional) > index else keyword_arg(node, keyword)
            if arg is None:
                added.append(kwarg(keyword, expr(xr_code)))
            elif self._replaceable(arg.value, dist_call):
                new_args[new_args.index(arg)] = arg.with_changes(value=expr(xr_code))
        if not added and new_args == list(node.args):
            return
        if added:
            new_args = _append_args(new_args, added)
        self.report(node, replacement=node.with_changes(args=new_args), imports=(IMPORT_XR,))

    def _replaceable(self, value: cst.BaseExpression, dist_call: str) -> bool:
        if isinstance(value, cst.Name) and value.value == "None":
            return True
        return isinstance(value, cst.Call) and not value.args and self.is_call_to(value, dist_call)




def _append_args(args: list[cst.Arg], added: list[cst.Arg]) -> list[cst.Arg]:
    """`args + added`, following the call's layout (one per line with a trailing comma, or `a, b`)."""
    inline = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    trailing = args[-1].comma if args else cst.MaybeSentinel.DEFAULT
    if isinstance(trailing, cst.Comma):
        # a multi-line call with a trailing comma: reuse its separators
        middle = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else inline
    else:
        middle = inline
    out = [*args[:-1], args[-1].with_changes(comma=middle)] if args else []
    out += [a.with_changes(comma=middle) for a in added[:-1]]
    out.append(added[-1].with_changes(comma=trailing))
    return out


GPU_QUERIES = {
    "torch.cuda.get_device_name": "`xm.xla_device_hw(dev)` / `xr.device_type()` ('TPU')",
    "torch.cuda.get_device_capability": "`xr.device_type()`; for bf16 checks `xr.is_bf16_supported()`",
}


@register
class GpuIdentityQuery(Rule):
    code = "XLA708"
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


@register
class XlaUseSpmdEnv(Rule):
    code = "XLA709"
    title = "`XLA_USE_SPMD=1` set in code: use `xr.use_spmd()`"
    category = "C7"
    fix = "unsafe"
    autofix = True
    detects = (
        "`os.environ['XLA_USE_SPMD'] = '1'` / `os.environ.setdefault('XLA_USE_SPMD', '1')` statements "
        "(rewritten when an import precedes them) and other writes of the variable (reported)."
    )
    why = (
        "The env var is deprecated (`XLA_USE_SPMD is being deprecated. Use torch_xla.runtime.use_spmd() without "
        "setting XLA_USE_SPMD env-var.`) and only works if set before the runtime starts. `xr.use_spmd()` also "
        "switches over when tensors already exist (replicating them, with a warning). Unsafe because the call "
        "needs torch_xla imported at that point, where the env var did not. Under SPMD there is one process per "
        "host: `torch_xla.launch` raises `NotImplementedError: launch function does not support SPMD at this "
        "time` and `xr.world_size()` is 1."
    )
    before = "import os\n\nos.environ['XLA_USE_SPMD'] = '1'\n"
    after = "import os\nimport torch_xla.runtime as xr\n\nxr.use_spmd()\n"
    message = "`XLA_USE_SPMD` is deprecated; call `xr.use_spmd()` before creating tensors"
    symptoms = (
        "XLA_USE_SPMD is being deprecated. Use torch_xla.runtime.use_spmd() without setting XLA_USE_SPMD env-var.",
        "NotImplementedError: launch function does not support SPMD at this time",
    )
    references = ("torch_xla/runtime.py use_spmd", "docs/source/perf/spmd_basic.md")
    valid = ("import torch_xla.runtime as xr\nxr.use_spmd()\n", "import os\nos.environ['XLA_USE_SPMD'] = '0'\n")

    def __init__(self) -> None:
        super().__init__()
        self.module: cst.Module | None = None

    def visit_Module(self, node: cst.Module) -> None:
        self.module = node

    def visit_Assign(self, node: cst.Assign) -> None:
        self._check(node)

    def visit_Call(self, node: cst.Call) -> None:
        self._check(node)

    def _check(self, node: cst.Assign | cst.Call) -> None:
        for write in env_writes(self, node):
            if write.key != "XLA_USE_SPMD" or string_value(write.value) in {"0", "", "false", "False"}:
                continue
            turns_on = string_value(write.value) in {"1", "true", "True"}
            line = self.parent(node) if isinstance(node, cst.Assign) else whole_statement(self, node)
            is_line = isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
            is_setter = isinstance(node, cst.Assign) or self.is_call_to(node, "os.environ.setdefault")
            if turns_on and is_line and is_setter and self._after_an_import(line):
                replacement = line.with_changes(body=[cst.Expr(expr("xr.use_spmd()"))])
                self.report(line, replacement=replacement, imports=(IMPORT_XR,))
            else:
                self.report(write.node)

    def _after_an_import(self, line: cst.SimpleStatementLine) -> bool:
        """Added imports go after the first import block, so a module-level line must follow an import."""
        if self.module is None or line not in self.module.body:
            return True  # inside a function: runs after every module-level import
        for stmt in self.module.body[: self.module.body.index(line)]:
            if isinstance(stmt, cst.SimpleStatementLine) and any(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
            ):
                return True
        return False


FSDP_WRAPPERS = {
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
}


@register
class TorchFsdpOnXla(Rule):
    code = "XLA710"
    title = "PyTorch FSDP does not run on XLA devices: use FSDPv2 (SPMD)"
    category = "C7"
    fix = "manual"
    detects = "Calls of `torch.distributed.fsdp.FullyShardedDataParallel(...)` and `fully_shard(...)`."
    why = (
        "PyTorch's FSDP is built on CUDA streams and device-specific backends: wrapping an XLA model fails with "
        "`AttributeError: Device 'xla:0' does not have a corresponding backend registered as 'torch.xla'` "
        "(torch_xla 2.9). On TPU shard with SPMD: `xr.use_spmd()`, a `xs.Mesh(..., ('fsdp', ...))` and "
        "`torch_xla.experimental.spmd_fully_sharded_data_parallel.SpmdFullyShardedDataParallel` (FSDPv2), or "
        "the multi-process `torch_xla.distributed.fsdp.XlaFullyShardedDataParallel`; sharded checkpoints go "
        "through `torch.distributed.checkpoint` with the SPMD save/load planners."
    )
    before = (
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\nmodel = FSDP(model)\n"
    )
    message = (
        "torch FSDP cannot wrap XLA models; use FSDPv2 "
        "(`torch_xla.experimental.spmd_fully_sharded_data_parallel.SpmdFullyShardedDataParallel`) with SPMD"
    )
    symptoms = (
        "AttributeError: Device 'xla:0' does not have a corresponding backend registered as 'torch.xla'",
    )
    references = (
        "docs/source/perf/fsdp_spmd.md",
        "docs/source/perf/spmd_basic.md",
        "docs/source/perf/spmd_distributed_checkpoint.md",
    )
    valid = (
        "from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2\n"
        "model = FSDPv2(model)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.qualified_names(node.func) & FSDP_WRAPPERS:
            self.report(node)




@register
class LoadOntoCudaOrXla(Rule):
    code = "XLA711"
    title = "`torch.load(..., map_location='cuda')`: load on the CPU, then move"
    category = "C7"
    fix = "unsafe"
    autofix = True
    detects = (
        "`torch.load` whose `map_location` is a CUDA device (`'cuda'`, `'cuda:0'`, `torch.device('cuda')`) or an "
        "XLA device (`'xla'`, `torch_xla.device()`)."
    )
    why = (
        "On a TPU host mapping to CUDA raises `RuntimeError: Attempting to deserialize object on a CUDA device but "
        "torch.cuda.is_available() is False`, and mapping straight to XLA is not supported either "
        "(`don't know how to restore data location of torch.storage.UntypedStorage (tagged with xla:0)`). Load with "
        "`map_location='cpu'`; `model.load_state_dict(sd)` then copies into the device parameters and "
        "`optimizer.load_state_dict` casts state to the parameters' device. Unsafe: tensors used directly "
        "stay on the CPU unless moved with `.to(torch_xla.device())` (or `xm.send_cpu_data_to_device`)."
    )
    before = "import torch\n\nstate = torch.load('ckpt.pt', map_location='cuda:0')\n"
    after = "import torch\n\nstate = torch.load('ckpt.pt', map_location='cpu')\n"
    message = "load checkpoints with `map_location='cpu'`, then load_state_dict / move to `torch_xla.device()`"
    symptoms = (
        "RuntimeError: Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. "
        "If you are running on a CPU-only machine, please use torch.load with map_location=torch.device('cpu') "
        "to map your storages to the CPU.",
        "don't know how to restore data location of torch.storage.UntypedStorage (tagged with xla:0)",
    )
    references = ("huggingface/transformers #4963", "accelerate optimizer.py move_to_device")
    valid = (
        "import torch\nsd = torch.load('c.pt', map_location='cpu')\n",
        "import torch\nsd = torch.load('c.pt', map_location=device)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.load"):
            return
        positional = positional_args(node)
        arg = positional[1] if len(positional) > 1 else keyword_arg(node, "map_location")
        if arg is None or not self._device_target(arg.value):
            return
        value = arg.value
        cpu = same_quotes(value, "cpu") if isinstance(value, cst.SimpleString) else cst.SimpleString('"cpu"')
        self.report(value, replacement=cpu)

    def _device_target(self, value: cst.BaseExpression) -> bool:
        text = string_value(value)
        if text is not None:
            return is_cuda_string(value) or text == "xla" or text.startswith("xla:")
        if not isinstance(value, cst.Call):
            return False
        if self.is_call_to(value, "torch_xla.device", "torch_xla.core.xla_model.xla_device"):
            return True
        if self.is_call_to(value, "torch.device"):
            args = positional_args(value)
            return bool(args) and (is_cuda_string(args[0].value) or string_value(args[0].value) in {"xla"})
        return False
