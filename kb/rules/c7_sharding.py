"""C7 — SPMD and FSDP: `XLA_USE_SPMD`, torch FSDP on XLA models."""

from __future__ import annotations

import libcst as cst

from ..analysis.env import EnvWrite
from ..cst_helpers import expr, string_value, whole_statement
from ..env_rule import EnvWriteRule
from ..rule import IMPORT_XR, Rule


class XlaUseSpmdEnv(EnvWriteRule):
    code = "XLA709"
    needs = ("xla_use_spmd",)
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
    after = "import torch_xla.runtime as xr\n\nxr.use_spmd()\n"
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

    def check_write(self, write: EnvWrite) -> None:
        if write.key != "XLA_USE_SPMD" or string_value(write.value) in {"0", "", "false", "False"}:
            return
        node = write.node
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


class TorchFsdpOnXla(Rule):
    code = "XLA710"
    needs = ("fsdp",)
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
    before = "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\nmodel = FSDP(model)\n"
    message = (
        "torch FSDP cannot wrap XLA models; use FSDPv2 "
        "(`torch_xla.experimental.spmd_fully_sharded_data_parallel.SpmdFullyShardedDataParallel`) with SPMD"
    )
    symptoms = ("AttributeError: Device 'xla:0' does not have a corresponding backend registered as 'torch.xla'",)
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
