"""C2 — GPU-only compile and optimizer flags, activation checkpointing, and the distributed launch (NCCL, DDP device ids, `mp.spawn`)."""

from __future__ import annotations

import libcst as cst

from ..analysis.optimizers import is_optimizer
from ..cst_helpers import (
    add_kwarg,
    bound_arguments,
    drop_args,
    expr,
    has_star_args,
    is_literal,
    keyword_arg,
    kwarg,
    launch_arguments,
    positional_args,
    same_quotes,
    string_value,
    with_commas,
)
from ..rule import IMPORT_TORCH_XLA, Rule
from ..scoped_rule import ScopedRule


# --- compile, optimizer and clipping flags ------------------------------------------------
class TorchCompileInductor(Rule):
    code = "XLA216"
    needs = ("compile",)
    title = "`torch.compile` with the default (inductor) backend fails on XLA tensors"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        '`torch.compile(fn)` without `backend=`, with `backend="inductor"`, and the bare `@torch.compile` decorator.'
    )
    why = (
        "Inductor generates Triton/C++ kernels for CUDA/CPU; given XLA tensors it fails with "
        "`InductorError: KeyError: 'xla'`. The Dynamo backend for XLA is `backend=\"openxla\"`. Inductor-only "
        "options (`mode=`, `options=`) are then ignored with a warning. For training, plain lazy tensors (or "
        "`torch_xla.compile`) are usually faster than Dynamo, which traces forward and backward separately."
    )
    before = "import torch\n\nmodel = torch.compile(model)\n"
    after = 'import torch\n\nmodel = torch.compile(model, backend="openxla")\n'
    message = '`torch.compile` uses inductor, which fails on XLA tensors; use `backend="openxla"`'
    symptoms = ("InductorError: KeyError: 'xla'",)
    references = ("docs/source/perf/dynamo.md",)
    valid = (
        "import torch\nm = torch.compile(model, backend='openxla')\n",
        "import torch\nm = torch.compile(model, backend=my_backend)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.compile"):
            return
        backend = keyword_arg(node, "backend")
        if backend is None:
            if has_star_args(node):
                return
            self.report(node, replacement=add_kwarg(node, "backend", cst.SimpleString('"openxla"')))
        elif string_value(backend.value) == "inductor":
            self.report(backend.value, replacement=same_quotes(backend.value, "openxla"))

    def visit_Decorator(self, node: cst.Decorator) -> None:
        if not isinstance(node.decorator, cst.Call) and "torch.compile" in self.qualified_names(node.decorator):
            call = cst.Call(node.decorator, [kwarg("backend", cst.SimpleString('"openxla"'))])
            self.report(node.decorator, replacement=call)


