"""C2 — seeding: the XLA generator needs its own seed; CUDA seeds do nothing on TPU."""

from __future__ import annotations

import libcst as cst

from ..analysis.guards import guarded_by_cuda
from ..cst_helpers import block_of, calls_in, expr, find_nodes, keyword_arg, positional_args, whole_statement
from ..rule import IMPORT_TORCH_XLA, REMOVE, Rule
from ..scoped_rule import ScopedRule

# --- seeding ---------------------------------------------------------------------------
TORCH_SEEDS = frozenset({"torch.manual_seed", "torch.random.manual_seed"})
CUDA_SEEDS = frozenset(
    {
        "torch.cuda.manual_seed",
        "torch.cuda.manual_seed_all",
        "torch.cuda.random.manual_seed",
        "torch.cuda.random.manual_seed_all",
    }
)


# Calls that already seed the XLA generator (accelerate's set_seed calls xm.set_rng_state).
XLA_SEEDS = frozenset(
    {
        "torch_xla.manual_seed",
        "torch_xla.torch_xla.manual_seed",
        "torch_xla.core.xla_model.set_rng_state",
        "accelerate.utils.set_seed",
        "accelerate.utils.random.set_seed",
    }
)


def seed_argument(call: cst.Call) -> cst.BaseExpression | None:
    args = positional_args(call)
    if args:
        return args[0].value
    kw = keyword_arg(call, "seed")
    return kw.value if kw is not None else None


class AddXlaSeed(ScopedRule):
    """Shared detector: a seeding call that leaves the XLA generator unseeded gets `torch_xla.manual_seed` after it."""

    seeds: frozenset[str] = TORCH_SEEDS
    # Calls in the same block that mean "nothing to add here" (XLA207 turns CUDA seeds into XLA seeds).
    already_seeded: frozenset[str] = XLA_SEEDS | CUDA_SEEDS

    def _seeds_xla(self, call: cst.Call) -> bool:
        """Does `call` seed the XLA generator once migrated? A CUDA seed under `if torch.cuda.is_available():`
        (a `set_seed` helper's CUDA-only housekeeping) does not: XLA207 leaves that branch alone, and on TPU it
        never runs."""
        if self.qualified_names(call.func) & CUDA_SEEDS:
            return not guarded_by_cuda(self, call, quiet_only=True)
        return True

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & self.seeds or self.facts().cpu_script:
            return  # a script that never names a device has no XLA generator to seed
        stmt = self.statement_of(node)
        block = block_of(self, stmt) if stmt is not None else None
        if block is not None and any(
            self._seeds_xla(c) for s in block.body for c in calls_in(self, s, self.already_seeded)
        ):
            return  # seeded here already, or XLA207 turns the CUDA seed into the XLA one
        seed = seed_argument(node)
        line = whole_statement(self, node)
        if seed is None or line is None or find_nodes(seed, cst.Call):
            self.report(node, f"{self.message}: add `torch_xla.manual_seed(seed)` next to it")
            return
        xla_seed = cst.SimpleStatementLine(body=[cst.Expr(cst.Call(expr("torch_xla.manual_seed"), [cst.Arg(seed)]))])
        self.report(line, replacement=cst.FlattenSentinel([line, xla_seed]), imports=(IMPORT_TORCH_XLA,))


class TorchSeedOnly(AddXlaSeed):
    code = "XLA206"
    needs = ("manual_seed",)
    title = "`torch.manual_seed()` does not seed the XLA generator"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.manual_seed(s)` with no `torch_xla.manual_seed` / `xm.set_rng_state` / `torch.cuda.manual_seed*` "
        "call in the same block."
    )
    why = (
        "XLA tensors draw random numbers from the XLA device generator, which `torch.manual_seed` leaves alone: "
        "dropout masks, `torch.randn(..., device=dev)` and random init on the device change from run to run, "
        "so a 'seeded' TPU run is not reproducible and cannot be compared with its reference (no error). "
        "Adding `torch_xla.manual_seed(s)` right after keeps the CPU seeding and seeds the device too."
    )
    before = "import torch\n\ntorch.manual_seed(42)\n"
    after = "import torch\nimport torch_xla\n\ntorch.manual_seed(42)\ntorch_xla.manual_seed(42)\n"
    message = "`torch.manual_seed` does not seed the XLA RNG; also call `torch_xla.manual_seed(seed)`"
    symptoms = ("rand differs across runs despite torch.manual_seed", "non-deterministic dropout on TPU")
    references = ("pytorch/xla #2092", "pytorch/xla PR #7340 (torch_xla.manual_seed)")
    valid = (
        "import torch\nimport torch_xla\ntorch.manual_seed(0)\ntorch_xla.manual_seed(0)\n",
        "import torch\nimport torch_xla.core.xla_model as xm\ndef seed(s):\n    torch.manual_seed(s)\n    xm.set_rng_state(s)\n",
        "from accelerate.utils import set_seed\nimport torch\ntorch.manual_seed(1)\nset_seed(1)\n",
    )


class CudaSeed(Rule):
    code = "XLA207"
    needs = ("cuda",)
    title = "`torch.cuda.manual_seed(_all)()` is a silent no-op on TPU"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.cuda.manual_seed(s)` and `torch.cuda.manual_seed_all(s)`."
    why = (
        "Without a GPU the call only queues a seed for a CUDA generator that never exists: nothing is seeded, no "
        "error, and device-side randomness (dropout, random init on the device) differs between runs. "
        "The device generator on TPU is seeded by `torch_xla.manual_seed(s)`."
    )
    before = "import torch\n\ntorch.manual_seed(0)\ntorch.cuda.manual_seed_all(0)\n"
    after = "import torch\nimport torch_xla\n\ntorch.manual_seed(0)\ntorch_xla.manual_seed(0)\n"
    message = "`torch.cuda.manual_seed*` seeds nothing on TPU; use `torch_xla.manual_seed(seed)`"
    symptoms = ("rand differs across runs despite torch.cuda.manual_seed_all",)
    references = ("pytorch/xla #2092", "pytorch/xla PR #7340")
    valid = ("import torch_xla\ntorch_xla.manual_seed(0)\n", "import torch\ntorch.manual_seed(0)\n")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & CUDA_SEEDS:
            return
        line = whole_statement(self, node)
        block = block_of(self, line) if line is not None else None
        if line is None or block is None:
            self.report(
                node, replacement=node.with_changes(func=expr("torch_xla.manual_seed")), imports=(IMPORT_TORCH_XLA,)
            )
            return
        # One seed per block: the first CUDA seed becomes the XLA seed, later ones (or all, when the block
        # already seeds XLA) go away.
        seeds = [s for s in block.body if isinstance(s, cst.SimpleStatementLine) and calls_in(self, s, CUDA_SEEDS)]
        seeded = any(calls_in(self, s, XLA_SEEDS) for s in block.body)
        if seeded or seeds[0] is not line:
            self.report(line, "the XLA generator is already seeded in this block; drop this CUDA seed", REMOVE)
        else:
            self.report(
                node, replacement=node.with_changes(func=expr("torch_xla.manual_seed")), imports=(IMPORT_TORCH_XLA,)
            )
