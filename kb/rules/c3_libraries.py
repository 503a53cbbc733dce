"""C3 — third-party libraries: HF Trainer / TrainingArguments, accelerate, PEFT, checkpoints of device tensors."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import (
    SCOPES,
    add_kwarg,
    code_of,
    dotted,
    drop_args,
    find_nodes,
    has_star_args,
    is_literal,
    same_quotes,
)
from ..rule import Rule, keyword_arg, positional_args, register, string_value
from .c2_device import (
    CUDA_SEEDS,
    TORCH_SEEDS,
    XLA_SEEDS,
    AddXlaSeed,
    is_optimizer,
    moved_module,
    parameter_owners,
)

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
@register
class HfFp16(Rule):
    code = "XLA301"
    title = "HF `TrainingArguments(fp16=True)`: TPUs train in bf16"
    category = "C3"
    fix = "unsafe"
    autofix = True
    detects = "`TrainingArguments` / `Seq2SeqTrainingArguments` / TRL configs with `fp16=True` or `fp16_full_eval=True`."
    why = (
        "On TPU accelerate rejects fp16: `ValueError: fp16 mixed precision requires a GPU (not 'xla')` (the check "
        "runs only on real TPUs, so a PJRT CPU test passes). TPUs compute in bf16, which needs no loss scaling. "
        "Unsafe: with `bf16=True` accelerate sets `XLA_USE_BF16=1` on TPU, which stores the WHOLE model (weights, "
        "optimizer state, metric sums) in bf16 — not autocast — and prints a deprecation notice; compare the loss "
        "curve with the fp32/fp16 reference."
    )
    before = (
        "from transformers import TrainingArguments\n\n"
        "args = TrainingArguments(\"out\", fp16=True, optim=\"adamw_torch_xla\")\n"
    )
    after = (
        "from transformers import TrainingArguments\n\n"
        "args = TrainingArguments(\"out\", bf16=True, optim=\"adamw_torch_xla\")\n"
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
                self.report(arg, f"`{fp16}=True` is rejected on TPU; use `{bf16}=True`", arg.with_changes(keyword=cst.Name(bf16)))
            else:
                self.report(arg, f"`{fp16}` is rejected on TPU; choose `{bf16}` there")


ACCELERATORS = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})


@register
class AcceleratorFp16(Rule):
    code = "XLA302"
    title = "`Accelerator(mixed_precision=\"fp16\")`: TPUs train in bf16"
    category = "C3"
    fix = "unsafe"
    autofix = True
    detects = "`accelerate.Accelerator(mixed_precision=\"fp16\")`."
    why = (
        "accelerate refuses fp16 on TPU (`ValueError: fp16 mixed precision requires a GPU (not 'xla')`) and the "
        "GradScaler path it implies does not exist for XLA. Use `\"bf16\"`. Unsafe: on TPU accelerate implements "
        "bf16 by setting `XLA_USE_BF16=1` (or `XLA_DOWNCAST_BF16=1` with `downcast_bf16`), i.e. the whole model and "
        "optimizer state in bf16, not autocast."
    )
    before = "from accelerate import Accelerator\n\naccelerator = Accelerator(mixed_precision=\"fp16\")\n"
    after = "from accelerate import Accelerator\n\naccelerator = Accelerator(mixed_precision=\"bf16\")\n"
    message = "fp16 is rejected on TPU; use `mixed_precision=\"bf16\"`"
    symptoms = ("ValueError: fp16 mixed precision requires a GPU (not 'xla').",)
    references = ("accelerate accelerator.py fp16 device check", "accelerate docs concept_guides/training_tpu.md")
    valid = ("from accelerate import Accelerator\na = Accelerator(mixed_precision='bf16')\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & ACCELERATORS:
            return
        arg = keyword_arg(node, "mixed_precision")
        if arg is not None and string_value(arg.value) == "fp16":
            self.report(arg.value, replacement=same_quotes(arg.value, "bf16"))


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


@register
class TrainerFusedOptimizer(Rule):
    code = "XLA303"
    title = "HF Trainer's default optimizer (`adamw_torch_fused`) fails on XLA"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = (
        "`TrainingArguments(optim=\"adamw_torch_fused\")`, TrainingArguments without `optim` (with torch >= 2.8 "
        "transformers defaults to `adamw_torch_fused`), and bitsandbytes/apex/NPU optimizers."
    )
    why = (
        "The Trainer builds `torch.optim.AdamW(..., fused=True)`, and the first step on XLA raises ``RuntimeError: "
        "`fused=True` requires all the params to be floating point Tensors of supported devices: [...] but "
        "torch.float32 and xla`` — also when `optim` is not given at all (measured with transformers 5.24 + "
        "torch 2.9). `optim=\"adamw_torch_xla\"` uses `torch_xla.amp.syncfree.AdamW`, the same AdamW update "
        "(bit-identical weights after 3 steps on XLA:CPU). 8-bit / paged (bitsandbytes), apex and NPU optimizers "
        "need their accelerator and are only reported."
    )
    before = "from transformers import TrainingArguments\n\nargs = TrainingArguments(\"out\", optim=\"adamw_torch_fused\")\n"
    after = "from transformers import TrainingArguments\n\nargs = TrainingArguments(\"out\", optim=\"adamw_torch_xla\")\n"
    message = "the fused AdamW fails on XLA; use `optim=\"adamw_torch_xla\"`"
    symptoms = (
        "RuntimeError: `fused=True` requires all the params to be floating point Tensors of supported devices",
    )
    references = ("transformers trainer_optimizer.py _get_adamw_torch_xla", "transformers training_args.py default_optim")
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
                    "no `optim`: the default `adamw_torch_fused` fails on XLA; set `optim=\"adamw_torch_xla\"`",
                    add_kwarg(node, "optim", cst.SimpleString(f'"{XLA_OPTIM}"')),
                )
            return
        value = string_value(arg.value)
        if value == "adamw_torch_fused":
            self.report(arg.value, replacement=same_quotes(arg.value, XLA_OPTIM))
        elif value in CUDA_ONLY_OPTIMS:
            self.report(arg.value, f"`optim=\"{value}\"` needs a GPU/NPU library; use `optim=\"{XLA_OPTIM}\"` on TPU")


@register
class HfTf32(Rule):
    code = "XLA304"
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
        "args = TrainingArguments(\"out\", tf32=True, optim=\"adamw_torch_xla\")\n"
    )
    after = "from transformers import TrainingArguments\n\nargs = TrainingArguments(\"out\", optim=\"adamw_torch_xla\")\n"
    message = "`tf32=True` raises without an Ampere GPU; drop it (TPU precision: `torch_xla.backends.set_mat_mul_precision`)"
    symptoms = ("ValueError: --tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7",)
    references = ("transformers training_args.py tf32 check",)
    valid = ("from transformers import TrainingArguments\nargs = TrainingArguments('out', tf32=False, optim='adamw_torch_xla')\n",)

    def visit_Call(self, node: cst.Call) -> None:
        arg = keyword_arg(node, "tf32")
        if not is_on(arg) or not is_training_args(self, node):
            return
        if is_literal(arg.value, "True"):
            self.report(arg, replacement=drop_args(node, [arg]), target=node)
        else:
            self.report(arg)


@register
class HfGradientCheckpointing(Rule):
    code = "XLA305"
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
        "`fsdp=\"full_shard\", fsdp_config={\"xla\": True, \"xla_fsdp_grad_ckpt\": True}` (checkpointing through "
        "torch_xla); in your own modules use `torch_xla.utils.checkpoint.checkpoint`."
    )
    before = "from transformers import TrainingArguments\n\nargs = TrainingArguments(\"out\", gradient_checkpointing=True)\n"
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
@register
class HfSetSeed(AddXlaSeed):
    code = "XLA306"
    title = "`transformers.set_seed()` does not seed the XLA generator"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = "`transformers.set_seed(s)` (and `transformers.trainer_utils.set_seed`) with no XLA seed in the same block."
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


# --- checkpoints ---------------------------------------------------------------------------
@register
class TorchLoadWithoutMapLocation(Rule):
    code = "XLA307"
    title = "`torch.load` without `map_location` restores tensors where they were saved"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = "`torch.load(f)` with no `map_location` (GPU-era checkpoints, optimizer states, `torch.save`d XLA tensors)."
    why = (
        "Without `map_location` every tensor goes back to the device it was saved from. A checkpoint written on "
        "the GPU fails on a TPU host: `RuntimeError: Attempting to deserialize object on a CUDA device but "
        "torch.cuda.is_available() is False`; one written with `torch.save` from XLA tensors needs torch_xla and "
        "restores onto `xla:0` (or fails: `don't know how to restore data location of torch.FloatStorage (tagged "
        "with xla:0)`). `map_location=\"cpu\"` always works; `load_state_dict` then copies into the device "
        "parameters and `optimizer.load_state_dict` casts state to the parameters' device."
    )
    before = "import torch\n\nstate = torch.load(\"ckpt.pt\")\n"
    after = "import torch\n\nstate = torch.load(\"ckpt.pt\", map_location=\"cpu\")\n"
    message = "load with `map_location=\"cpu\"`: the checkpoint may hold CUDA or XLA tensors"
    symptoms = (
        "RuntimeError: Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False.",
        "don't know how to restore data location of torch.FloatStorage (tagged with xla:0)",
    )
    references = ("huggingface/transformers #4963", "accelerate optimizer.py move_to_device")
    valid = (
        "import torch\nsd = torch.load('c.pt', map_location='cpu')\n",
        "import torch\nsd = torch.load('c.pt', device)\n",
        "import torch\nsd = torch.load('c.pt', **kw)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.load") or has_star_args(node):
            return
        if len(positional_args(node)) < 2 and keyword_arg(node, "map_location") is None:
            self.report(node, replacement=add_kwarg(node, "map_location", cst.SimpleString('"cpu"')))


NOT_MODELS = ("token", "processor", "config", "extractor", "feature", "scheduler", "pipe")


@register
class SavePretrainedXla(Rule):
    code = "XLA308"
    title = "`save_pretrained()` of a model on XLA fails: pass a CPU state dict"
    category = "C3"
    fix = "unsafe"
    autofix = True
    detects = (
        "`model.save_pretrained(dir)` (transformers models and PEFT models) without `state_dict=`; receivers named "
        "like tokenizers, processors, configs or pipelines are skipped."
    )
    why = (
        "Serialisation looks at tensor storages to find shared weights, and XLA tensors have none: "
        "`RuntimeError: Attempted to access the data pointer on an invalid python storage` (measured with "
        "transformers 5.24 and peft 0.21 on XLA). Passing `state_dict={k: v.cpu() for k, v in "
        "model.state_dict().items()}` saves the same files (PEFT keeps only the adapter keys), reloadable with "
        "`from_pretrained`. Unsafe: the receiver is recognised by name, and the CPU copy needs host memory for "
        "the full model; call it on every rank only if the save itself is rank-guarded as before."
    )
    before = "model.save_pretrained(\"out/best\")\n"
    after = "model.save_pretrained(\"out/best\", state_dict={k: v.cpu() for k, v in model.state_dict().items()})\n"
    message = "`save_pretrained` of XLA tensors fails (`invalid python storage`); pass a CPU `state_dict`"
    symptoms = ("RuntimeError: Attempted to access the data pointer on an invalid python storage.",)
    references = ("huggingface/transformers #29608", "transformers pytorch_utils.py id_tensor_storage")
    valid = (
        "tokenizer.save_pretrained('out')\n",
        "model.save_pretrained('out', state_dict=cpu_state)\n",
        "model.config.save_pretrained('out')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "save_pretrained"):
            return
        if keyword_arg(node, "state_dict") is not None:
            return
        receiver = dotted(func.value)
        last = (receiver or code_of(func.value)).rsplit(".", 1)[-1].lower()
        if any(word in last for word in NOT_MODELS):
            return
        if receiver is None or has_star_args(node):
            self.report(node, f"{self.message} (`state_dict={{k: v.cpu() for k, v in model.state_dict().items()}}`)")
            return
        cpu_state = cst.parse_expression(f"{{k: v.cpu() for k, v in {receiver}.state_dict().items()}}")
        self.report(node, replacement=add_kwarg(node, "state_dict", cpu_state))


@register
class ReloadIntoNewModel(Rule):
    code = "XLA309"
    title = "Best-checkpoint reload builds a new model the optimizer does not own"
    category = "C3"
    fix = "manual"
    detects = (
        "After `opt = torch.optim.X(model.parameters())`, a later `model = Model(...)` / `model = "
        "X.from_pretrained(...)` in the same scope that is followed by `model.load_state_dict(...)` (or is a "
        "`from_pretrained`), while training continues with `opt` or the new model is never moved to the device."
    )
    why = (
        "The new object has new Parameters: the optimizer still updates the old ones, so training after the "
        "reload changes nothing (loss flat, exit code 0), and a new model that is not moved runs the rest on the "
        "CPU (or fails with a device mismatch against XLA inputs). Load the weights into the existing model "
        "(`model.load_state_dict(torch.load(path, map_location=\"cpu\"))` — it copies into the device parameters "
        "and keeps the optimizer linked), or move the new model with `.to(torch_xla.device())` and build a new "
        "optimizer for it."
    )
    before = (
        "import torch\n\n"
        "def train(cfg):\n"
        "    model = Net(cfg).to(device)\n"
        "    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
        "    fit(model, opt)\n"
        "    model = Net(cfg)\n"
        "    model.load_state_dict(torch.load(\"best.pt\", map_location=\"cpu\"))\n"
        "    fit(model, opt)\n"
    )
    message = "new model object after the optimizer was built: the optimizer does not update it"
    symptoms = ("loss does not decrease after reloading the best checkpoint",)
    references = ("pytorch/xla #1623", "pytorch/xla #6620 / transformers #29322")
    valid = (
        "import torch\nmodel = Net().to(dev)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nfit(model, opt)\n"
        "model.load_state_dict(torch.load('best.pt', map_location='cpu'))\n",
        "import torch\nmodel = Net().to(dev)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nfit(model, opt)\n"
        "model = Net()\nmodel.load_state_dict(torch.load('best.pt', map_location='cpu'))\nmodel.to(dev)\n"
        "evaluate(model)\n",
        "import torch\nmodel = Net().to(dev)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel = DDP(model)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not is_optimizer(self, node):
            return
        owners = [o for o in parameter_owners(node) if "." not in o]
        scope = next((a for a in self.ancestors(node) if isinstance(a, (*SCOPES, cst.Module))), None)
        if not owners or not isinstance(scope, (cst.FunctionDef, cst.Module)):
            return
        opt_name = self._assigned_name(node)
        built = self._end(node)
        for assign in find_nodes(scope, cst.Assign):
            name = next((dotted(t.target) for t in assign.targets if dotted(t.target) in owners), None)
            if name is None or self._start(assign) < built or not self._is_new_model(assign.value, name):
                continue
            after = [n for n in find_nodes(scope, cst.Call, cst.Name) if self._start(n) > self._end(assign)]
            calls = [n for n in after if isinstance(n, cst.Call)]
            if not (self._from_pretrained(assign.value) or self._loads_state(calls, name)):
                continue
            fix = f'load the weights into the existing model (`{name}.load_state_dict(torch.load(path, map_location="cpu"))`)'
            if opt_name is not None and self._optimizer_used(opt_name, assign, after):
                self.report(
                    assign.value,
                    f"`{name} = ...` makes a new model, but `{opt_name}` still updates the old one's parameters: "
                    f"{fix}, or move the new model and rebuild the optimizer",
                )
            elif not any(moved_module(self, c) == name for c in calls):
                self.report(
                    assign.value,
                    f"`{name} = ...` makes a new model that stays on the CPU (it is never moved to the XLA "
                    f"device): {fix}, or move it with `.to(torch_xla.device())`",
                )

    def _start(self, node: cst.CSTNode) -> tuple[int, int]:
        pos = self.position(node).start
        return pos.line, pos.column

    def _end(self, node: cst.CSTNode) -> tuple[int, int]:
        pos = self.position(node).end
        return pos.line, pos.column

    def _assigned_name(self, call: cst.Call) -> str | None:
        parent = self.parent(call)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return dotted(parent.targets[0].target)
        return None

    def _is_new_model(self, value: cst.BaseExpression, name: str) -> bool:
        return isinstance(value, cst.Call) and name not in _names(value)

    def _from_pretrained(self, value: cst.BaseExpression) -> bool:
        func = value.func if isinstance(value, cst.Call) else None
        return isinstance(func, cst.Attribute) and func.attr.value == "from_pretrained"

    def _loads_state(self, calls: list[cst.Call], name: str) -> bool:
        return any(
            isinstance(c.func, cst.Attribute) and c.func.attr.value == "load_state_dict" and dotted(c.func.value) == name
            for c in calls
        )

    def _optimizer_used(self, opt_name: str, assign: cst.Assign, after: list[cst.CSTNode]) -> bool:
        """`opt` is used after the reassignment, or in a loop around it (the next iteration)."""
        if any(isinstance(n, cst.Name) and n.value == opt_name for n in after):
            return True
        for anc in self.ancestors(assign):
            if isinstance(anc, (*SCOPES, cst.Module)):
                return False
            if isinstance(anc, (cst.For, cst.While)) and opt_name in _names(anc.body):
                return True
        return False


def _names(node: cst.CSTNode) -> set[str]:
    return {n.value for n in find_nodes(node, cst.Name)}


@register
class BestModelWithPeft(Rule):
    code = "XLA310"
    title = "`load_best_model_at_end=True` with PEFT on TPU may restore no adapter"
    category = "C3"
    fix = "manual"
    detects = "`TrainingArguments(load_best_model_at_end=True)` in a module that uses PEFT (imports `peft` or passes `peft_config=`)."
    why = (
        "On TPU the Trainer saves through its XLA path (`_save_tpu`). Before transformers PR #29388 it wrote no "
        "adapter files for PEFT models, and with FSDPv2/SPMD checkpoints still come back as the base model "
        "(`Found missing adapter keys while loading the checkpoint`, transformers #36004, open). "
        "`load_best_model_at_end` then silently ends with the wrong weights. After training check that the best "
        "checkpoint has `adapter_model.safetensors` and that its eval metric reproduces, or reload it yourself "
        "(`PeftModel.from_pretrained(base, best_checkpoint)`)."
    )
    before = (
        "from peft import LoraConfig, get_peft_model\nfrom transformers import TrainingArguments\n\n"
        "model = get_peft_model(base, LoraConfig(r=8))\n"
        "args = TrainingArguments(\"out\", load_best_model_at_end=True, eval_strategy=\"epoch\", save_strategy=\"epoch\")\n"
    )
    message = (
        "best-model reload with PEFT on TPU: verify the checkpoint holds the adapter (adapter_model.safetensors) "
        "and its metric reproduces"
    )
    symptoms = ("Found missing adapter keys while loading the checkpoint", "adapter_model.safetensors missing")
    references = ("huggingface/transformers PR #29388", "huggingface/transformers #36004")
    valid = ("from transformers import TrainingArguments\nargs = TrainingArguments('out', load_best_model_at_end=True)\n",)

    def __init__(self) -> None:
        super().__init__()
        self.candidates: list[cst.Arg] = []
        self.uses_peft = False

    def visit_Import(self, node: cst.Import) -> None:
        self.uses_peft |= any((dotted(a.name) or "").split(".")[0] == "peft" for a in node.names)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.uses_peft |= (dotted(node.module) or "").split(".")[0] == "peft" if node.module else False

    def visit_Call(self, node: cst.Call) -> None:
        if keyword_arg(node, "peft_config") is not None:
            self.uses_peft = True
        if is_training_args(self, node):
            arg = keyword_arg(node, "load_best_model_at_end")
            if is_on(arg):
                self.candidates.append(arg)

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.uses_peft:
            for arg in self.candidates:
                self.report(arg)


# --- distributed training with accelerate-style loops -------------------------------------
CLIP_NORM = frozenset(
    {"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad.clip_grad_norm_"}
)


@register
class ClipBeforeReduce(Rule):
    code = "XLA311"
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
        scope = next((a for a in self.ancestors(node) if isinstance(a, (cst.For, cst.While, cst.FunctionDef, cst.Module))), None)
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


# --- loading models the CUDA way -----------------------------------------------------------
QUANTIZED_LOADING = ("load_in_8bit", "load_in_4bit")


@register
class BitsAndBytesQuantization(Rule):
    code = "XLA312"
    title = "bitsandbytes quantisation (QLoRA, 8-bit loading) is CUDA-only"
    category = "C3"
    fix = "manual"
    detects = (
        "`BitsAndBytesConfig(...)`, `from_pretrained(..., load_in_8bit=True / load_in_4bit=True)` and "
        "`peft.prepare_model_for_kbit_training(...)`."
    )
    why = (
        "bitsandbytes kernels exist for CUDA (and a few other GPU backends), not for XLA: loading fails "
        "(`ImportError` / `RuntimeError` from bitsandbytes, or a quantizer that requires a GPU), and XLA has no "
        "int4/int8 matmul path for these layers. On TPU load the base model in bf16 (`dtype=torch.bfloat16`) and "
        "train LoRA adapters without quantisation; fit memory with a smaller per-chip batch or FSDPv2 sharding."
    )
    before = (
        "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n\n"
        "quant = BitsAndBytesConfig(load_in_4bit=True)\n"
        "model = AutoModelForCausalLM.from_pretrained(name, quantization_config=quant)\n"
    )
    message = "bitsandbytes quantisation needs a GPU; on TPU load bf16 weights and train LoRA unquantised"
    symptoms = ("No GPU found. A GPU is needed for quantization.", "bitsandbytes")
    references = ("xla_migration_facts C2 custom CUDA kernels (bitsandbytes)",)
    valid = (
        "import torch\nfrom transformers import AutoModelForCausalLM\n"
        "m = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if any(n.rsplit(".", 1)[-1] == "BitsAndBytesConfig" for n in names):
            self.report(node)
        elif any(n.startswith("peft") and n.endswith("prepare_model_for_kbit_training") for n in names):
            self.report(node, "`prepare_model_for_kbit_training` prepares a bitsandbytes model, which needs a GPU")
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "from_pretrained":
            for name in QUANTIZED_LOADING:
                arg = keyword_arg(node, name)
                if is_on(arg):
                    self.report(arg, f"`{name}` uses bitsandbytes, which needs a GPU; load bf16 weights on TPU")


@register
class DeviceMapDispatch(Rule):
    code = "XLA313"
    title = "`device_map=\"auto\"` puts the model on the CPU of a TPU host"
    category = "C3"
    fix = "manual"
    detects = (
        "`from_pretrained(..., device_map=...)` and `pipeline(..., device_map=...)` (any value but None), and "
        "`pipeline(..., device=<GPU index>)`."
    )
    why = (
        "accelerate's dispatch knows CUDA/XPU/NPU/MPS devices, not XLA: with no GPU `device_map=\"auto\"` places "
        "every layer on the CPU (measured: all parameters on `cpu`), so the run silently stays on the host, or "
        "`\"cuda\"` / `{\"\": 0}` fail with no driver. Load without `device_map`, then "
        "`model.to(torch_xla.device())` before building the optimizer; shard big models with FSDPv2/SPMD instead "
        "of layer dispatch."
    )
    before = "from transformers import AutoModelForCausalLM\n\nmodel = AutoModelForCausalLM.from_pretrained(name, device_map=\"auto\")\n"
    message = "`device_map` dispatch ignores TPUs (layers land on the CPU); load, then `.to(torch_xla.device())`"
    symptoms = ("model parameters on cpu after from_pretrained(device_map='auto')",)
    references = ("accelerate utils/modeling.py get_max_memory / infer_auto_device_map",)
    valid = (
        "from transformers import AutoModelForCausalLM\nm = AutoModelForCausalLM.from_pretrained(name)\n",
        "from transformers import AutoModelForCausalLM\nm = AutoModelForCausalLM.from_pretrained(name, device_map=None)\n",
        "from transformers import pipeline\np = pipeline('text-generation', model=m, device=-1)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        is_pipeline = any(n in {"transformers.pipeline", "transformers.pipelines.pipeline"} for n in self.qualified_names(func))
        if not (is_pipeline or (isinstance(func, cst.Attribute) and func.attr.value == "from_pretrained")):
            return
        device_map = keyword_arg(node, "device_map")
        if is_on(device_map):
            self.report(device_map)
        device = keyword_arg(node, "device") if is_pipeline else None
        if device is not None and isinstance(device.value, cst.Integer) and device.value.evaluated_value >= 0:
            self.report(device, "`pipeline(device=<GPU index>)` needs CUDA; pass `device=torch_xla.device()`")