class FusedOptimizer(Rule):
    code = "XLA217"
    needs = ("fused",)
    title = "`fused=True` optimizers do not run on XLA tensors"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.optim.Adam/AdamW/SGD/...(..., fused=<anything but False/None>)`."
    why = (
        "The fused kernels exist for CUDA/CPU/MPS only; the first `step()` raises ``RuntimeError: `fused=True` "
        "requires all the params to be floating point Tensors of supported devices: ['mps', 'cuda', 'xpu', 'hpu', "
        "'cpu', 'mtia', 'privateuseone'] but torch.float32 and xla``. Without the flag the optimizer does the same "
        "math (XLA fuses the update into the step graph anyway)."
    )
    before = "import torch\n\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)\n"
    after = "import torch\n\nopt = torch.optim.AdamW(model.parameters(), lr=3e-4)\n"
    message = "`fused=True` fails on XLA tensors; drop it"
    symptoms = ("RuntimeError: `fused=True` requires all the params to be floating point Tensors of supported devices",)
    references = ("torch_xla/amp/syncfree/",)
    valid = ("import torch\nopt = torch.optim.AdamW(model.parameters(), fused=False)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        fused = keyword_arg(node, "fused")
        if fused is not None and not is_literal(fused.value, "False", "None") and is_optimizer(self, node):
            self.report(node, replacement=drop_args(node, [fused]))


CLIP_FUNCTIONS = frozenset(
    {
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_norm",
        "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        "torch.nn.utils.clip_grad.clip_grad_value_",
    }
)


class ForeachClip(Rule):
    code = "XLA218"
    needs = ("foreach",)
    title = "`clip_grad_norm_(..., foreach=True)` raises on XLA"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`clip_grad_norm_` / `clip_grad_value_` with `foreach=<anything but False/None>`."
    why = (
        "`import torch_xla` replaces `clip_grad_norm_` with a host-sync-free version that rejects foreach "
        "(`RuntimeError: foreach=True is not supported with XLA`), and `clip_grad_value_` fails with "
        "`foreach=True was passed, but can't use the foreach API on xla tensors`. The flag is only a CUDA speed "
        "knob: dropping it gives the same clipping."
    )
    before = "import torch\n\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)\n"
    after = "import torch\n\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    message = "`foreach=True` raises with XLA tensors; drop it"
    symptoms = (
        "RuntimeError: foreach=True is not supported with XLA",
        "foreach=True was passed, but can't use the foreach API on xla tensors",
    )
    references = ("torch_xla/_patched_functions.py",)
    valid = ("import torch\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        foreach = keyword_arg(node, "foreach")
        if (
            foreach is not None
            and not is_literal(foreach.value, "False", "None")
            and self.qualified_names(node.func) & CLIP_FUNCTIONS
        ):
            self.report(node, replacement=drop_args(node, [foreach]))


class TorchCheckpoint(Rule):
    code = "XLA219"
    needs = ("checkpoint",)
    title = "`torch.utils.checkpoint` fails (or saves nothing) on XLA"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.utils.checkpoint.checkpoint(fn, *args, ...)` and `checkpoint_sequential(...)`."
    why = (
        "In torch_xla 2.9 the backward of the torch version fails with `AttributeError: module 'torch' has no "
        "attribute 'xla'` (it looks up a device module named after the device type); historically it also saved "
        "no memory because XLA's CSE merged the recomputation back (#3455). "
        "`torch_xla.utils.checkpoint.checkpoint` adds an optimization barrier so the recompute stays. It only has the "
        "reentrant variant: calls with `use_reentrant=False` or other options (and `checkpoint_sequential`) are "
        "reported, not rewritten — with reentrant checkpointing an input must require grad or the segment's "
        "parameters get no gradient."
    )
    before = (
        "import torch\nimport torch.utils.checkpoint\n\n"
        "h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=True)\n"
    )
    after = (
        "import torch\nimport torch.utils.checkpoint\nimport torch_xla.utils.checkpoint\n\n"
        "h = torch_xla.utils.checkpoint.checkpoint(block, h, use_reentrant=True)\n"
    )
    message = "`torch.utils.checkpoint` fails on XLA; use `torch_xla.utils.checkpoint.checkpoint`"
    symptoms = ("AttributeError: module 'torch' has no attribute 'xla'",)
    references = ("torch_xla/utils/checkpoint.py", "pytorch/xla #3455", "huggingface/transformers #29314")
    valid = ("import torch_xla.utils.checkpoint as xc\nh = xc.checkpoint(block, h)\n",)

    XLA_KWARGS = frozenset({"use_reentrant", "preserve_rng_state"})

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if "torch.utils.checkpoint.checkpoint_sequential" in names:
            self.report(
                node,
                "`checkpoint_sequential` fails on XLA; checkpoint each segment with `torch_xla.utils.checkpoint.checkpoint`",
            )
            return
        if "torch.utils.checkpoint.checkpoint" not in names:
            return
        reentrant = keyword_arg(node, "use_reentrant")
        kwargs = {a.keyword.value for a in node.args if a.keyword is not None}
        if (
            (reentrant is not None and not is_literal(reentrant.value, "True"))
            or kwargs - self.XLA_KWARGS
            or any(a.star == "**" for a in node.args)
        ):
            self.report(
                node,
                f"{self.message} (reentrant only: with use_reentrant=False / extra options, rewrite by hand and make "
                "sure an input of each segment requires grad)",
            )
            return
        self.report(
            node,
            replacement=node.with_changes(func=expr("torch_xla.utils.checkpoint.checkpoint")),
            imports=(("torch_xla.utils.checkpoint", None, None),),
        )


