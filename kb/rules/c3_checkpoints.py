"""C3 — checkpoints of device tensors: `torch.load` without `map_location`, `save_pretrained`, reloading, PEFT best-model loading."""

from __future__ import annotations

from bisect import bisect_right

import libcst as cst

from ..analysis.devices import cpu_utility
from ..analysis.optimizers import is_optimizer, moved_module, parameter_owners
from ..analysis.saves import may_hold_device_data, saved, writes_cpu_data
from ..cst_helpers import SCOPES, add_kwarg, code_of, dotted, find_nodes, has_star_args, keyword_arg, positional_args
from ..rule import Rule
from ..scoped_rule import ScopedRule
from .c3_hf_trainer import is_on, is_training_args


# --- checkpoints ---------------------------------------------------------------------------
class TorchLoadWithoutMapLocation(ScopedRule):
    code = "XLA307"
    needs = ("load",)
    title = "`torch.load` without `map_location` restores tensors where they were saved"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.load(f)` with no `map_location` (GPU-era checkpoints, optimizer states, `torch.save`d XLA tensors)."
    )
    why = (
        "Without `map_location` every tensor goes back to the device it was saved from. A checkpoint written on "
        "the GPU fails on a TPU host: `RuntimeError: Attempting to deserialize object on a CUDA device but "
        "torch.cuda.is_available() is False`; one written with `torch.save` from XLA tensors needs torch_xla and "
        "restores onto `xla:0` (or fails: `don't know how to restore data location of torch.FloatStorage (tagged "
        'with xla:0)`). `map_location="cpu"` always works; `load_state_dict` then copies into the device '
        "parameters and `optimizer.load_state_dict` casts state to the parameters' device."
    )
    before = 'import torch\n\nstate = torch.load("ckpt.pt")\n'
    after = 'import torch\n\nstate = torch.load("ckpt.pt", map_location="cpu")\n'
    message = 'load with `map_location="cpu"`: the checkpoint may hold CUDA or XLA tensors'
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
        if not self.is_call_to(node, "torch.load") or has_star_args(node) or self.facts().cpu_script:
            return  # a script that names no device loads what it saved from the CPU
        if len(positional_args(node)) < 2 and keyword_arg(node, "map_location") is None:
            if self._loads_own_cpu_files(node):
                return
            self.report(node, replacement=add_kwarg(node, "map_location", cst.SimpleString('"cpu"')))

    def _loads_own_cpu_files(self, load: cst.Call) -> bool:
        """The module's own saves say the file holds CPU tensors: the save to the same path writes plain data
        or CPU tensors, or (the path differs) every save of the module writes CPU tensors."""
        saves = [c for c in self.module_nodes().calls if self.is_call_to(c, "torch.save")]
        args = positional_args(load)
        path = args[0].value if args else getattr(keyword_arg(load, "f"), "value", None)
        same_path = [
            s for s in saves if path is not None and saved(s)[1] is not None and code_of(saved(s)[1]) == code_of(path)
        ]
        if same_path:
            return all(writes_cpu_data(self, s) or not may_hold_device_data(self, saved(s)[0]) for s in same_path)
        return bool(saves) and all(writes_cpu_data(self, s) for s in saves)


NOT_MODELS = ("token", "processor", "config", "extractor", "feature", "scheduler", "pipe")


class SavePretrainedXla(Rule):
    code = "XLA308"
    needs = ("save_pretrained",)
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
    before = 'model.save_pretrained("out/best")\n'
    after = 'model.save_pretrained("out/best", state_dict={k: v.cpu() for k, v in model.state_dict().items()})\n'
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
        if keyword_arg(node, "state_dict") is not None or cpu_utility(self.analysis.module):
            return  # a conversion script keeps its model on the CPU
        receiver = dotted(func.value)
        last = (receiver or code_of(func.value)).rsplit(".", 1)[-1].lower()
        if any(word in last for word in NOT_MODELS):
            return
        if receiver is None or has_star_args(node):
            self.report(node, f"{self.message} (`state_dict={{k: v.cpu() for k, v in model.state_dict().items()}}`)")
            return
        cpu_state = cst.parse_expression(f"{{k: v.cpu() for k, v in {receiver}.state_dict().items()}}")
        self.report(node, replacement=add_kwarg(node, "state_dict", cpu_state))


class ReloadIntoNewModel(Rule):
    code = "XLA309"
    needs = ("optim", "syncfree", "adamw", "adafactor")
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
        '(`model.load_state_dict(torch.load(path, map_location="cpu"))` — it copies into the device parameters '
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
        '    model.load_state_dict(torch.load("best.pt", map_location="cpu"))\n'
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
        assigns, nodes, starts = self._scope_nodes(scope)
        for assign in assigns:
            name = next((dotted(t.target) for t in assign.targets if dotted(t.target) in owners), None)
            if name is None or self._start(assign) < built or not self._is_new_model(assign.value, name):
                continue
            after = nodes[bisect_right(starts, self._end(assign)) :]
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

    def _scope_nodes(self, scope: cst.CSTNode) -> tuple[list[cst.Assign], list[cst.CSTNode], list[int]]:
        """The scope's assignments, its calls and names in source order, and their starts (sorted): walked
        once per scope, not once per optimizer (a module of many scripts has many; that was quadratic)."""
        scopes = self.__dict__.setdefault("_scopes", {})  # id -> (scope, its nodes): the scope is kept alive
        if id(scope) not in scopes:
            nodes = find_nodes(scope, cst.Call, cst.Name)
            scopes[id(scope)] = (scope, find_nodes(scope, cst.Assign), nodes, [self._start(n) for n in nodes])
        return scopes[id(scope)][1:]

    def _start(self, node: cst.CSTNode) -> int:
        return self.analysis.walk_span(node)[0]

    def _end(self, node: cst.CSTNode) -> int:
        return self.analysis.walk_span(node)[1]

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
            isinstance(c.func, cst.Attribute)
            and c.func.attr.value == "load_state_dict"
            and dotted(c.func.value) == name
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


class BestModelWithPeft(Rule):
    code = "XLA310"
    needs = ("load_best_model_at_end",)
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
        'args = TrainingArguments("out", load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch")\n'
    )
    message = (
        "best-model reload with PEFT on TPU: verify the checkpoint holds the adapter (adapter_model.safetensors) "
        "and its metric reproduces"
    )
    symptoms = ("Found missing adapter keys while loading the checkpoint", "adapter_model.safetensors missing")
    references = ("huggingface/transformers PR #29388", "huggingface/transformers #36004")
    valid = (
        "from transformers import TrainingArguments\nargs = TrainingArguments('out', load_best_model_at_end=True)\n",
    )

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
