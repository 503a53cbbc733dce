"""C6 — memory capacity: CUDA allocator introspection and controls, capacity checks, OOM handling, host RAM."""

from __future__ import annotations

import libcst as cst

from xlaport.targets import TARGETS

from ..analysis.guards import guarded_by_cuda
from ..cst_helpers import DATALOADERS, keyword_arg
from ..rule import Rule
from ..scoped_rule import ScopedRule
from .c4_barriers import MULTIPROCESS_SIGNALS

HBM_OOM = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
    "Used 21.95G of 15.48G hbm."
)


def cuda_names(*names: str) -> set[str]:
    """`torch.cuda.X` and its `torch.cuda.memory.X` spelling."""
    return {f"torch.cuda.{n}" for n in names} | {f"torch.cuda.memory.{n}" for n in names}


MEMORY_READERS = {
    "memory_allocated": "`xm.get_memory_info(dev)['bytes_used']`",
    "max_memory_allocated": "`xm.get_memory_info(dev)['peak_bytes_used']`",
    "memory_reserved": "`xm.get_memory_info(dev)['bytes_used']`",
    "max_memory_reserved": "`xm.get_memory_info(dev)['peak_bytes_used']`",
    "memory_cached": "`xm.get_memory_info(dev)['bytes_used']`",
    "max_memory_cached": "`xm.get_memory_info(dev)['peak_bytes_used']`",
    "memory_stats": "`xm.get_memory_info(dev)`",
    "memory_summary": "`xm.get_memory_info(dev)`",
    "memory_snapshot": "`PT_XLA_DEBUG_LEVEL=1` (post-compilation memory analysis) or the TPU profiler",
    "mem_get_info": "`xm.get_memory_info(dev)` (`bytes_limit - bytes_used` is the free HBM)",
    "list_gpu_processes": "the `tpu-info` CLI",
    "_record_memory_history": "`PT_XLA_DEBUG_LEVEL=1` (post-compilation memory analysis) or the TPU profiler",
    "_dump_snapshot": "`PT_XLA_DEBUG_LEVEL=1` (post-compilation memory analysis) or the TPU profiler",
}
# readers of the GPU through NVML (pynvml): a TPU host has neither, so they raise
NVML_READERS = {
    "memory_usage": "the `tpu-info` CLI",
    "utilization": "the `tpu-info` CLI",
}
MEMORY_READER_NAMES = frozenset(cuda_names(*MEMORY_READERS, *NVML_READERS))


