"""C4 — autoregressive sampling loops that feed a growing sequence back into the model."""

from __future__ import annotations

import libcst as cst

from ..analysis.steps import is_barrier
from ..cst_helpers import expr, method_name, positional_args
from ..cst_walk import walk
from ..rule import IMPORT_TORCH_XLA
from ..step_rule import StepContextRule

LOOPS = (cst.For, cst.While)
CAT = ("torch.cat", "torch.concat")


class GrowingSequenceIntoModel(StepContextRule):
    code = "XLA417"
    needs = ("cat",)
    title = "A sampling loop feeds a sequence that grows every token back into the model: one compile per token"
    category = "C4"
    fix = "manual"
    detects = (
        "A `for`/`while` loop that appends to a tensor with `x = torch.cat((x, new), dim=...)` and calls a model "
        "on `x` (or on a crop of it, `x[:, -n:]`) in the same loop: nanoGPT-style `generate()`, a hand-written "
        "greedy decoder. Hugging Face `generate()` is XLA415's."
    )
    why = (
        "Every iteration hands the model an input one position longer. With a barrier or a host read per token, "
        "XLA traces and compiles a new graph for every length: a 500-token sample costs 500 compilations "
        "(measured with torch_xla 2.9: 10 tokens, 10 compilations). Without one, the whole loop is traced into "
        "a single graph that holds every forward pass, and its compile time grows with the number of tokens "
        "(measured: 5 tokens 1.7 s, 20 tokens 6.2 s, 40 tokens 15.3 s for a 2-layer toy model). No error, just a "
        "generation that seems to hang. Keep the shape fixed: write tokens into a buffer of the final length "
        "(`torch.full((B, T_max), pad)`, `buf[:, t] = tok` with `t` a device tensor or `index_copy_`), run the "
        "model on the whole buffer with a causal mask and read the logits at position `t`, one barrier per "
        "token; or sample on the CPU."
    )
    before = (
        "import torch\n\n"
        "def generate(model, idx, steps):\n"
        "    for _ in range(steps):\n"
        "        logits = model(idx)[:, -1, :]\n"
        "        nxt = torch.argmax(logits, dim=-1, keepdim=True)\n"
        "        idx = torch.cat((idx, nxt), dim=1)\n"
        "    return idx\n"
    )
    message = (
        "the sequence grows by one token per iteration and goes back into the model: XLA compiles a new graph for "
        "every length (or, with no barrier in the loop, one graph of every forward pass); generate into a "
        "fixed-size buffer (pad to the final length, read the logits at the current position) or sample on the CPU"
    )
    symptoms = ("pt-xla-profiler: CompileTime too frequent", "generation recompiles every token")
    references = ("pytorch/xla troubleshoot.md: Known Performance Caveats",)
    valid = (
        "import torch\n"
        "def collect(model, loader):\n"
        "    preds = torch.empty(0)\n"
        "    for x in loader:\n"
        "        preds = torch.cat((preds, model(x)), dim=0)\n"
        "    return preds\n",
        "import torch\n"
        "def generate(model, buf, steps):\n"
        "    for t in range(steps):\n"
        "        logits = model(buf)\n"
        "        buf[:, t] = logits[:, t].argmax(-1)\n"
        "    return buf\n",
    )

    def visit_Assign(self, node: cst.Assign) -> None:
        name = self._appended_name(node)
        loop = self._innermost_loop(node) if name is not None else None
        if name is None or loop is None:
            return
        inside = self.nodes_in(loop.body, enter_functions=False)
        fed = self._holding(inside.assigns, name)
        for call in inside.calls:
            if self._is_model_call(call) and any(_names(arg.value) & fed for arg in call.args):
                self.found(node, loop, inside.calls)
                return

    def found(self, node: cst.Assign, loop: cst.For | cst.While, calls: list[cst.Call]) -> None:
        """`node` appends to a sequence that `loop` feeds back into the model each iteration."""
        self.report(node)

    def _innermost_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        for anc in self.ancestors(node):
            if isinstance(anc, LOOPS):
                return anc
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
        return None

    def _appended_name(self, node: cst.CSTNode) -> str | None:
        """`x` for `x = torch.cat((x, y), dim=1)` / `torch.cat([x, y], 1)`."""
        if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call)):
            return None
        target = node.targets[0].target
        if not isinstance(target, cst.Name) or not self.is_call_to(node.value, *CAT):
            return None
        args = positional_args(node.value)
        parts = args[0].value if args else None
        if not isinstance(parts, (cst.Tuple, cst.List)) or not parts.elements:
            return None
        first = parts.elements[0].value
        return target.value if isinstance(first, cst.Name) and first.value == target.value else None

    def _holding(self, assigns: list[cst.CSTNode], name: str) -> set[str]:
        """`name` and the names assigned from it in the loop (`idx_cond = idx[:, -n:]`)."""
        held = {name}
        for _ in range(2):
            for node in assigns:
                if (
                    isinstance(node, cst.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0].target, cst.Name)
                ):
                    appended = isinstance(node.value, cst.Call) and self.is_call_to(node.value, *CAT)
                    if not appended and _names(node.value) & held:
                        held.add(node.targets[0].target.value)
        return held

    def _is_model_call(self, call: cst.Call) -> bool:
        func = call.func
        if isinstance(func, cst.Name) and func.value == "self":
            return True  # `self(idx_cond)` in a model's own generate()
        key = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""
        return "model" in key.lower() or key in self.facts().nn_keys


