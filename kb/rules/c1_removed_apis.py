"""C1 — deprecated or removed torch_xla APIs: `xm.xla_device`, `mark_step`, runtime getters, `xmp.spawn`, XLA GradScaler, `pjrt://`."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import (
    bound_arguments,
    call_with,
    code_of,
    expr,
    keyword_arg,
    kwarg,
    launch_arguments,
    module_name,
    positional_args,
    same_quotes,
    string_value,
    whole_statement,
)
from ..rule import IMPORT_TORCH_XLA, IMPORT_XR, REMOVE, Rule

IMPORT_XLA_BACKEND = ("torch_xla.distributed.xla_backend", None, None)


# --- deprecated and removed torch_xla APIs ------------------------------------------
class XlaDeviceDeprecated(Rule):
    code = "XLA101"
    severity = "warning"  # deprecated: it still runs
    needs = ("xla_device",)
    title = "`xm.xla_device()` is deprecated: use `torch_xla.device()`"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = "Calls of `torch_xla.core.xla_model.xla_device(n=None, devkind=None)` in any import spelling."
    why = (
        "torch_xla 2.9 still runs it but warns `DeprecationWarning: Use torch_xla.device instead`; the function "
        "is a thin wrapper that ignores `devkind` and returns `torch_xla.device(n)`, so the rewrite is exact."
    )
    before = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nsecond = xm.xla_device(1)\n"
    after = (
        "import torch_xla.core.xla_model as xm\nimport torch_xla\n\n"
        "device = torch_xla.device()\nsecond = torch_xla.device(1)\n"
    )
    message = "`xm.xla_device()` is deprecated; use `torch_xla.device()`"
    symptoms = ("DeprecationWarning: Use torch_xla.device instead",)
    references = ("torch_xla/core/xla_model.py (v2.9.0) xla_device", "pytorch/xla README v2.9.0 Getting Started")
    valid = ("import torch_xla\ndevice = torch_xla.device()\n", "xla_device = lambda: 0\nxla_device()\n")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch_xla.core.xla_model.xla_device"):
            return
        if any(a.star for a in node.args):
            self.report(node)
            return
        args = positional_args(node)
        index = args[0] if args else keyword_arg(node, "n")
        new_args = [cst.Arg(index.value)] if index is not None else []
        self.report(node, replacement=call_with(node, "torch_xla.device", new_args), imports=(IMPORT_TORCH_XLA,))


class MarkStepDeprecated(Rule):
    code = "XLA102"
    severity = "warning"  # deprecated: it still runs
    needs = ("mark_step",)
    title = "`xm.mark_step()` is deprecated: use `torch_xla.sync()`"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = "Calls of `torch_xla.core.xla_model.mark_step(wait=False, reset_scope=True)`."
    why = (
        "torch_xla 2.9 warns `DeprecationWarning: Use torch_xla.sync instead`. `torch_xla.sync(wait, reset_scope)` "
        "takes the same arguments and cuts the lazy graph the same way."
    )
    before = "import torch_xla.core.xla_model as xm\n\nloss.backward()\nxm.mark_step()\n"
    after = "import torch_xla.core.xla_model as xm\nimport torch_xla\n\nloss.backward()\ntorch_xla.sync()\n"
    message = "`xm.mark_step()` is deprecated; use `torch_xla.sync()`"
    symptoms = ("DeprecationWarning: Use torch_xla.sync instead",)
    references = ("torch_xla/core/xla_model.py (v2.9.0) mark_step", "torch_xla/torch_xla.py sync")
    valid = ("import torch_xla\ntorch_xla.sync()\n", "import torch_xla.core.xla_model as xm\nstep = xm.mark_step\n")

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch_xla.core.xla_model.mark_step"):
            self.report(
                node, replacement=call_with(node, "torch_xla.sync", list(node.args)), imports=(IMPORT_TORCH_XLA,)
            )


REMOVED_GETTERS = {
    "torch_xla.core.xla_model.xrt_world_size": "xr.world_size()",
    "torch_xla.core.xla_model.get_ordinal": "xr.global_ordinal()",
}


class RemovedRuntimeGetters(Rule):
    code = "XLA103"
    needs = ("torch_xla",)
    title = "`xm.xrt_world_size()` / `xm.get_ordinal()` were removed in 2.7"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = (
        "Calls of `xm.xrt_world_size()` and `xm.get_ordinal()`, and `from torch_xla.core.xla_model import ...` "
        "of those names."
    )
    why = (
        "Both were removed in torch_xla 2.7 (PR #7679): the call raises `AttributeError: module "
        "'torch_xla.core.xla_model' has no attribute 'xrt_world_size'` and the from-import raises ImportError. "
        "`torch_xla.runtime.world_size()` / `global_ordinal()` return the same numbers. "
        "(`xm.get_local_ordinal()` still exists in 2.9.)"
    )
    before = "import torch_xla.core.xla_model as xm\n\nworld = xm.xrt_world_size()\nrank = xm.get_ordinal()\n"
    after = (
        "import torch_xla.core.xla_model as xm\nimport torch_xla.runtime as xr\n\n"
        "world = xr.world_size()\nrank = xr.global_ordinal()\n"
    )
    message = "removed in torch_xla 2.7; use `torch_xla.runtime` (`xr.world_size()`, `xr.global_ordinal()`)"
    symptoms = (
        "AttributeError: module 'torch_xla.core.xla_model' has no attribute 'xrt_world_size'",
        "AttributeError: module 'torch_xla.core.xla_model' has no attribute 'get_ordinal'",
        "ImportError: cannot import name 'xrt_world_size' from 'torch_xla.core.xla_model'",
    )
    references = ("pytorch/xla PR #7679", "torch_xla/runtime.py world_size, global_ordinal")
    valid = (
        "import torch_xla.runtime as xr\nn = xr.world_size()\n",
        "import torch_xla.core.xla_model as xm\ni = xm.get_local_ordinal()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        for name in self.qualified_names(node.func) & REMOVED_GETTERS.keys():
            if node.args:
                self.report(node, f"removed in torch_xla 2.7; use `{REMOVED_GETTERS[name]}`")
            else:
                self.report(node, replacement=expr(REMOVED_GETTERS[name]), imports=(IMPORT_XR,))
            return

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if module_name(node.module) != "torch_xla.core.xla_model" or isinstance(node.names, cst.ImportStar):
            return
        kept = [a for a in node.names if module_name(a.name) not in {"xrt_world_size", "get_ordinal"}]
        if len(kept) == len(node.names):
            return
        line = self.parent(node)
        if not kept and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            self.report(line, "import of names removed in torch_xla 2.7", replacement=REMOVE)
        elif kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            self.report(node, "import of names removed in torch_xla 2.7", replacement=node.with_changes(names=kept))
        else:
            self.report(node, "import of names removed in torch_xla 2.7")


# Libraries whose released code still calls the runtime getters torch_xla 2.7 removed: (what it calls, where)
LIBRARIES_CALLING_REMOVED_GETTERS = {
    "ignite": "`xm.xrt_world_size()` and `xm.get_ordinal()` (ignite/distributed/comp_models/xla.py, through 0.5.5)",
}
GETTER_SHIM = "xm.xrt_world_size, xm.get_ordinal = xr.world_size, xr.global_ordinal"


class DependencyCallsRemovedGetters(Rule):
    code = "XLA117"
    needs = ("ignite",)
    title = "A library the program imports calls `xm.xrt_world_size()` / `xm.get_ordinal()`, removed in 2.7"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = (
        "Unguarded imports of a library whose released code still calls the runtime getters torch_xla 2.7 removed "
        "(pytorch-ignite's XLA computation model, through 0.5.5), in a module without the shim."
    )
    why = (
        "Once the program imports torch_xla, pytorch-ignite picks its XLA computation model, which asks "
        "`xm.xrt_world_size()` for the world size (every metric's `compute`, `idist.get_world_size()`, "
        "`auto_dataloader`): the migrated program crashes inside ignite with `AttributeError: module "
        "'torch_xla.core.xla_model' has no attribute 'xrt_world_size'`, although the program's own code is "
        "migrated. A migration cannot change the library; what to do: a release of the library that calls "
        "`torch_xla.runtime` (none yet for ignite), or the two-name shim the fix adds after the import: "
        "`torch_xla.runtime.world_size()` / `global_ordinal()` return the numbers the removed getters returned, "
        "so the library computes the same. Pinning torch_xla below 2.7 gives up the 2.9 target."
    )
    before = "import torch\nfrom ignite.engine import create_supervised_trainer\n"
    after = (
        "import torch\nfrom ignite.engine import create_supervised_trainer\n"
        "import torch_xla.core.xla_model as xm\nimport torch_xla.runtime as xr\n\n"
        f"{GETTER_SHIM}  # `ignite` calls the getters torch_xla 2.7 removed (XLA117)\n"
    )
    message = "this library calls runtime getters torch_xla 2.7 removed; the shim maps them to `torch_xla.runtime`"
    symptoms = (
        "AttributeError: module 'torch_xla.core.xla_model' has no attribute 'xrt_world_size'",
        "AttributeError: module 'torch_xla.core.xla_model' has no attribute 'get_ordinal'",
    )
    references = ("pytorch/xla PR #7679", "pytorch-ignite ignite/distributed/comp_models/xla.py")
    valid = (
        "import torch\n",
        "try:\n    import ignite\nexcept ImportError:\n    ignite = None\n",
        f"import ignite\nimport torch_xla.core.xla_model as xm\nimport torch_xla.runtime as xr\n{GETTER_SHIM}\n",
    )

    def visit_Module(self, node: cst.Module) -> None:
        assigns = [a for a in self.analysis.nodes.assigns if isinstance(a, cst.Assign)]
        if any("xrt_world_size" in code_of(t.target) for a in assigns for t in a.targets):
            return  # the shim is there already
        body = list(node.body)
        found = next(((i, lib) for i, s in enumerate(body) if (lib := self._library_imported(s)) is not None), None)
        if found is None:
            return
        index, library = found
        where = body[index]
        while index + 1 < len(body) and self._is_import(body[index + 1]):
            index += 1  # after the import block the library's import is in: the shim needs the torch_xla imports
        shim = [
            cst.parse_statement("import torch_xla.core.xla_model as xm\n"),
            cst.parse_statement("import torch_xla.runtime as xr\n"),
            cst.parse_statement(
                f"{GETTER_SHIM}  # `{library}` calls the getters torch_xla 2.7 removed (XLA117)\n"
            ).with_changes(leading_lines=[cst.EmptyLine()]),
        ]
        what = LIBRARIES_CALLING_REMOVED_GETTERS[library]
        self.report(
            where,
            f"`{library}` calls {what}, removed in torch_xla 2.7: the migrated program crashes inside it; "
            "the shim maps them to `torch_xla.runtime` (the same numbers)",
            replacement=cst.FlattenSentinel([body[index], *shim]),
            target=body[index],
        )

    @staticmethod
    def _is_import(stmt: cst.CSTNode) -> bool:
        return isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
        )

    def _library_imported(self, stmt: cst.CSTNode) -> str | None:
        if not isinstance(stmt, cst.SimpleStatementLine):
            return None
        for small in stmt.body:
            if isinstance(small, cst.Import):
                modules = [module_name(a.name) for a in small.names]
            elif isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
                modules = [module_name(small.module)]
            else:
                continue
            for module in modules:
                if module.split(".")[0] in LIBRARIES_CALLING_REMOVED_GETTERS:
                    return module.split(".")[0]
        return None


# SPMD left `torch_xla.experimental` (2.3): the same modules, moved; the old paths raise ModuleNotFoundError in 2.9
MOVED_MODULES = {
    "torch_xla.experimental.xla_sharding": "torch_xla.distributed.spmd.xla_sharding",
    "torch_xla.experimental.xla_sharded_tensor": "torch_xla.distributed.spmd.xla_sharded_tensor",
}


class MovedSpmdModules(Rule):
    code = "XLA118"
    needs = ("xla_shard",)
    title = "`torch_xla.experimental.xla_sharding` moved to `torch_xla.distributed.spmd`"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = (
        "Imports of `torch_xla.experimental.xla_sharding` and `torch_xla.experimental.xla_sharded_tensor` "
        "(`import ... as xs`, `from ... import Mesh`, `from torch_xla.experimental import xla_sharding`)."
    )
    why = (
        "SPMD moved out of `torch_xla.experimental` in 2.3: the same modules now live in "
        "`torch_xla.distributed.spmd` (`xla_sharding.py`, `xla_sharded_tensor.py`), and torch_xla 2.9 has no "
        "module at the old path (`ModuleNotFoundError`). The fix imports the moved module under the same name, "
        "so every use (`xs.Mesh`, `xs.mark_sharding`) runs the same code. A plain `import` of the old dotted "
        "path used as a whole name in the code is reported without a rewrite."
    )
    before = "import torch_xla.experimental.xla_sharding as xs\nfrom torch_xla.experimental.xla_sharding import Mesh\n"
    after = "import torch_xla.distributed.spmd.xla_sharding as xs\nfrom torch_xla.distributed.spmd.xla_sharding import Mesh\n"
    message = "moved in torch_xla 2.3: import it from `torch_xla.distributed.spmd`"
    symptoms = (
        "ModuleNotFoundError: No module named 'torch_xla.experimental.xla_sharding'",
        "ModuleNotFoundError: No module named 'torch_xla.experimental.xla_sharded_tensor'",
    )
    references = ("torch_xla/distributed/spmd/__init__.py (v2.9.0)", "pytorch/xla docs: SPMD user guide")
    valid = (
        "import torch_xla.distributed.spmd as xs\n",
        "from torch_xla.distributed.spmd import Mesh\n",
        "import torch_xla.experimental.pjrt_backend\n",
    )

    def visit_Import(self, node: cst.Import) -> None:
        names = [module_name(a.name) for a in node.names]
        if not any(n in MOVED_MODULES for n in names):
            return
        if any(n in MOVED_MODULES and a.asname is None for n, a in zip(names, node.names, strict=True)):
            self.report(node)  # `import torch_xla.experimental.xla_sharding`: its uses spell the old path
            return
        aliases = [
            a.with_changes(name=expr(MOVED_MODULES[n])) if n in MOVED_MODULES else a
            for n, a in zip(names, node.names, strict=True)
        ]
        self.report(node, replacement=node.with_changes(names=aliases))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return
        module = module_name(node.module)
        if module in MOVED_MODULES:
            self.report(node, replacement=node.with_changes(module=expr(MOVED_MODULES[module])))
        elif module == "torch_xla.experimental" and not isinstance(node.names, cst.ImportStar):
            moved = [a for a in node.names if f"{module}.{module_name(a.name)}" in MOVED_MODULES]
            if moved and len(moved) == len(node.names):
                self.report(node, replacement=node.with_changes(module=expr("torch_xla.distributed.spmd")))
            elif moved:
                self.report(node)  # moved and unmoved names in one import: split it by hand


class XmpSpawn(Rule):
    code = "XLA104"
    needs = ("xla_multiprocessing",)
    title = "`xmp.spawn(fn, nprocs=N)`: use `torch_xla.launch(fn, args=...)`"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = "Calls of `torch_xla.distributed.xla_multiprocessing.spawn` used as a statement."
    why = (
        "Under PJRT, `nprocs` may only be 1 or None: any other value raises `ValueError: Unsupported nprocs (8). "
        "Please use nprocs=1 or None (default).` — one process per chip is chosen by the runtime. "
        "`torch_xla.launch(fn, args, start_method, debug_single_process)` is the 2.x entry point: it calls the "
        "same spawn (nprocs=None, or 1 with `debug_single_process=True`), and under torchrun it calls `fn` directly "
        "instead of spawning again. `join`/`daemon` were already ignored. Calls with another `nprocs` are reported "
        "without a rewrite: drop `nprocs` and limit chips with `TPU_VISIBLE_CHIPS` / `TPU_NUM_DEVICES`."
    )
    before = "import torch_xla.distributed.xla_multiprocessing as xmp\n\nxmp.spawn(_mp_fn, args=(flags,), nprocs=1)\n"
    after = (
        "import torch_xla.distributed.xla_multiprocessing as xmp\nimport torch_xla\n\n"
        "torch_xla.launch(_mp_fn, args=(flags,), debug_single_process=True)\n"
    )
    message = "`xmp.spawn` is the old launcher; use `torch_xla.launch(fn, args=...)`"
    symptoms = (
        "ValueError: Unsupported nprocs (8). Please use nprocs=1 or None (default). If None, spawn will use all "
        "available devices. Use the environment variable X_NUM_DEVICES (where X is CPU, TPU, NEURONCORE, etc) to "
        "limit the number of devices used.",
    )
    references = ("torch_xla/_internal/pjrt.py spawn", "torch_xla/torch_xla.py launch", "huggingface/accelerate #2999")
    valid = (
        "import torch_xla\ntorch_xla.launch(_mp_fn, args=())\n",
        "import torch.multiprocessing as mp\nmp.spawn(f)\n",
    )

    POSITIONS = ("fn", "args", "nprocs", "join", "daemon", "start_method")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch_xla.distributed.xla_multiprocessing.spawn"):
            return
        if any(a.star for a in node.args) or whole_statement(self, node) is None:
            self.report(node)
            return
        given = bound_arguments(node, self.POSITIONS)
        nprocs = given.get("nprocs")
        nprocs_text = code_of(nprocs) if nprocs is not None else "None"
        if nprocs_text not in {"None", "1"}:
            self.report(
                node,
                f"`nprocs={nprocs_text}` raises ValueError under PJRT (only 1 or None); use "
                "`torch_xla.launch(fn, args=...)` (one process per chip) and limit chips with TPU_VISIBLE_CHIPS",
            )
            return
        args = launch_arguments(given)
        if nprocs_text == "1":
            args.append(kwarg("debug_single_process", expr("True")))
        self.report(node, replacement=call_with(node, "torch_xla.launch", args), imports=(IMPORT_TORCH_XLA,))


class XlaGradScalerRemoved(Rule):
    code = "XLA105"
    needs = ("torch_xla",)
    title = "`torch_xla.amp.GradScaler` was removed in 2.9"
    category = "C1"
    fix = "manual"
    detects = (
        "`from torch_xla.amp import GradScaler`, `torch_xla.amp.grad_scaler` imports, `torch_xla.amp.GradScaler(...)`."
    )
    why = (
        "The scaler belonged to XLA:GPU, which torch_xla 2.9 removed with all CUDA support (#9608, #9597, #9540): "
        "the import fails with `ImportError: cannot import name 'GradScaler' from 'torch_xla.amp'`. "
        "On TPU use bf16 (`torch.autocast('xla', dtype=torch.bfloat16)`), which needs no loss scaling: "
        "`loss.backward()` and `xm.optimizer_step(optimizer)` instead of `scaler.scale/step/update`."
    )
    before = "from torch_xla.amp import GradScaler\n\nscaler = GradScaler()\n"
    message = (
        "`torch_xla.amp.GradScaler` no longer exists (XLA:GPU removed in 2.9); use bf16 without a scaler: "
        "`loss.backward(); xm.optimizer_step(opt)`"
    )
    symptoms = (
        "ImportError: cannot import name 'GradScaler' from 'torch_xla.amp'",
        "ModuleNotFoundError: No module named 'torch_xla.amp.grad_scaler'",
    )
    references = ("pytorch/xla commits #9608 #9597 #9540 (v2.8 -> v2.9)", "docs/source/perf/amp.md")
    valid = ("from torch_xla.amp import autocast\n", "from torch.amp import GradScaler\n")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = module_name(node.module)
        if module == "torch_xla.amp.grad_scaler":
            self.report(node)
        elif module == "torch_xla.amp" and not isinstance(node.names, cst.ImportStar):
            if any(module_name(a.name) in {"GradScaler", "grad_scaler"} for a in node.names):
                self.report(node)

    def visit_Import(self, node: cst.Import) -> None:
        if any(module_name(a.name) == "torch_xla.amp.grad_scaler" for a in node.names):
            self.report(node)

    def visit_Call(self, node: cst.Call) -> None:
        # from-imported names are reported at the import; here only `torch_xla.amp.GradScaler(...)`
        if isinstance(node.func, cst.Attribute) and self.is_call_to(
            node, "torch_xla.amp.GradScaler", "torch_xla.amp.grad_scaler.GradScaler"
        ):
            self.report(node)


class PjrtInitMethod(Rule):
    code = "XLA113"
    needs = ("pjrt",)
    title = "`init_method='pjrt://'` and `torch_xla.experimental.pjrt` are the pre-2.1 names"
    category = "C1"
    fix = "safe"
    autofix = True
    detects = (
        "`init_process_group(..., init_method='pjrt://')` (rewritten to `xla://`) and imports of the removed "
        "module `torch_xla.experimental.pjrt` (reported)."
    )
    why = (
        "PJRT's rendezvous was renamed `xla://` in 2.1. `pjrt://` is only registered by the legacy "
        "`torch_xla.experimental.pjrt_backend` import, otherwise `RuntimeError: No rendezvous handler for pjrt://`; "
        "both names use the same handler, which `import torch_xla.distributed.xla_backend` registers. "
        "`torch_xla.experimental.pjrt` is gone (`ModuleNotFoundError`); its functions live in `torch_xla.runtime`."
    )
    before = "import torch.distributed as dist\n\ndist.init_process_group('xla', init_method='pjrt://')\n"
    after = (
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n\n"
        "dist.init_process_group('xla', init_method='xla://')\n"
    )
    message = "`pjrt://` is the old name of the `xla://` rendezvous"
    symptoms = (
        "RuntimeError: No rendezvous handler for pjrt://",
        "ModuleNotFoundError: No module named 'torch_xla.experimental.pjrt'",
    )
    references = ("docs/source/learn/_pjrt.md", "torch_xla/distributed/xla_backend.py")
    valid = (
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n"
        "dist.init_process_group('xla', init_method='xla://')\n",
        "import torch_xla.experimental.pjrt_backend\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.distributed.init_process_group"):
            return
        method = keyword_arg(node, "init_method")
        if method is not None and isinstance(method.value, cst.SimpleString):
            value = string_value(method.value)
            if value is not None and value.startswith("pjrt://"):
                new = same_quotes(method.value, "xla://" + value[len("pjrt://") :])
                self.report(method.value, replacement=new, imports=(IMPORT_XLA_BACKEND,))

    def visit_Import(self, node: cst.Import) -> None:
        if any(module_name(a.name) == "torch_xla.experimental.pjrt" for a in node.names):
            self.report(node, "`torch_xla.experimental.pjrt` was removed; use `torch_xla.runtime`")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = module_name(node.module)
        pulls_pjrt = (
            module == "torch_xla.experimental"
            and not isinstance(node.names, cst.ImportStar)
            and any(module_name(a.name) == "pjrt" for a in node.names)
        )
        if module == "torch_xla.experimental.pjrt" or pulls_pjrt:
            self.report(node, "`torch_xla.experimental.pjrt` was removed; use `torch_xla.runtime`")