class CudaMemoryStats(Rule):
    code = "XLA601"
    needs = ("cuda",)
    title = "CUDA memory statistics read 0 (or raise) on TPU"
    category = "C6"
    fix = "manual"
    detects = (
        "`torch.cuda.memory_allocated`, `max_memory_allocated`, `memory_reserved`, `max_memory_reserved`, "
        "`memory_stats`, `memory_summary`, `mem_get_info`, memory snapshots and `list_gpu_processes`; the NVML "
        "readers `torch.cuda.memory_usage()` and `torch.cuda.utilization()`."
    )
    why = (
        "They read the CUDA caching allocator, which a TPU run never uses: `memory_allocated()` and "
        "`max_memory_allocated()` silently return 0 and `memory_stats()` an empty dict, so memory logs and "
        "batch-size heuristics are wrong without an error; `memory_summary()` raises "
        "`KeyError: 'allocated_bytes.all.current'` and `mem_get_info()` raises `Found no NVIDIA driver`. "
        "On XLA use `xm.get_memory_info(dev)` -> `{'bytes_used', 'bytes_limit', 'peak_bytes_used'}` (TPU only: on "
        "PJRT CPU it raises `UNIMPLEMENTED: GetAllocatorStats is not supported`; the old `kb_free`/`kb_total` keys "
        "are gone), or `PT_XLA_DEBUG_LEVEL=1`, which prints each compiled graph's memory sizes. "
        "`memory_usage()` and `utilization()` ask NVML (pynvml) about the GPU and raise without one; `tpu-info` "
        "shows a TPU's memory and duty cycle."
    )
    before = "import torch\n\npeak_gb = torch.cuda.max_memory_allocated() / 2**30\n"
    message = "CUDA allocator statistic: 0 or an error on TPU; use `xm.get_memory_info(dev)`"
    symptoms = (
        "torch.cuda.max_memory_allocated() returns 0",
        "KeyError: 'allocated_bytes.all.current'",
        "RuntimeError: Bad StatusOr access: UNIMPLEMENTED: GetAllocatorStats is not supported",
        "KeyError: 'kb_free'",
        "ModuleNotFoundError: pynvml does not seem to be installed or it can't be imported.",
        "Post Compilation Analysis: Graph input size",
    )
    references = (
        "torch_xla/core/xla_model.py get_memory_info",
        "pytorch/xla #5968",
        "pytorch/xla PR #7086",
        "docs/source/learn/troubleshoot.md",
    )
    valid = (
        "import torch_xla.core.xla_model as xm\ninfo = xm.get_memory_info(dev)\n",
        "import torch\nn = torch.cuda.device_count()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if not names & MEMORY_READER_NAMES or guarded_by_cuda(self, node, quiet_only=True):
            return  # (guarded: CUDA memory logging that a TPU host never runs)
        for short, advice in MEMORY_READERS.items():
            if names & cuda_names(short):
                self.report(
                    node, f"`torch.cuda.{short}()` reads the CUDA allocator (0 or an error on TPU); use {advice}"
                )
                return
        for short, advice in NVML_READERS.items():
            if names & cuda_names(short):
                self.report(node, f"`torch.cuda.{short}()` asks NVML about the GPU (it raises on TPU); use {advice}")
                return


class _RemoveCudaCall(Rule):
    """Deletes statements that only call one of `names` (CUDA allocator controls with no XLA meaning)."""

    names: frozenset[str] = frozenset()

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & self.names:
            return
        self.report_removal(node)


class CudaEmptyCache(_RemoveCudaCall):
    code = "XLA602"
    targets = TARGETS  # detection, message and fix hold on TorchTPU too
    severity = "note"  # a no-op on TPU
    needs = ("cuda",)
    title = "`torch.cuda.empty_cache()` frees nothing on TPU"
    category = "C6"
    fix = "safe"
    autofix = True
    detects = "`torch.cuda.empty_cache()` used as a statement (other uses are reported)."
    why = (
        "It releases cached blocks of the CUDA caching allocator; a TPU run has none, so the call is a silent "
        "no-op and does not relieve HBM pressure (XLA plans device memory when it compiles the graph; running out "
        f"shows up at compile time as `{HBM_OOM}`). Deleting it keeps the program's meaning."
    )
    before = "import torch\n\ndel activations\ntorch.cuda.empty_cache()\n"
    after = "\ndel activations\n"
    message = "`torch.cuda.empty_cache()` does nothing on TPU; remove it"
    symptoms = ("torch.cuda.empty_cache() has no effect",)
    references = ("xla_migration_facts C2: no-op cudnn/cuda flags",)
    valid = ("import gc\ngc.collect()\n",)
    names = frozenset(cuda_names("empty_cache"))


class CudaMemoryFraction(_RemoveCudaCall):
    code = "XLA603"
    targets = TARGETS  # detection, message and fix hold on TorchTPU too
    severity = "error"  # raises without a GPU
    needs = ("cuda",)
    title = "`torch.cuda.set_per_process_memory_fraction()` raises without a GPU"
    category = "C6"
    fix = "safe"
    autofix = True
    detects = "`torch.cuda.set_per_process_memory_fraction(f)` used as a statement (other uses are reported)."
    why = (
        "It initialises CUDA, so on a TPU host it raises `RuntimeError: Found no NVIDIA driver on your system`. "
        "There is no per-process HBM fraction for XLA: the compiled program's size decides, and a too-large "
        f"graph fails at compile time with `{HBM_OOM}` (v5e has 16 GB HBM per chip). Removing the call keeps "
        "the intent that matters on TPU; shrink the per-chip batch or shard (FSDPv2 / SPMD) to fit."
    )
    before = "import torch\n\ntorch.cuda.set_per_process_memory_fraction(0.9)\ntrain()\n"
    after = "\ntrain()\n"
    message = "no per-process memory fraction on TPU (and it raises without a GPU); remove it"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system", "Ran out of memory in memory space hbm")
    references = ("cloud.google.com/tpu/docs/v5e", "docs/source/perf/fsdp_spmd.md")
    names = frozenset(cuda_names("set_per_process_memory_fraction"))


class CudaResetPeakStats(_RemoveCudaCall):
    code = "XLA604"
    targets = TARGETS  # detection, message and fix hold on TorchTPU too
    severity = "error"  # raises without a GPU
    needs = ("cuda",)
    title = "`torch.cuda.reset_peak_memory_stats()` raises without a GPU"
    category = "C6"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.cuda.reset_peak_memory_stats()`, `reset_max_memory_allocated()`, `reset_max_memory_cached()` and "
        "`reset_accumulated_memory_stats()` used as statements (other uses are reported)."
    )
    why = (
        "On a host without a CUDA device torch 2.9 raises `RuntimeError: invalid argument to "
        "reset_peak_memory_stats` — the peak it resets would read 0 on TPU anyway (see XLA601). Deleting the "
        "call changes nothing else; XLA's peak is `xm.get_memory_info(dev)['peak_bytes_used']`."
    )
    before = "import torch\n\ntorch.cuda.reset_peak_memory_stats()\nstep()\n"
    after = "\nstep()\n"
    message = "resetting CUDA peak stats raises without a GPU; remove it"
    symptoms = ("RuntimeError: invalid argument to reset_peak_memory_stats",)
    references = ("torch_xla/core/xla_model.py get_memory_info",)
    names = frozenset(
        cuda_names(
            "reset_peak_memory_stats",
            "reset_max_memory_allocated",
            "reset_max_memory_cached",
            "reset_accumulated_memory_stats",
        )
    )