def _names(node: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


HOST_READS = frozenset({"item", "tolist", "cpu", "numpy"})  # each one runs the graph traced so far


class SamplingLoopWithoutBarrier(GrowingSequenceIntoModel):
    code = "XLA418"
    title = "A sampling loop without a barrier traces every token's forward pass into one graph"
    category = "C4"
    fix = "safe"
    autofix = True
    detects = (
        "A loop of XLA417 (a growing sequence fed back into the model) with no `torch_xla.sync()` / "
        "`xm.mark_step()` and no host read (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`) in its body. The fix "
        "adds one `torch_xla.sync()` per iteration, after the statement that appends the token."
    )
    why = (
        "Nothing ends the lazy graph inside the loop, so all of it, every token's forward pass, becomes one graph "
        "that is compiled when the result is first read; its compile time and memory grow faster than the number "
        "of tokens (measured on a 2-layer character GPT on XLA:CPU: 40 tokens had not compiled after 380 s, at "
        "7 GB; with the barrier the same 40 tokens took 120 s, one small graph per token). Safe: a barrier only "
        "says where a graph ends; every token is the same. It does not remove the compile per length (XLA417)."
    )
    # `before` is XLA417's sampling loop
    after = (
        "import torch\n"
        "import torch_xla\n\n"
        "def generate(model, idx, steps):\n"
        "    for _ in range(steps):\n"
        "        logits = model(idx)[:, -1, :]\n"
        "        nxt = torch.argmax(logits, dim=-1, keepdim=True)\n"
        "        idx = torch.cat((idx, nxt), dim=1)\n"
        "        torch_xla.sync()\n"
        "    return idx\n"
    )
    message = (
        "no barrier in this sampling loop: every token's forward pass goes into one graph, whose compile time grows "
        "with the tokens; call `torch_xla.sync()` once per token"
    )
    symptoms = ("generation seems to hang", "host memory grows during sampling")
    references = ("pytorch/xla xla-advanced.md: Barriers",)
    valid = (
        "import torch\n"
        "import torch_xla\n"
        "def generate(model, idx, steps):\n"
        "    for _ in range(steps):\n"
        "        nxt = model(idx)[:, -1, :].argmax(-1, keepdim=True)\n"
        "        idx = torch.cat((idx, nxt), dim=1)\n"
        "        torch_xla.sync()\n"
        "    return idx\n",
        "import torch\n"
        "def generate(model, idx, steps):\n"
        "    for _ in range(steps):\n"
        "        nxt = model(idx)[:, -1, :].argmax(-1, keepdim=True)\n"
        "        idx = torch.cat((idx, nxt), dim=1)\n"
        "        if nxt.item() == 0:\n"
        "            break\n"
        "    return idx\n",
    )

    def found(self, node: cst.Assign, loop: cst.For | cst.While, calls: list[cst.Call]) -> None:
        if self.facts().cpu_script:  # a script that names no device samples on the CPU: no lazy graph
            return
        if any(is_barrier(self, c) or method_name(c) in HOST_READS for c in calls):
            return
        # the statement of the loop's own body that holds the append (the append itself, or the `if` around it)
        after = next((a for a in [node, *self.ancestors(node)] if self.parent(a) is loop.body), None)
        if not isinstance(after, cst.BaseStatement):
            return
        sync = cst.SimpleStatementLine(body=[cst.Expr(expr("torch_xla.sync()"))])
        self.report(node, replacement=cst.FlattenSentinel([after, sync]), imports=(IMPORT_TORCH_XLA,), target=after)
