"""C7 — ranks and collectives: collectives under a rank guard, no-op barriers, rank-0 prints, sampler ranks."""

from __future__ import annotations

import libcst as cst

from ..analysis.devices import imports_torch_xla
from ..cst_helpers import every_call, expr, keyword_arg, kwarg, positional_args
from ..rule import IMPORT_XM, IMPORT_XR, REMOVE, Rule
from ..scoped_rule import ScopedRule

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


class CollectiveUnderRankGuard(Rule):
    code = "XLA702"
    needs = ("distributed", "xla_model")
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
        return any(self.qualified_names(call.func) & RANK_CALLS for call in every_call(test))


class DistBarrierNoop(Rule):
    code = "XLA703"
    needs = ("barrier",)
    title = "`dist.barrier()` does not wait on the `xla` process group"
    category = "C7"
    fix = "unsafe"
    autofix = True
    detects = "`torch.distributed.barrier()` without arguments (calls with `group=`/`device_ids=` are reported)."
    why = (
        "torch_xla 2.9's `ProcessGroupXla.barrier()` returns a finished work object without talking to the other "
        'replicas, so "rank 0 writes, barrier, everyone reads" races silently. `xm.rendezvous(tag)` is a real '
        "barrier: an XLA collective that every replica must call, and it runs `torch_xla.sync()` before and after "
        "(a graph cut, maybe an extra compile, if placed mid-step) — hence unsafe. Under a gloo group used only "
        "for host coordination the original barrier worked; keep it there."
    )
    before = "import torch.distributed as dist\n\ndist.barrier()\n"
    after = "import torch_xla.core.xla_model as xm\n\nxm.rendezvous('barrier')\n"
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


def may_lack_process_group(rule: ScopedRule) -> bool:
    """Can `dist.get_rank()` find no group here? Only in torch_xla code that does not call `init_process_group`
    itself. A CUDA program that asks torch.distributed creates the group somewhere (else it fails on the GPU as
    well), perhaps in another file; migrated, that group uses the `xla` backend and answers the same."""
    xla = rule.facts().uses("torch_xla") or imports_torch_xla(rule.analysis.module)
    return xla and not rule.facts().uses("torch.distributed.init_process_group")


class RankZeroPrint(ScopedRule):
    code = "XLA706"
    needs = ("torch_xla",)
    title = "`if dist.get_rank() == 0: print(...)`: use `xm.master_print`"
    category = "C7"
    fix = "unsafe"
    autofix = True
    detects = (
        "`if dist.get_rank() == 0:` (or `0 == dist.get_rank()`) whose body only prints, without `else`, in "
        "torch_xla code that creates no process group. Prints with `sep=`/`end=` are reported without a rewrite."
    )
    why = (
        "A torch_xla program launched with `torch_xla.launch` often never creates a torch.distributed process "
        "group (gradients are reduced by `xm.optimizer_step`), and then `dist.get_rank()` raises `ValueError: "
        "Default process group has not been initialized, please make sure to call init_process_group.` "
        "`xm.master_print(...)` prints on the global master only (`local=False` by default) and needs no process "
        "group. Unsafe: it also prints when no group exists, and `file=` becomes `fd=`."
    )
    before = "import torch.distributed as dist\nimport torch_xla\n\nif dist.get_rank() == 0:\n    print('epoch', epoch, loss)\n"
    after = "import torch_xla\nimport torch_xla.core.xla_model as xm\n\nxm.master_print('epoch', epoch, loss)\n"
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
        if node.orelse is not None or not self._is_rank_zero(node.test) or not may_lack_process_group(self):
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
                cst.SimpleStatementLine(body=[cst.Expr(new_call)], leading_lines=node.leading_lines if i == 0 else ())
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
            s
            for s in sides
            if isinstance(s, cst.Call) and not s.args and self.is_call_to(s, "torch.distributed.get_rank")
        ]
        return bool(zero and ranks)


SAMPLERS = {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}


