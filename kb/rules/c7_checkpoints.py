"""C7 — saving and loading checkpoints of device tensors."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import parse_template_expression

from ..analysis.device_facts import key_of
from ..analysis.devices import analyse as analyse_devices
from ..analysis.devices import cpu_utility
from ..analysis.saves import holds_state_dict, moved_to_cpu
from ..cst_helpers import (
    expr,
    is_cuda_string,
    keyword_arg,
    positional_args,
    same_quotes,
    string_value,
)
from ..rule import IMPORT_TORCH_XLA, IMPORT_XM, Rule
from ..scoped_rule import ScopedRule


class TorchSaveDeviceTensors(ScopedRule):
    code = "XLA701"
    needs = ("save",)
    title = "`torch.save(model.state_dict())` writes XLA tensors: use `xm.save`"
    category = "C7"
    fix = "unsafe"
    autofix = True
    detects = (
        "`torch.save(x.state_dict(), path)` and `torch.save({... x.state_dict() ...}, path)` (checkpoint dicts). "
        "Calls with extra arguments (`pickle_protocol=`, ...) are reported without a rewrite."
    )
    why = (
        "A `torch.save` of device tensors pickles them as XLA tensors: loading needs torch_xla and a device and "
        "puts them back on `xla:0`; on a CPU-only host it fails with `don't know how to restore data location of "
        "torch.FloatStorage (tagged with xla:0)` (transformers #4963). `xm.save(data, path)` first syncs and copies "
        "every tensor of the (nested) object to the CPU, then writes. Unsafe because `xm.save` writes only on "
        "each host's master process (`master_only=True`): code that saves a different file per rank must pass "
        "`master_only=False`. Prefer `.state_dict()`: `xm.save` converts plain tensors, not `nn.Parameter`s."
    )
    before = "import torch\n\ntorch.save(model.state_dict(), 'model.pt')\n"
    after = "import torch_xla.core.xla_model as xm\n\nxm.save(model.state_dict(), 'model.pt')\n"
    message = "`torch.save` of device tensors reloads onto xla:0; use `xm.save` (CPU copy, master process writes)"
    symptoms = (
        "don't know how to restore data location of torch.FloatStorage (tagged with xla:0)",
        "RuntimeError: don't know how to restore data location of torch.storage.UntypedStorage (tagged with xla:0)",
        "Attempted to access the data pointer on an invalid python storage",
    )
    references = (
        "docs/source/learn/pytorch-on-xla-devices.md Saving and Loading",
        "docs/source/learn/troubleshoot.md XLA Tensor Quirks",
        "huggingface/transformers #4963",
        "torch_xla/core/xla_model.py save",
    )
    valid = (
        "import torch_xla.core.xla_model as xm\nxm.save(model.state_dict(), 'm.pt')\n",
        "import torch\ntorch.save(metrics, 'metrics.pt')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.save") or self.facts().cpu_script or cpu_utility(self.analysis.module):
            return  # a script that names no device, or keeps it on the CPU (a conversion script), saves CPU tensors
        args = positional_args(node)
        data = args[0].value if args else getattr(keyword_arg(node, "obj"), "value", None)
        if data is None or not holds_state_dict(data) or moved_to_cpu(self, node, data):
            return
        if len(args) == 2 and len(node.args) == 2:
            self.report(node, replacement=node.with_changes(func=expr("xm.save")), imports=(IMPORT_XM,))
        else:
            self.report(node, self.message + "; drop the extra torch.save arguments")


class LoadOntoCudaOrXla(Rule):
    code = "XLA711"
    needs = ("load",)
    title = "`torch.load(..., map_location='cuda')`: load on the CPU, then move"
    category = "C7"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.load` whose `map_location` is a CUDA device (`'cuda'`, `'cuda:0'`, `torch.device('cuda')`, an int "
        "index such as `torch.device(gpu)`) or an XLA device (`'xla'`, `torch_xla.device()`), written there or held "
        "by a name (`map_location=device` after `device = 'cuda'`: the device-value analysis)."
    )
    why = (
        "On a TPU host mapping to CUDA raises `RuntimeError: Attempting to deserialize object on a CUDA device but "
        "torch.cuda.is_available() is False`, and mapping straight to XLA is not supported either "
        "(`don't know how to restore data location of torch.storage.UntypedStorage (tagged with xla:0)`). The fix "
        "loads on the CPU and moves every tensor of the result to the device the program asked for "
        "(`torch.utils._pytree.tree_map_only`): the same values on the same device, whatever the checkpoint holds "
        "(a state dict, a dict of data tensors, a bare tensor). Handed straight to `load_state_dict`, `'cpu'` alone "
        "is enough: it copies into the device parameters. Tensors inside other objects (a pickled module or class) "
        "stay on the CPU: move those by hand."
    )
    before = "import torch\n\nstate = torch.load('ckpt.pt', map_location='cuda:0')\n"
    after = (
        "import torch\nimport torch_xla\n\nstate = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: "
        "t.to(torch_xla.device()), torch.load('ckpt.pt', map_location='cpu'))\n"
    )
    message = "load checkpoints with `map_location='cpu'`, then move the tensors to the device"
    symptoms = (
        "RuntimeError: Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. "
        "If you are running on a CPU-only machine, please use torch.load with map_location=torch.device('cpu') "
        "to map your storages to the CPU.",
        "don't know how to restore data location of torch.storage.UntypedStorage (tagged with xla:0)",
    )
    references = ("huggingface/transformers #4963", "accelerate optimizer.py move_to_device")
    valid = (
        "import torch\nsd = torch.load('c.pt', map_location='cpu')\n",
        "import torch\nsd = torch.load('c.pt', map_location=device)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.load"):
            return
        positional = positional_args(node)
        arg = positional[1] if len(positional) > 1 else keyword_arg(node, "map_location")
        if arg is None or not self._device_target(arg.value):
            return
        value = arg.value
        cpu = same_quotes(value, "cpu") if isinstance(value, cst.SimpleString) else cst.SimpleString('"cpu"')
        if self._into_load_state_dict(node):
            self.report(value, replacement=cpu)
            return
        # a name holding the device keeps it (the device flow makes it the XLA device); any other device
        # expression is the one XLA device of this process
        held = isinstance(value, (cst.Name, cst.Attribute)) and not self.qualified_names(value)
        device = value if held else expr("torch_xla.device()")
        on_cpu = node.deep_replace(value, cpu)
        moved = parse_template_expression(
            "torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to({device}), {load})",
            device=device,
            load=on_cpu,
        )
        self.report(node, replacement=moved, imports=() if held else (IMPORT_TORCH_XLA,))

    def _into_load_state_dict(self, call: cst.Call) -> bool:
        """`x.load_state_dict(torch.load(...))`: the load's result goes straight into a copy onto the device."""
        arg = self.parent(call)
        outer = self.parent(arg) if isinstance(arg, cst.Arg) else None
        return (
            isinstance(outer, cst.Call)
            and isinstance(outer.func, cst.Attribute)
            and outer.func.attr.value == "load_state_dict"
        )

    def _device_target(self, value: cst.BaseExpression) -> bool:
        facts = analyse_devices(self.analysis.module).facts
        if any(value is n for n in facts.map_locations):
            # a name that holds the device (`map_location=device`, `device = 'cuda'` above), unless XLA226 makes
            # its CUDA origin 'cpu' (a name used only as a map_location)
            return not (key_of(value) in facts.map_location_keys and key_of(value) in facts.origin_keys.values())
        if any(value is n for n in facts.int_devices):
            return True  # `map_location=rank`: an int device is a CUDA index
        text = string_value(value)
        if text is not None:
            return is_cuda_string(value) or text == "xla" or text.startswith("xla:")
        if not isinstance(value, cst.Call):
            return False
        if self.is_call_to(value, "torch_xla.device", "torch_xla.core.xla_model.xla_device"):
            return True
        if self.is_call_to(value, "torch.device"):
            args = positional_args(value)
            if args and any(args[0].value is n for n in facts.int_devices):
                return True  # `torch.device(gpu)`: an int index is a CUDA device (XLA227 leaves it to this rule)
            return bool(args) and (is_cuda_string(args[0].value) or string_value(args[0].value) in {"xla"})
        return False
        if self.is_call_to(value, "torch_xla.device", "torch_xla.core.xla_model.xla_device"):
            return True
        if self.is_call_to(value, "torch.device"):
            args = positional_args(value)
            return bool(args) and (is_cuda_string(args[0].value) or string_value(args[0].value) in {"xla"})
        return False
