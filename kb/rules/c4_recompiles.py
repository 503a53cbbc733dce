"""C4 — input shapes that change every step: padding to the longest sequence, a short last batch, a growing generation cache."""

from __future__ import annotations

import libcst as cst

from ..analysis import steps
from ..cst_helpers import DATALOADERS, add_kwarg, identifier, keyword_arg, method_name, positional_args, string_value
from ..step_rule import StepContextRule

COLLATORS = frozenset(
    {
        "DataCollatorWithPadding",
        "DataCollatorForSeq2Seq",
        "DataCollatorForTokenClassification",
        "DataCollatorForLanguageModeling",
        "DataCollatorForWholeWordMask",
    }
)


# Sizes of torchvision's standard splits (train=True, train=False): a batch size that divides one leaves no
# partial last batch.
SPLIT_SIZES = {
    "MNIST": (60000, 10000),
    "FashionMNIST": (60000, 10000),
    "KMNIST": (60000, 10000),
    "CIFAR10": (50000, 10000),
    "CIFAR100": (50000, 10000),
}
EVAL_WORDS = ("test", "val", "eval")


def _is_collator(names: set[str]) -> bool:
    return any(n.startswith("transformers.") and n.rsplit(".", 1)[-1] in COLLATORS for n in names)


class PadToLongest(StepContextRule):
    code = "XLA412"
    needs = ("padding",)
    title = "Tokenizer pads to the longest sequence: a new input shape per batch"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "Tokenizer calls (`tokenizer(...)`, `tokenizer.pad(...)`, `batch_encode_plus`) with `padding=True` or "
        '`padding="longest"`. When `max_length` is given, the fix pads to it: `padding="max_length"`.'
    )
    why = (
        "Each batch gets the length of its longest sequence, so XLA sees a new shape and compiles a new graph "
        "almost every step (`UncachedCompile` grows, `pt-xla-profiler: CompileTime too frequent`). Fixed lengths "
        "(or a few buckets) compile once. Padding more changes the compute per step, and losses that do not "
        "mask pads change: review the fix."
    )
    before = 'enc = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")\n'
    after = 'enc = tokenizer(texts, padding="max_length", truncation=True, max_length=128, return_tensors="pt")\n'
    message = (
        "padding to the longest sequence gives XLA a new shape (a new compile) per batch; pad to a fixed "
        '`max_length` (`padding="max_length"`) or to a few bucket sizes'
    )
    symptoms = ("pt-xla-profiler: CompileTime too frequent", "UncachedCompile", "CompileTime")
    references = ("huggingface/accelerate examples/nlp_example.py", "huggingface/trl#2001", "pytorch/xla#1509")
    valid = (
        'enc = tokenizer(texts, padding="max_length", max_length=128)\n',
        "import torch\nconv = torch.nn.Conv2d(3, 8, 3, padding=1)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        padding = keyword_arg(node, "padding")
        if padding is None or not _pads_to_longest(padding.value):
            return
        names = self.qualified_names(node.func)
        if _is_collator(names) or any(n.startswith("torch") for n in names):
            return  # collators: XLA413
        if keyword_arg(node, "max_length") is not None:
            new_value = cst.SimpleString('"max_length"')
            self.report(padding.value, replacement=new_value)
        else:
            self.report(node)


def _pads_to_longest(value: cst.CSTNode) -> bool:
    return (isinstance(value, cst.Name) and value.value == "True") or string_value(value) == "longest"


class CollatorPadsToLongest(StepContextRule):
    code = "XLA413"
    title = "Collator pads each batch to its longest sequence"
    category = "C4"
    fix = "manual"
    detects = (
        "HF `DataCollatorWithPadding` / `DataCollatorForSeq2Seq` / `DataCollatorForTokenClassification` / "
        '`DataCollatorForLanguageModeling` without `pad_to_multiple_of` or `padding="max_length"`, and '
        "`torch.nn.utils.rnn.pad_sequence` (always pads to the longest)."
    )
    why = (
        "Dynamic padding makes the batch length vary from step to step; on XLA every new length is a new "
        "graph to compile (`CompileTime too frequent`). Reported ORPO training went from ~10 min to ~2 s per step "
        "after padding to a fixed length."
    )
    before = "from transformers import DataCollatorWithPadding\n\ncollator = DataCollatorWithPadding(tokenizer)\n"
    message = (
        "the collator pads to the longest sequence of each batch (a new XLA compile per length); pass "
        '`padding="max_length", max_length=N` or `pad_to_multiple_of=64`/`128` to bound the shapes'
    )
    symptoms = ("pt-xla-profiler: CompileTime too frequent", "UncachedCompile")
    references = ("huggingface/trl#2001", "pytorch/xla#1509", "pytorch/xla#3356")
    valid = (
        "from transformers import DataCollatorWithPadding\n"
        "collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=128)\n",
        "from transformers import DataCollatorWithPadding\n"
        "collator = DataCollatorWithPadding(tokenizer, padding='max_length', max_length=256)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.nn.utils.rnn.pad_sequence"):
            self.report(
                node,
                "`pad_sequence` pads to the longest sequence of the batch (a new XLA compile per length); pad to a "
                "fixed length (`F.pad` to N) or a few bucket sizes",
            )
            return
        if not _is_collator(self.qualified_names(node.func)):
            return
        if keyword_arg(node, "pad_to_multiple_of") is not None:
            return
        padding = keyword_arg(node, "padding")
        if padding is not None and string_value(padding.value) in ("max_length", "do_not_pad"):
            return
        self.report(node)


class DataLoaderWithoutDropLast(StepContextRule):
    code = "XLA414"
    needs = ("dataloader",)
    title = "Training DataLoader without `drop_last=True`: the last partial batch compiles a new graph"
    category = "C4"
    fix = "unsafe"
    autofix = True
    detects = (
        "`DataLoader(...)` used for training (`shuffle=True`, or iterated by the training-step loop) without a "
        "`drop_last` argument. The fix adds `drop_last=True`."
    )
    why = (
        "When the dataset size is not a multiple of the batch size, the last batch of every epoch has another "
        "shape: one more compile (minutes on large models), and in multi-replica runs uneven batch counts can "
        "hang collectives. `drop_last=True` drops at most `batch_size - 1` samples per epoch."
    )
    before = "from torch.utils.data import DataLoader\n\nloader = DataLoader(train_ds, batch_size=64, shuffle=True)\n"
    after = (
        "from torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(train_ds, batch_size=64, shuffle=True, drop_last=True)\n"
    )
    message = "the last partial batch has a new shape (one more XLA compile per epoch); pass `drop_last=True`"
    symptoms = ("UncachedCompile", "CompileTime", "hang at the end of an epoch (multi-replica)")
    references = ("pytorch/xla#2749", "pytorch/xla troubleshoot.md: static shapes")
    valid = (
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=64, shuffle=True, drop_last=False)\n",
        "from torch.utils.data import DataLoader\nval_loader = DataLoader(val_ds, batch_size=64)\n",
        "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_sampler=sampler, shuffle=True)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *DATALOADERS) or self.facts().cpu_script:
            return  # a script that names no device feeds a CPU model: no graph to recompile
        if keyword_arg(node, "drop_last") is not None or keyword_arg(node, "batch_sampler") is not None:
            return
        batch_size = keyword_arg(node, "batch_size")
        if batch_size is not None and isinstance(batch_size.value, cst.Name) and batch_size.value.value == "None":
            return
        target = self._target(node)
        if target is not None and (
            any(word in target.lower() for word in EVAL_WORDS) or steps.passed_to_accelerate(self, target)
        ):
            return  # an evaluation loader keeps every sample; accelerate evens out the batches of prepared ones
        if self._divides_dataset(node):
            return
        shuffle = keyword_arg(node, "shuffle")
        shuffled = shuffle is not None and isinstance(shuffle.value, cst.Name) and shuffle.value.value == "True"
        if shuffled or self._iterated_by_step_loop(node):
            self.report(node, replacement=add_kwarg(node, "drop_last", cst.Name("True")))

    def _target(self, call: cst.Call) -> str | None:
        """`loader` in `loader = DataLoader(...)`, `self.loader = ...`."""
        assign = self.parent(call)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
            return None
        return identifier(assign.targets[0].target)

    def _divides_dataset(self, call: cst.Call) -> bool:
        """A torchvision standard split whose size the (literal) batch size divides: no partial batch."""
        args = positional_args(call)
        dataset = args[0].value if args else getattr(keyword_arg(call, "dataset"), "value", None)
        batch = args[1].value if len(args) > 1 else getattr(keyword_arg(call, "batch_size"), "value", None)
        size, batch_size = self._split_size(dataset), self._integer(batch)
        return size is not None and batch_size is not None and size % batch_size == 0

    def _split_size(self, node: cst.CSTNode | None) -> int | None:
        if isinstance(node, cst.Name):
            values = self.assigned_values(node)
            node = values[0] if len(values) == 1 else None
        if not isinstance(node, cst.Call):
            return None
        for q in self.qualified_names(node.func):
            package, _, name = q.rpartition(".")
            if package.startswith("torchvision.datasets") and name in SPLIT_SIZES:
                train = keyword_arg(node, "train")
                if train is None or not isinstance(train.value, cst.Name):
                    return None
                return SPLIT_SIZES[name][0 if train.value.value == "True" else 1]
        return None

    def _integer(self, node: cst.CSTNode | None) -> int | None:
        if isinstance(node, cst.Name):
            values = self.assigned_values(node)
            node = values[0] if len(values) == 1 else None
        return int(node.value) if isinstance(node, cst.Integer) and int(node.value) > 0 else None

    def _iterated_by_step_loop(self, call: cst.Call) -> bool:
        assign = self.parent(call)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
            return False
        target = assign.targets[0].target
        if not isinstance(target, cst.Name):
            return False
        scope_node = self.scope_node(call)
        for loop in self.module_nodes().fors:
            if self.scope_node(loop) is not scope_node:
                continue
            name = self.iterated_name(loop)
            if name is not None and name.value == target.value and self.runs_step(loop):
                return True
        return False


HF_PACKAGES = ("transformers", "peft", "trl")
HF_MODEL_BUILDERS = frozenset({"peft.get_peft_model", "peft.mapping.get_peft_model", "transformers.pipeline"})
GENERATE_KWARGS = frozenset(
    {
        "max_new_tokens",
        "max_length",
        "do_sample",
        "num_beams",
        "input_ids",
        "attention_mask",
        "temperature",
        "top_k",
        "top_p",
    }
)


class GenerateWithDynamicCache(StepContextRule):
    code = "XLA415"
    needs = ("generate",)
    title = "HF `generate()` with the default dynamic KV cache recompiles every token"
    category = "C4"
    fix = "manual"
    detects = (
        "`model.generate(...)` on a Hugging Face model (assigned from an HF call, or in a module that builds one: "
        "`AutoModelForCausalLM.from_pretrained`, `get_peft_model`), without `cache_implementation=` (or a "
        "`generation_config` / `past_key_values` that could set it). A model's own `generate()` (a sampling loop, "
        "which ignores `cache_implementation`) is not reported."
    )
    why = (
        "The default DynamicCache grows by one position per generated token, so every decoding step has new "
        "shapes and XLA compiles a new graph per token: generation is extremely slow but correct. A static cache "
        '(`cache_implementation="static"`, updated in place with `index_copy_`) keeps the shapes fixed.'
    )
    before = (
        "from transformers import AutoModelForCausalLM\n\n"
        "model = AutoModelForCausalLM.from_pretrained(path)\n"
        "out = model.generate(**inputs, max_new_tokens=32)\n"
    )
    message = (
        "the dynamic KV cache changes shape every token (one XLA compile per token); pass "
        '`cache_implementation="static"` (and pad prompts to a fixed length)'
    )
    symptoms = ("pt-xla-profiler: CompileTime too frequent", "generation recompiles every token")
    references = ("huggingface/transformers#31126", "huggingface/transformers PR #31129")
    valid = (
        "from transformers import AutoModelForCausalLM\n"
        "out = model.generate(**inputs, max_new_tokens=32, cache_implementation='static')\n",
        "out = sampler.generate(prompt, max_new_tokens=3)\n",
        "import torch\n\nclass GPT(torch.nn.Module):\n    @classmethod\n    def from_pretrained(cls, name):\n"
        "        from transformers import GPT2LMHeadModel\n        return GPT2LMHeadModel.from_pretrained(name)\n\n"
        "    def generate(self, idx, max_new_tokens, top_k=None):\n        return idx\n\n"
        "model = GPT()\nraw_model = model.module if ddp else model\ny = raw_model.generate(x, 32, top_k=40)\n",
        "from transformers import AutoTokenizer\n\ndef sample(model, tokenizer, prompt):\n"
        "    ids = tokenizer(prompt, return_tensors='pt').input_ids\n"
        "    return model.generate(ids, max_new_tokens=64, temperature=0.8, top_k=50)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) != "generate":
            return
        facts = self.facts()
        if not facts.uses(*HF_PACKAGES) or facts.sets_static_cache:
            return
        keywords = {a.keyword.value for a in node.args if a.keyword is not None}
        if keywords & {"cache_implementation", "generation_config", "past_key_values"}:
            return
        if self._model_of_another_library(node.func.value) or self._own_generate():
            return
        if not self._hf_model_here(node.func.value):
            return  # a model handed in from elsewhere, in a module that loads no HF model: its own generate, maybe
        if keywords & GENERATE_KWARGS or any(a.star == "**" for a in node.args):
            self.report(node)

    def _own_generate(self) -> bool:
        """Does the module write its own model with a `generate` method (a top-level class that subclasses nothing
        from Hugging Face, as llm.c's `GPT`)? Its calls are that sampling loop, with no KV cache to configure."""
        for stmt in self.analysis.module.body:
            if not isinstance(stmt, cst.ClassDef):
                continue
            methods = {s.name.value for s in stmt.body.body if isinstance(s, cst.FunctionDef)}
            bases = {n for b in stmt.bases for n in self.qualified_names(b.value)}
            if "generate" in methods and not any(n.split(".")[0] in HF_PACKAGES for n in bases):
                return True
        return False

    def _hf_model_here(self, receiver: cst.CSTNode) -> bool:
        """Evidence that `receiver` is a Hugging Face model: it is assigned from an HF call, or the module
        builds an HF model somewhere (`AutoModelForCausalLM.from_pretrained`, `get_peft_model`). Importing
        a tokenizer alone says nothing: `model.generate(...)` may be the project's own sampling loop, which
        has no `cache_implementation` to set."""
        if isinstance(receiver, cst.Name):
            for value in self.assigned_values(receiver):
                if isinstance(value, cst.Call) and self.qualified_startswith(value.func, *HF_PACKAGES):
                    return True
        for call in self.module_nodes().calls:
            for name in self.qualified_names(call.func):
                parts = name.split(".")
                if parts[0] not in HF_PACKAGES:
                    continue
                if name in HF_MODEL_BUILDERS or (
                    parts[-1] in ("from_pretrained", "from_config")
                    and len(parts) > 2
                    and ("Model" in parts[-2] or "For" in parts[-2])
                ):
                    return True
        return False

    def _model_of_another_library(self, receiver: cst.CSTNode) -> bool:
        """`model = GPT.from_pretrained(...)` with `GPT` imported from a package that is not Hugging Face's: its
        `generate` is that package's own (no KV cache to configure)."""
        if not isinstance(receiver, cst.Name):
            return False
        values = self.assigned_values(receiver)
        owners = [self.qualified_names(v.func) if isinstance(v, cst.Call) else set() for v in values]
        return bool(owners) and all(
            names and not any(n.split(".")[0] in HF_PACKAGES for n in names) for names in owners
        )