class CudaCapacityCheck(Rule):
    code = "XLA605"
    needs = ("cuda",)
    title = "GPU capacity check with `torch.cuda.get_device_properties()`"
    category = "C6"
    fix = "manual"
    detects = "Calls of `torch.cuda.get_device_properties(...)` (e.g. `.total_memory` to size batches)."
    why = (
        "It raises `RuntimeError: Found no NVIDIA driver on your system` on a TPU host. Sizing logic written for "
        "40-80 GB GPUs does not transfer: a v5e chip has 16 GB HBM, and an XLA program that does not fit fails "
        f"when the step graph is compiled (`{HBM_OOM}`), not at the allocation. Size per chip: "
        "`xm.get_memory_info(dev)['bytes_limit']` on TPU, or a fixed per-chip batch, bf16, "
        "`torch_xla.utils.checkpoint`, FSDPv2/SPMD sharding."
    )
    before = "import torch\n\ntotal = torch.cuda.get_device_properties(0).total_memory\n"
    message = (
        "GPU properties raise on TPU; size batches per chip (v5e: 16 GB HBM), "
        "`xm.get_memory_info(dev)['bytes_limit']` on TPU"
    )
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system", HBM_OOM)
    references = ("cloud.google.com/tpu/docs/v5e", "docs/source/perf/fsdp_spmd.md", "LargeWorldModel/LWM #60")
    valid = ("import torch\nname = torch.cuda.is_available()\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.cuda.get_device_properties") or guarded_by_cuda(self, node, True):
            return  # (guarded: CUDA-only setup that a TPU host never reaches)
        parent = self.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr.value == "total_memory":
            self.report(
                node,
                "GPU memory size check: raises on TPU, and a v5e chip has 16 GB HBM; size per chip "
                "(`xm.get_memory_info(dev)['bytes_limit']` on TPU)",
            )
        else:
            self.report(node)


OOM_ERRORS = {"torch.cuda.OutOfMemoryError", "torch.OutOfMemoryError"}