# --- distributed launch ------------------------------------------------------------------------
GPU_COUNTS = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})
XLA_LAUNCHERS = frozenset(
    {"torch_xla.launch", "torch_xla.torch_xla.launch", "torch_xla.distributed.xla_multiprocessing.spawn"}
)
SPAWN_POSITIONS = ("fn", "args", "nprocs", "join", "daemon", "start_method")


def spawns_one_process_per_gpu(rule: Rule, spawn: cst.Call) -> bool:
    """`mp.spawn(fn, nprocs=torch.cuda.device_count())` (directly or through a name assigned from the count):
    one process per device, the process model of `torch_xla.launch`, so moving to it keeps the behaviour."""
    nprocs = bound_arguments(spawn, SPAWN_POSITIONS).get("nprocs")
    if isinstance(nprocs, cst.Call):
        return bool(rule.qualified_names(nprocs.func) & GPU_COUNTS)
    if not isinstance(nprocs, cst.Name):
        return False
    return any(
        isinstance(a, cst.Assign)
        and isinstance(a.value, cst.Call)
        and any(isinstance(t.target, cst.Name) and t.target.value == nprocs.value for t in a.targets)
        and bool(rule.qualified_names(a.value.func) & GPU_COUNTS)
        for a in rule.analysis.nodes.assigns
    )


def launches_one_process_per_chip(rule: Rule) -> bool:
    """Does the module start its workers with `torch_xla.launch` (or a per-GPU `mp.spawn` that becomes it)?"""
    for call in rule.analysis.nodes.calls:
        names = rule.qualified_names(call.func)
        if names & XLA_LAUNCHERS:
            return True
        if "torch.multiprocessing.spawn" in names and spawns_one_process_per_gpu(rule, call):
            return True
    return False


class NcclProcessGroup(Rule):
    code = "XLA223"
    needs = ("nccl",)
    title = '`init_process_group("nccl")` needs GPUs'
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = (
        '`torch.distributed.init_process_group("nccl", ...)` / `backend="nccl"`; a compound backend that gives '
        'CUDA tensors to NCCL (`backend="cuda:nccl,cpu:gloo"`, usually with `device_id=`) is reported.'
    )
    why = (
        "NCCL is the GPU collective library: on a TPU host it fails with `ValueError: ProcessGroupNCCL is only "
        "supported with GPUs, no GPUs found!`. The XLA backend is registered by `import "
        'torch_xla.distributed.xla_backend` and initialised with `init_method="xla://"`, which takes rank and '
        "world size from the XLA runtime (explicit `rank=`/`world_size=` are then ignored). Unsafe: it assumes "
        "processes are started by `torch_xla.launch` (or torchrun) with one process per chip — safe, and applied "
        "by default, where the same module launches them so (`torch_xla.launch`, or `mp.spawn` with one process "
        "per GPU, which XLA225 turns into it)."
    )
    before = 'import torch.distributed as dist\n\ndist.init_process_group("nccl")\n'
    after = (
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n\n"
        'dist.init_process_group("xla", init_method="xla://")\n'
    )
    message = 'NCCL needs GPUs; use the `xla` backend with `init_method="xla://"`'
    symptoms = ("ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",)
    references = ("docs/source/perf/ddp.md", "docs/source/learn/_pjrt.md")
    valid = (
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n"
        "dist.init_process_group('xla', init_method='xla://')\n",
        "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.distributed.init_process_group"):
            return
        args = positional_args(node)
        backend = args[0] if args else keyword_arg(node, "backend")
        name = string_value(backend.value) if backend is not None else None
        if name is not None and name != "nccl" and any(p.split(":")[-1] == "nccl" for p in name.split(",")):
            self.report(node, COMPOUND_MESSAGE.format(backend=name), fix="manual")
            return
        if name != "nccl":
            return
        if keyword_arg(node, "store") is not None or has_star_args(node):
            self.report(node, f"{self.message} (and drop the custom store)")
            return
        new_args = [a.with_changes(value=same_quotes(a.value, "xla")) if a is backend else a for a in node.args]
        new = node.with_changes(args=new_args)
        init = args[1] if len(args) > 1 else keyword_arg(node, "init_method")
        xla_url = same_quotes(backend.value, "xla://")
        if init is None:
            new = add_kwarg(new, "init_method", xla_url)
        else:
            new = new.with_changes(args=[a.with_changes(value=xla_url) if a is init else a for a in new.args])
        certain = "safe" if launches_one_process_per_chip(self) else None
        self.report(node, replacement=new, imports=(("torch_xla.distributed.xla_backend", None, None),), fix=certain)


