"""C3 — Hugging Face Trainer / TrainingArguments and accelerate: fp16, fused optimizers, TF32, gradient checkpointing, seeds, clipping."""

from __future__ import annotations

import libcst as cst

from ..analysis.device_facts import argparse_dest
from ..cst_helpers import (
    add_kwarg,
    drop_args,
    find_nodes,
    has_star_args,
    is_literal,
    keyword_arg,
    method_name,
    same_quotes,
    string_value,
)
from ..rule import Rule
from .c2_seeds import CUDA_SEEDS, TORCH_SEEDS, XLA_SEEDS, AddXlaSeed

HF_ROOTS = frozenset({"transformers", "trl"})
TRAINING_ARGS = frozenset(
    {
        "TrainingArguments",
        "Seq2SeqTrainingArguments",
        "SFTConfig",
        "DPOConfig",
        "ORPOConfig",
        "KTOConfig",
        "CPOConfig",
        "GRPOConfig",
        "RewardConfig",
        "PPOConfig",
    }
)


def is_training_args(rule: Rule, call: cst.Call) -> bool:
    """`transformers.TrainingArguments(...)` and the TRL configs that subclass it."""
    return any(
        n.split(".")[0] in HF_ROOTS and n.rsplit(".", 1)[-1] in TRAINING_ARGS for n in rule.qualified_names(call.func)
    )


def is_on(arg: cst.Arg | None) -> bool:
    """A keyword that is given and not literally False/None."""
    return arg is not None and not is_literal(arg.value, "False", "None")


# --- mixed precision and optimizer choice -------------------------------------------------
class HfFp16(Rule):
    code = "XLA301"
    needs = ("transformers", "trl")
    title = "HF `TrainingArguments(fp16=True)`: TPUs train in bf16"
    category = "C3"
    fix = "unsafe"
    autofix = True
    detects = (
        "`TrainingArguments` / `Seq2SeqTrainingArguments` / TRL configs with `fp16=True` or `fp16_full_eval=True`."
    )
    why = (
        "On TPU accelerate rejects fp16: `ValueError: fp16 mixed precision requires a GPU (not 'xla')` (the check "
        "runs only on real TPUs, so a PJRT CPU test passes). TPUs compute in bf16, which needs no loss scaling. "
        "Unsafe: with `bf16=True` accelerate sets `XLA_USE_BF16=1` on TPU, which stores the WHOLE model (weights, "
        "optimizer state, metric sums) in bf16 — not autocast — and prints a deprecation notice; compare the loss "
        "curve with the fp32/fp16 reference."
    )
    before = (
        "from transformers import TrainingArguments\n\n"
        'args = TrainingArguments("out", fp16=True, optim="adamw_torch_xla")\n'
    )
    after = (
        "from transformers import TrainingArguments\n\n"
        'args = TrainingArguments("out", bf16=True, optim="adamw_torch_xla")\n'
    )
    message = "fp16 is rejected on TPU; use `bf16=True`"
    symptoms = ("ValueError: fp16 mixed precision requires a GPU (not 'xla').",)
    references = ("accelerate accelerator.py fp16 device check", "accelerate state.py XLA_USE_BF16")
    valid = (
        "from transformers import TrainingArguments\nargs = TrainingArguments('out', bf16=True, optim='adamw_torch_xla')\n",
        "from transformers import TrainingArguments\nargs = TrainingArguments('out', fp16=False, optim='adamw_torch_xla')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not is_training_args(self, node):
            return
        for fp16, bf16 in (("fp16", "bf16"), ("fp16_full_eval", "bf16_full_eval")):
            arg = keyword_arg(node, fp16)
            if not is_on(arg):
                continue
            if is_literal(arg.value, "True") and keyword_arg(node, bf16) is None:
                self.report(
                    arg,
                    f"`{fp16}=True` is rejected on TPU; use `{bf16}=True`",
                    arg.with_changes(keyword=cst.Name(bf16)),
                )
            else:
                self.report(arg, f"`{fp16}` is rejected on TPU; choose `{bf16}` there")


ACCELERATORS = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})