class CudaOomHandler(Rule):
    code = "XLA606"
    needs = ("outofmemory",)
    title = "`except torch.cuda.OutOfMemoryError` never fires on TPU"
    category = "C6"
    fix = "manual"
    detects = "`except` clauses that catch `torch.cuda.OutOfMemoryError` / `torch.OutOfMemoryError`."
    why = (
        "Retry-with-a-smaller-batch handlers rely on CUDA raising at the allocation. XLA plans memory when it "
        "compiles the graph: the failure is a `RuntimeError` carrying `RESOURCE_EXHAUSTED ... Ran out of memory in "
        "memory space hbm`, raised at compile/execution time (the sync or `.item()`), not where the tensor was "
        "made — the handler is dead code and the run crashes. Size the batch for the chip up front, or catch "
        "RuntimeError around the compiled step and check for `RESOURCE_EXHAUSTED`."
    )
    before = (
        "import torch\n\ntry:\n    loss = step(batch)\nexcept torch.cuda.OutOfMemoryError:\n"
        "    batch = batch[: len(batch) // 2]\n"
    )
    message = "XLA reports OOM as `RuntimeError: RESOURCE_EXHAUSTED ... hbm` at compile time; this handler never runs"
    symptoms = (HBM_OOM, "RuntimeError: RESOURCE_EXHAUSTED", "torch.OutOfMemoryError: CUDA out of memory")
    references = ("cloud.google.com/tpu/docs/v5e", "LargeWorldModel/LWM #60")
    valid = ("try:\n    step()\nexcept RuntimeError as e:\n    handle(e)\n",)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.type is None:
            return
        caught = [e.value for e in node.type.elements] if isinstance(node.type, cst.Tuple) else [node.type]
        for error in caught:
            if self.qualified_names(error) & OOM_ERRORS:
                self.report(error)


MANY_WORKERS = 8


class ManyDataLoaderWorkers(ScopedRule):
    code = "XLA607"
    targets = TARGETS  # detection, message and fix hold on TorchTPU too
    needs = ("num_workers",)
    title = "Many DataLoader workers per process exhaust host RAM on a TPU VM"
    category = "C6"
    fix = "manual"
    detects = (
        f"`DataLoader(..., num_workers=N)` with a literal N >= {MANY_WORKERS} in a program that runs one process "
        "per chip (`torch_xla.launch`, `mp.spawn`, `init_process_group`, a `DistributedSampler`)."
    )
    why = (
        "On TPU the loader runs in every training process (one per chip, started with the `spawn` method, "
        "4-8 per host), and each worker holds its own copy of the dataset object: 8 workers x 8 processes is 64 "
        "copies in host RAM. The result is a host OOM or a VM crash (pytorch/xla #4272, #2723), or a freeze in "
        "multi-core training (#2749). Use a few workers per process (2-4), memory-map the data, and keep large "
        "arrays out of the Dataset's `__init__`."
    )
    before = (
        "from torch.utils.data import DataLoader, DistributedSampler\n\n"
        "loader = DataLoader(ds, batch_size=64, num_workers=16, sampler=DistributedSampler(ds))\n"
    )
    message = "many workers per TPU process multiply host RAM (one loader per chip); use 2-4 and memory-map data"
    symptoms = (
        "Killed (host out of memory)",
        "RuntimeError: DataLoader worker (pid X) is killed by signal: Killed.",
        "ProcessExitedException: process 0 terminated with signal SIGKILL",
    )
    references = ("pytorch/xla #4272", "pytorch/xla #2723", "pytorch/xla #2749")
    valid = (
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=4)\n",
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=args.workers)\n",
        # one process: its workers are not multiplied by the chips
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, num_workers=8)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & DATALOADERS:
            return
        workers = keyword_arg(node, "num_workers")
        if workers is not None and isinstance(workers.value, cst.Integer):
            if int(workers.value.evaluated_value) >= MANY_WORKERS and self.facts().uses(*MULTIPROCESS_SIGNALS):
                self.report(workers.value)