class SamplerRankFromDist(ScopedRule):
    code = "XLA707"
    needs = ("torch_xla",)
    title = "`DistributedSampler` rank/world from torch.distributed: use `xr.world_size()` / `xr.global_ordinal()`"
    category = "C7"
    fix = "safe"
    autofix = True
    detects = (
        "`DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank())`, and samplers that "
        "leave `num_replicas`/`rank` out (or None), which makes the sampler ask torch.distributed itself, in "
        "torch_xla code that creates no process group."
    )
    why = (
        "torch_xla processes usually have no torch.distributed group, and the sampler then raises `ValueError: "
        "Default process group has not been initialized`; replicas that skip the sampler train on the same data. "
        "The XLA runtime knows both numbers: `num_replicas=xr.world_size(), rank=xr.global_ordinal()` (the "
        "pytorch/xla MNIST example). With an `xla` process group the values are identical, so the rewrite keeps "
        "the meaning. `MpDeviceLoader` does not shard data by itself."
    )
    before = (
        "import torch.distributed as dist\nimport torch_xla\nfrom torch.utils.data import DistributedSampler\n\n"
        "sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True)\n"
    )
    after = (
        "import torch_xla\n"
        "from torch.utils.data import DistributedSampler\n"
        "import torch_xla.runtime as xr\n"
        "\n"
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
        if not may_lack_process_group(self):
            return  # a group exists (migrated to the xla backend): the sampler's lookup works
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


SYNC_BATCHNORM = frozenset({"torch.nn.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm"})


class SyncBatchNormOnXla(Rule):
    code = "XLA712"
    needs = ("syncbatchnorm",)
    title = "`nn.SyncBatchNorm` raises on the XLA device"
    category = "C7"
    fix = "unsafe"
    autofix = True
    detects = (
        "`nn.SyncBatchNorm.convert_sync_batchnorm(model)` and `nn.SyncBatchNorm(...)` layers. The fix keeps the "
        "model's plain BatchNorm layers: `model = nn.SyncBatchNorm.convert_sync_batchnorm(model)` is removed, "
        "`f(nn.SyncBatchNorm.convert_sync_batchnorm(model))` becomes `f(model)`."
    )
    why = (
        "SyncBatchNorm's training forward only runs on GPU/XPU tensors: on XLA it raises `ValueError: "
        "SyncBatchNorm expected input tensor to be on GPU or XPU or privateuseone` (measured with torch_xla 2.9, a "
        "process group initialised). Plain BatchNorm runs, with statistics over each replica's batch instead of "
        "the global batch: the same numbers with one replica, slightly noisier statistics with many (small "
        "per-replica batches suffer most). Unsafe for that reason: review the per-replica batch size."
    )
    before = (
        "import torch.nn as nn\n\n"
        "model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n"
        "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
        "train(model)\n"
    )
    after = "import torch.nn as nn\n\nmodel = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\ntrain(model)\n"
    message = (
        "SyncBatchNorm raises on XLA tensors (`ValueError: SyncBatchNorm expected input tensor to be on GPU`); "
        "keep plain BatchNorm (statistics per replica)"
    )
    symptoms = ("ValueError: SyncBatchNorm expected input tensor to be on GPU or XPU or privateuseone",)
    references = ("torch/nn/modules/batchnorm.py SyncBatchNorm.forward",)
    valid = ("import torch.nn as nn\nmodel = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n",)

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if names & SYNC_BATCHNORM:
            self.report(node, f"{self.message}: use `nn.BatchNorm{{1,2,3}}d` here")
            return
        if not any(n.rsplit(".", 1)[0] in SYNC_BATCHNORM and n.endswith(".convert_sync_batchnorm") for n in names):
            return
        args = positional_args(node)
        if len(node.args) != 1 or len(args) != 1:
            self.report(node, f"{self.message} (not rewritten: a process group is given)")
            return
        model = args[0].value
        stmt = self.parent(self.parent(node))
        assign = self.parent(node)
        if (
            isinstance(assign, cst.Assign)
            and isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and len(assign.targets) == 1
            and assign.targets[0].target.deep_equals(model)
        ):
            self.report(stmt, replacement=REMOVE)
        else:
            self.report(node, replacement=model)