COMPOUND_MESSAGE = (
    'the compound backend "{backend}" sends CUDA tensors to NCCL, which needs GPUs; on TPU use '
    '`init_process_group("xla", init_method="xla://")` (with `import torch_xla.distributed.xla_backend`) and drop '
    "`device_id=`; collectives on CPU tensors that relied on the gloo part need their own group: "
    '`dist.new_group(backend="gloo")` (not rewritten: which tensors go to which part is the program\'s choice)'
)


DDP_NAMES = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)


class DdpDeviceIds(Rule):
    code = "XLA224"
    needs = ("distributeddataparallel",)
    title = "`DistributedDataParallel(device_ids=[rank])` names GPU indices"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`DistributedDataParallel(model, device_ids=[...], output_device=...)`."
    why = (
        "`device_ids` / `output_device` are CUDA device indices. With the `xla` process group each process drives "
        "exactly one chip and the module is already on `torch_xla.device()`; the PyTorch/XLA DDP recipe "
        "constructs `DDP(model, gradient_as_bucket_view=True)` without them. Dropping them keeps the behaviour."
    )
    before = (
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "model = DDP(model, device_ids=[rank], output_device=rank)\n"
    )
    after = "from torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(model)\n"
    message = "`device_ids`/`output_device` are GPU indices; on XLA use `DDP(model)` (one chip per process)"
    references = ("docs/source/perf/ddp.md", "README v2.9.0 DistributedDataParallel")
    valid = (
        "from torch.nn.parallel import DistributedDataParallel as DDP\nm = DDP(model, gradient_as_bucket_view=True)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & DDP_NAMES:
            return
        args = positional_args(node)
        drop = [a for a in (keyword_arg(node, "device_ids"), keyword_arg(node, "output_device")) if a is not None]
        if len(args) > 3:
            self.report(node, f"{self.message} (positional arguments: rewrite by hand)")
            return
        drop += args[1:]
        if drop:
            self.report(node, replacement=drop_args(node, drop))


class MpSpawn(ScopedRule):
    code = "XLA225"
    needs = ("spawn",)
    title = "`torch.multiprocessing.spawn(fn, nprocs=N)`: launch with `torch_xla.launch`"
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = "`torch.multiprocessing.spawn(fn, args=..., nprocs=N, ...)` (`mp.spawn`)."
    why = (
        "GPU scripts start one process per GPU with `nprocs=torch.cuda.device_count()`, which is 0 on TPU. On XLA "
        "the runtime chooses one process per chip: `torch_xla.launch(fn, args=...)` calls `fn(index, *args)` like "
        "`mp.spawn` does. Unsafe: the index is the global ordinal (same as the local index on one host), and a "
        "world size passed through `args` must be read inside `fn` with `xr.world_size()` instead; do not touch "
        "the XLA device before the launch (`RuntimeError: Runtime is already initialized`). Safe, and applied by "
        "default, when `nprocs` is the GPU count (`torch.cuda.device_count()`, directly or through a variable): "
        "that is exactly one process per device, what `torch_xla.launch` starts."
    )
    before = "import torch.multiprocessing as mp\n\nmp.spawn(train, args=(world_size,), nprocs=world_size, join=True)\n"
    after = "import torch_xla\n\ntorch_xla.launch(train, args=(world_size,))\n"
    message = "`mp.spawn` with a GPU count; use `torch_xla.launch(fn, args=...)` (one process per chip)"
    symptoms = (
        "ValueError: Unsupported nprocs",
        "Runtime is already initialized. Do not use the XLA device before calling xmp.spawn.",
    )
    references = ("torch_xla/torch_xla.py launch", "torch_xla/_internal/pjrt.py spawn", "huggingface/accelerate #2999")
    valid = (
        "import torch_xla\ntorch_xla.launch(train, args=(1,))\n",
        "import torch.multiprocessing as mp\nimport torch.distributed.rpc as rpc\n"
        "def run_role(rank, world):\n    rpc.init_rpc(str(rank), rank=rank, world_size=world)\n"
        "mp.spawn(run_role, args=(3,), nprocs=3, join=True)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.multiprocessing.spawn"):
            return
        if self.facts().uses("torch.distributed.rpc"):
            return  # the processes are RPC roles (parameter server, agent, observers), not one per GPU
        given = bound_arguments(node, SPAWN_POSITIONS)
        join = given.get("join")
        if has_star_args(node) or "fn" not in given:
            self.report(node)
            return
        if join is not None and not is_literal(join, "True"):
            self.report(
                node, f"{self.message}; `torch_xla.launch` always joins: restructure code that runs after `join=False`"
            )
            return
        args = launch_arguments(given)
        call = cst.Call(expr("torch_xla.launch"), with_commas(args))
        certain = "safe" if spawns_one_process_per_gpu(self, node) else None
        self.report(node, replacement=call, imports=(IMPORT_TORCH_XLA,), fix=certain)


# --- hand-written GPU kernels ------------------------------------------------------------
TRITON_DECORATORS = frozenset({"triton.jit", "triton.autotune", "triton.heuristics", "triton.runtime.jit.jit"})
# (`torch.utils.cpp_extension` builds are XLA110's)
CUDA_KERNEL_BUILDERS = frozenset({"torch.cuda._compile_kernel", "cupy.RawKernel", "cupy.RawModule"})
KERNEL_ADVICE = (
    "write the computation with torch ops (XLA fuses them into one kernel) or as a Pallas kernel "
    "(`torch_xla.experimental.custom_kernel`)"
)


class GpuKernels(ScopedRule):
    code = "XLA234"
    needs = ("triton", "_compile_kernel", "rawkernel", "rawmodule")
    title = "Triton and CUDA kernels cannot run on a TPU"
    category = "C2"
    fix = "manual"
    detects = (
        "`@triton.jit` / `@triton.autotune` kernels and their launches (`kernel[grid](...)`), "
        "`torch.cuda._compile_kernel(...)` and CuPy raw kernels (C++/CUDA extensions are XLA110's)."
    )
    why = (
        "Triton compiles for NVIDIA (and AMD) GPUs and `_compile_kernel` builds CUDA source with NVRTC: on a TPU "
        "host there is no driver (`RuntimeError: Found no NVIDIA driver`, or Triton's `0 active drivers`), and "
        "the kernels take pointers to device memory that XLA tensors do not expose. Each kernel has to be "
        "expressed again: most are fused elementwise or reduction code that XLA fuses itself from torch ops."
    )
    before = (
        "import triton\nimport triton.language as tl\n\n\n"
        "@triton.jit\n"
        "def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs), mask=offs < n)\n\n\n"
        "def add(x, y, out):\n"
        "    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)\n"
    )
    message = f"a GPU kernel does not run on a TPU; {KERNEL_ADVICE}"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system", "RuntimeError: 0 active drivers ([])")
    references = ("docs/source/features/pallas.md", "torch_xla/experimental/custom_kernel.py")
    valid = (
        "import torch\n\ndef add(x, y):\n    return x + y\n",
        "table = {}\nrow = table['a']\n",
    )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for decorator in node.decorators:
            target = decorator.decorator
            func = target.func if isinstance(target, cst.Call) else target
            if self.qualified_names(func) & TRITON_DECORATORS:
                self.report(decorator, f"Triton kernel `{node.name.value}` needs a GPU; {KERNEL_ADVICE}")
                return

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func) & CUDA_KERNEL_BUILDERS
        if names:
            self.report(node, f"`{min(names)}` builds a CUDA kernel; {KERNEL_ADVICE}")
            return
        func = node.func
        if isinstance(func, cst.Subscript) and isinstance(func.value, cst.Name) and self._is_triton_kernel(func.value):
            self.report(node, f"launch of the Triton kernel `{func.value.value}`; {KERNEL_ADVICE}")

    def _is_triton_kernel(self, name: cst.Name) -> bool:
        """A top-level function of this module decorated with `@triton.jit` (or autotune)."""
        for stmt in self.analysis.module.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name.value:
                return any(
                    self.qualified_names(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
                    & TRITON_DECORATORS
                    for d in stmt.decorators
                )
        return False
