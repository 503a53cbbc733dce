"""C3 — loading models the CUDA way: bitsandbytes quantization, `device_map` dispatch."""

from __future__ import annotations

import libcst as cst

from xlaport.targets import TARGETS

from ..cst_helpers import keyword_arg
from ..rule import Rule
from .c3_hf_trainer import is_on

# --- loading models the CUDA way -----------------------------------------------------------
QUANTIZED_LOADING = ("load_in_8bit", "load_in_4bit")


class BitsAndBytesQuantization(Rule):
    code = "XLA312"
    targets = TARGETS  # detection, message and fix hold on TorchTPU too
    needs = ("bitsandbytes", "kbit", "from_pretrained")
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


class DeviceMapDispatch(Rule):
    code = "XLA313"
    needs = ("pipeline", "from_pretrained")
    title = '`device_map="auto"` puts the model on the CPU of a TPU host'
    category = "C3"
    fix = "manual"
    detects = (
        "`from_pretrained(..., device_map=...)` and `pipeline(..., device_map=...)` (any value but None), and "
        "`pipeline(..., device=<GPU index>)`."
    )
    why = (
        'accelerate\'s dispatch knows CUDA/XPU/NPU/MPS devices, not XLA: with no GPU `device_map="auto"` places '
        "every layer on the CPU (measured: all parameters on `cpu`), so the run silently stays on the host, or "
        '`"cuda"` / `{"": 0}` fail with no driver. Load without `device_map`, then '
        "`model.to(torch_xla.device())` before building the optimizer; shard big models with FSDPv2/SPMD instead "
        "of layer dispatch."
    )
    before = 'from transformers import AutoModelForCausalLM\n\nmodel = AutoModelForCausalLM.from_pretrained(name, device_map="auto")\n'
    message = "`device_map` dispatch ignores TPUs (layers land on the CPU); load, then `.to(torch_xla.device())`"
    symptoms = (
        "model parameters on cpu after from_pretrained(device_map='auto')",
        # transformers' warning when device_map='auto' offloads what does not fit on the (missing) GPU
        "Some parameters are on the meta device because they were offloaded to the cpu.",
    )
    references = ("accelerate utils/modeling.py get_max_memory / infer_auto_device_map",)
    valid = (
        "from transformers import AutoModelForCausalLM\nm = AutoModelForCausalLM.from_pretrained(name)\n",
        "from transformers import AutoModelForCausalLM\nm = AutoModelForCausalLM.from_pretrained(name, device_map=None)\n",
        "from transformers import pipeline\np = pipeline('text-generation', model=m, device=-1)\n",
    )

    PIPELINE_GPU_INDEX = "`pipeline(device=<GPU index>)` needs CUDA; pass `device=torch_xla.device()`"

    def dispatches(self, device_map: cst.Arg | None) -> bool:
        """Does this `device_map=` argument hand the placement to accelerate?"""
        return is_on(device_map)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        is_pipeline = any(
            n in {"transformers.pipeline", "transformers.pipelines.pipeline"} for n in self.qualified_names(func)
        )
        if not (is_pipeline or (isinstance(func, cst.Attribute) and func.attr.value == "from_pretrained")):
            return
        device_map = keyword_arg(node, "device_map")
        if self.dispatches(device_map):
            self.report(device_map)
        device = keyword_arg(node, "device") if is_pipeline else None
        if device is not None and isinstance(device.value, cst.Integer) and device.value.evaluated_value >= 0:
            self.report(device, self.PIPELINE_GPU_INDEX)