class AcceleratorFp16(Rule):
    code = "XLA302"
    needs = ("mixed_precision",)
    title = '`Accelerator(mixed_precision="fp16")`: TPUs train in bf16'
    category = "C3"
    fix = "unsafe"
    autofix = True
    detects = (
        '`accelerate.Accelerator(mixed_precision="fp16")`, also where the value comes from a flag: '
        '`mixed_precision=args.mixed_precision` with `add_argument("--mixed_precision", default="fp16")` '
        "(the default is rewritten)."
    )
    why = (
        "accelerate refuses fp16 on TPU (`ValueError: fp16 mixed precision requires a GPU (not 'xla')`) and the "
        'GradScaler path it implies does not exist for XLA. Use `"bf16"`. Unsafe: on TPU accelerate implements '
        "bf16 by setting `XLA_USE_BF16=1` (or `XLA_DOWNCAST_BF16=1` with `downcast_bf16`), i.e. the whole model and "
        "optimizer state in bf16, not autocast."
    )
    before = 'from accelerate import Accelerator\n\naccelerator = Accelerator(mixed_precision="fp16")\n'
    after = 'from accelerate import Accelerator\n\naccelerator = Accelerator(mixed_precision="bf16")\n'
    message = 'fp16 is rejected on TPU; use `mixed_precision="bf16"`'
    symptoms = ("ValueError: fp16 mixed precision requires a GPU (not 'xla').",)
    references = ("accelerate accelerator.py fp16 device check", "accelerate docs concept_guides/training_tpu.md")
    valid = ("from accelerate import Accelerator\na = Accelerator(mixed_precision='bf16')\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & ACCELERATORS:
            return
        arg = keyword_arg(node, "mixed_precision")
        if arg is None:
            return
        if string_value(arg.value) == "fp16":
            self.report(arg.value, replacement=same_quotes(arg.value, "bf16"))
        elif isinstance(arg.value, cst.Attribute):  # `args.mixed_precision`: the flag's default
            default = self._flag_default(arg.value.attr.value)
            if default is not None:
                self.report(default, replacement=same_quotes(default, "bf16"))

    def _flag_default(self, dest: str) -> cst.SimpleString | None:
        """The `"fp16"` default of the module's `add_argument` whose destination is `dest`."""
        for call in self.analysis.nodes.calls:
            if method_name(call) == "add_argument" and argparse_dest(call) == dest:
                default = keyword_arg(call, "default")
                if default is not None and string_value(default.value) == "fp16":
                    return default.value
        return None


XLA_OPTIM = "adamw_torch_xla"
CUDA_ONLY_OPTIMS = frozenset(
    {
        "adamw_bnb_8bit",
        "adamw_8bit",
        "paged_adamw_8bit",
        "paged_adamw_32bit",
        "lion_8bit",
        "paged_lion_8bit",
        "paged_lion_32bit",
        "adamw_torch_npu_fused",
        "adamw_apex_fused",
    }
)


class TrainerFusedOptimizer(Rule):
    code = "XLA303"
    needs = ("transformers", "trl")
    title = "HF Trainer's default optimizer (`adamw_torch_fused`) fails on XLA"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = (
        '`TrainingArguments(optim="adamw_torch_fused")`, TrainingArguments without `optim` (with torch >= 2.8 '
        "transformers defaults to `adamw_torch_fused`), and bitsandbytes/apex/NPU optimizers."
    )
    why = (
        "The Trainer builds `torch.optim.AdamW(..., fused=True)`, and the first step on XLA raises ``RuntimeError: "
        "`fused=True` requires all the params to be floating point Tensors of supported devices: [...] but "
        "torch.float32 and xla`` — also when `optim` is not given at all (measured with transformers 5.24 + "
        'torch 2.9). `optim="adamw_torch_xla"` uses `torch_xla.amp.syncfree.AdamW`, the same AdamW update '
        "(bit-identical weights after 3 steps on XLA:CPU). 8-bit / paged (bitsandbytes), apex and NPU optimizers "
        "need their accelerator and are only reported."
    )
    before = (
        'from transformers import TrainingArguments\n\nargs = TrainingArguments("out", optim="adamw_torch_fused")\n'
    )
    after = 'from transformers import TrainingArguments\n\nargs = TrainingArguments("out", optim="adamw_torch_xla")\n'
    message = 'the fused AdamW fails on XLA; use `optim="adamw_torch_xla"`'
    symptoms = ("RuntimeError: `fused=True` requires all the params to be floating point Tensors of supported devices",)
    references = (
        "transformers trainer_optimizer.py _get_adamw_torch_xla",
        "transformers training_args.py default_optim",
    )
    valid = (
        "from transformers import TrainingArguments\nargs = TrainingArguments('out', optim='adamw_torch_xla')\n",
        "from transformers import TrainingArguments\nargs = TrainingArguments('out', optim='adamw_torch')\n",
        "from transformers import TrainingArguments\nargs = TrainingArguments(**config)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not is_training_args(self, node):
            return
        arg = keyword_arg(node, "optim")
        if arg is None:
            if not has_star_args(node):
                self.report(
                    node,
                    'no `optim`: the default `adamw_torch_fused` fails on XLA; set `optim="adamw_torch_xla"`',
                    add_kwarg(node, "optim", cst.SimpleString(f'"{XLA_OPTIM}"')),
                )
            return
        value = string_value(arg.value)
        if value == "adamw_torch_fused":
            self.report(arg.value, replacement=same_quotes(arg.value, XLA_OPTIM))
        elif value in CUDA_ONLY_OPTIMS:
            self.report(arg.value, f'`optim="{value}"` needs a GPU/NPU library; use `optim="{XLA_OPTIM}"` on TPU')


class HfTf32(Rule):
    code = "XLA304"
    needs = ("tf32",)
    title = "HF `TrainingArguments(tf32=True)` raises without an Ampere GPU"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = "`TrainingArguments(tf32=True)` (and TRL configs)."
    why = (
        "TrainingArguments validates the flag on construction: `ValueError: --tf32 requires Ampere or a newer GPU "
        "arch, cuda>=11 and torch>=1.7` on any host without such a GPU. TPU matmul precision is set with "
        "`torch_xla.backends.set_mat_mul_precision(...)` (the TPU default, one bf16 pass, is already below TF32), "
        "so the keyword is dropped."
    )
    before = (
        "from transformers import TrainingArguments\n\n"
        'args = TrainingArguments("out", tf32=True, optim="adamw_torch_xla")\n'
    )
    after = 'from transformers import TrainingArguments\n\nargs = TrainingArguments("out", optim="adamw_torch_xla")\n'
    message = (
        "`tf32=True` raises without an Ampere GPU; drop it (TPU precision: `torch_xla.backends.set_mat_mul_precision`)"
    )
    symptoms = ("ValueError: --tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7",)
    references = ("transformers training_args.py tf32 check",)
    valid = (
        "from transformers import TrainingArguments\nargs = TrainingArguments('out', tf32=False, optim='adamw_torch_xla')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        arg = keyword_arg(node, "tf32")
        if not is_on(arg) or not is_training_args(self, node):
            return
        if is_literal(arg.value, "True"):
            self.report(arg, replacement=drop_args(node, [arg]), target=node)
        else:
            self.report(arg)


class HfGradientCheckpointing(Rule):
    code = "XLA305"
    needs = ("checkpointing",)
    title = "HF gradient checkpointing calls `torch.utils.checkpoint`, which fails on XLA"
    category = "C3"
    fix = "manual"
    detects = (
        "`TrainingArguments(gradient_checkpointing=True)` / `activation_checkpointing=True` and "
        "`model.gradient_checkpointing_enable()` / `model.activation_checkpointing_enable()`."
    )
    why = (
        "transformers wraps each layer in `torch.utils.checkpoint.checkpoint`; on XLA tensors the backward fails "
        "with `AttributeError: module 'torch' has no attribute 'xla'` (still with torch_xla 2.9 + transformers "
        "5.24, measured), and where it runs it saves no memory because XLA merges the recomputation. Options: "
        "turn it off and fit memory with a smaller per-chip batch / bf16; or, with the Trainer's XLA FSDP, "
        '`fsdp="full_shard", fsdp_config={"xla": True, "xla_fsdp_grad_ckpt": True}` (checkpointing through '
        "torch_xla); in your own modules use `torch_xla.utils.checkpoint.checkpoint`."
    )
    before = (
        'from transformers import TrainingArguments\n\nargs = TrainingArguments("out", gradient_checkpointing=True)\n'
    )
    message = (
        "HF gradient checkpointing fails on XLA (`module 'torch' has no attribute 'xla'`); disable it or use "
        "XLA FSDP with `xla_fsdp_grad_ckpt`"
    )
    symptoms = ("AttributeError: module 'torch' has no attribute 'xla'",)
    references = ("huggingface/transformers #29314", "huggingface/trl #4182", "transformers integrations/tpu.py")
    valid = (
        "from transformers import TrainingArguments\nargs = TrainingArguments('out', gradient_checkpointing=False)\n",
        "model.gradient_checkpointing_disable()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in {
            "gradient_checkpointing_enable",
            "activation_checkpointing_enable",
        }:
            self.report(node)
        elif is_training_args(self, node):
            for name in ("gradient_checkpointing", "activation_checkpointing"):
                arg = keyword_arg(node, name)
                if is_on(arg):
                    self.report(arg)


# --- seeding ------------------------------------------------------------------------------
class HfSetSeed(AddXlaSeed):
    code = "XLA306"
    needs = ("set_seed",)
    title = "`transformers.set_seed()` does not seed the XLA generator"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = (
        "`transformers.set_seed(s)` (and `transformers.trainer_utils.set_seed`) with no XLA seed in the same block."
    )
    why = (
        "transformers' `set_seed` seeds `random`, numpy, `torch.manual_seed` and the CUDA/NPU/XPU generators, but "
        "not XLA (accelerate's `set_seed` does call `xm.set_rng_state`). Device-side randomness — dropout masks, "
        "random init on the device — differs between runs. Adding `torch_xla.manual_seed(s)` after it fixes that."
    )
    before = "from transformers import set_seed\n\nset_seed(42)\n"
    after = "from transformers import set_seed\nimport torch_xla\n\nset_seed(42)\ntorch_xla.manual_seed(42)\n"
    message = "`transformers.set_seed` does not seed the XLA RNG; also call `torch_xla.manual_seed(seed)`"
    references = ("transformers trainer_utils.py set_seed", "accelerate utils/random.py set_seed", "pytorch/xla #2092")
    valid = (
        "from transformers import set_seed\nimport torch_xla\nset_seed(1)\ntorch_xla.manual_seed(1)\n",
        "from accelerate.utils import set_seed\nset_seed(1)\n",
    )
    seeds = frozenset({"transformers.set_seed", "transformers.trainer_utils.set_seed"})
    already_seeded = XLA_SEEDS | CUDA_SEEDS | TORCH_SEEDS  # XLA206/XLA207 add the XLA seed there


# --- distributed training with accelerate-style loops -------------------------------------
CLIP_NORM = frozenset(
    {"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad.clip_grad_norm_"}
)


class ClipBeforeReduce(Rule):
    code = "XLA311"
    needs = ("clip_grad",)
    title = "Gradient clipping before `xm.optimizer_step` clips each replica's own gradients"
    category = "C3"
    fix = "manual"
    detects = (
        "`clip_grad_norm_(...)` followed by `xm.optimizer_step(opt)` in the same function/loop, with no "
        "`xm.reduce_gradients(opt)` before the clip."
    )
    why = (
        "`xm.optimizer_step` = all-reduce of the gradients + `opt.step()`. Clipping before it computes the norm "
        "on each replica's UNREDUCED gradients, so every replica clips by a different factor and the averaged "
        "update is not the clipped global gradient — on several chips accuracy drops silently (single-chip runs "
        "are unaffected). Reduce first, then clip, then step: `xm.reduce_gradients(opt)`, `clip_grad_norm_(...)`, "
        "`opt.step()`. accelerate >= PR #2176 does exactly this inside `accelerator.clip_grad_norm_` (and marks "
        "the gradients as synced so `step` does not reduce twice); the HF Trainer handles it too."
    )
    before = (
        "import torch\nimport torch_xla.core.xla_model as xm\n\n"
        "for x, y in loader:\n"
        "    loss = loss_fn(model(x), y)\n"
        "    loss.backward()\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    xm.optimizer_step(opt)\n"
    )
    message = (
        "clipping before `xm.optimizer_step` uses per-replica gradients; do `xm.reduce_gradients(opt)`, then "
        "`clip_grad_norm_(...)`, then `opt.step()`"
    )
    symptoms = ("lower accuracy with several TPU chips than with one",)
    references = ("pytorch/xla #1708", "huggingface/accelerate PR #2176", "huggingface/accelerate PR #1926")
    valid = (
        "import torch\nimport torch_xla.core.xla_model as xm\nfor x in loader:\n    loss.backward()\n"
        "    xm.reduce_gradients(opt)\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    opt.step()\n",
        "for x in loader:\n    accelerator.backward(loss)\n    accelerator.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    opt.step()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & CLIP_NORM:
            return
        scope = next(
            (a for a in self.ancestors(node) if isinstance(a, (cst.For, cst.While, cst.FunctionDef, cst.Module))), None
        )
        if scope is None:
            return
        here = self._where(node)
        calls = find_nodes(scope, cst.Call)
        steps = [c for c in calls if self.is_call_to(c, "torch_xla.core.xla_model.optimizer_step")]
        reduces = [c for c in calls if self.is_call_to(c, "torch_xla.core.xla_model.reduce_gradients")]
        if any(self._where(c) < here for c in reduces):
            return
        if any(here < self._where(c) for c in steps):
            self.report(node)

    def _where(self, node: cst.CSTNode) -> tuple[int, int]:
        start = self.position(node).start
        return start.line, start.column
