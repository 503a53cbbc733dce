"""What a `torch.save` writes: a state dict (device tensors when the model is on the device) or data known
to be on the CPU. Shared by the rules about saving (XLA701) and loading (XLA307) checkpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ..cst_helpers import block_of, dotted, every_call, method_name

if TYPE_CHECKING:
    from .view import RuleView, ScopedView


def holds_state_dict(node: cst.CSTNode) -> bool:
    """`m.state_dict()`, or a dict literal with such a value (a checkpoint dict)."""
    if isinstance(node, cst.Call):
        return isinstance(node.func, cst.Attribute) and node.func.attr.value == "state_dict"
    if isinstance(node, cst.Dict):
        return any(holds_state_dict(e.value) for e in node.elements if isinstance(e, cst.DictElement))
    return False


def moved_to_cpu(rule: RuleView, save: cst.Call, data: cst.CSTNode) -> bool:
    """`model.eval().cpu()` earlier in the block of `torch.save(model.state_dict(), ...)`: CPU tensors."""
    if not (isinstance(data, cst.Call) and isinstance(data.func, cst.Attribute)):
        return False
    owner = dotted(data.func.value)
    stmt = rule.statement_of(save)
    block = block_of(rule, stmt) if stmt is not None else None
    if owner is None or block is None:
        return False
    for line in block.body:
        if line is stmt:
            return False
        for call in every_call(line):
            receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
            while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
                receiver = receiver.func.value  # `model.eval().cpu()` -> model
            if method_name(call) == "cpu" and receiver is not None and dotted(receiver) == owner:
                return True
    return False


# Calls that return CPU tensors whatever the model's device: FSDP consolidates the full optimizer state on the
# CPU (`full_optim_state_dict` offloads to the CPU).
CPU_STATE_CALLS = frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel.full_optim_state_dict",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel.full_optim_state_dict",
    }
)
MODEL_WORDS = ("model", "net", "module", "state", "ckpt", "checkpoint", "optim", "snapshot")


def saved(call: cst.Call) -> tuple[cst.BaseExpression | None, cst.BaseExpression | None]:
    """(data, path) of `torch.save(data, path)` (also `obj=`, `f=`)."""
    args = [a for a in call.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    data = args[0].value if args else keywords.get("obj")
    path = args[1].value if len(args) > 1 else keywords.get("f")
    return data, path


def writes_cpu_data(rule: ScopedView, save: cst.Call) -> bool:
    """Evidence that `torch.save` writes CPU tensors: the model moved to the CPU just before, a value named for
    the CPU (`cpu_state`), or one from a call that gathers on the CPU."""
    data, _ = saved(save)
    if data is None:
        return False
    if moved_to_cpu(rule, save, data):
        return True
    if isinstance(data, cst.Name):
        if "cpu" in data.value.lower().split("_"):
            return True
        values = rule.assigned_values(data)
        return bool(values) and all(
            isinstance(v, cst.Call) and rule.qualified_names(v.func) & CPU_STATE_CALLS for v in values
        )
    return False


def may_hold_device_data(rule: ScopedView, data: cst.BaseExpression | None) -> bool:
    """Could the saved value hold device tensors: a state dict, a model or checkpoint (by name), or a value
    moved to a device? A plain data value (a vocabulary's vectors, a metrics list) is not, unless moved."""
    if data is None or holds_state_dict(data):
        return True
    text = (dotted(data) or "").lower()
    if not text or any(word in text for word in MODEL_WORDS):
        return True
    if isinstance(data, cst.Name):
        return any(
            holds_state_dict(v) or (isinstance(v, cst.Call) and method_name(v) in ("to", "cuda"))
            for v in rule.assigned_values(data)
        )
    return False


# Calls that write their data to disk as it is: a dtype change in what they are given changes the file.
SAVE_CALLS = frozenset(
    {"torch.save", "torch_xla.core.xla_model.save", "safetensors.torch.save_file", "safetensors.torch.save_model"}
)
SAVE_METHODS = frozenset({"save_pretrained"})


def is_save(rule: RuleView, call: cst.Call) -> bool:
    return method_name(call) in SAVE_METHODS or bool(rule.qualified_names(call.func) & SAVE_CALLS)


def flows_to_save(rule: ScopedView, node: cst.CSTNode) -> bool:
    """Is the value of `node` written to disk: inside the arguments of a save (`torch.save({k: v.half() ...})`),
    or assigned to a name (`state = ...`, `sd[k] = ...`) that a save in the same function writes?"""
    holder: cst.CSTNode | None = None
    for anc in rule.ancestors(node):
        if isinstance(anc, cst.Call) and is_save(rule, anc):
            return True
        if isinstance(anc, (cst.Assign, cst.AnnAssign)):
            target = anc.targets[0].target if isinstance(anc, cst.Assign) else anc.target
            while isinstance(target, (cst.Subscript, cst.Attribute)) and not isinstance(target, cst.Name):
                target = target.value  # `sd[k] = ...` fills `sd`
            holder = target if isinstance(target, cst.Name) else None
            break
        if isinstance(anc, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return False
    if holder is None:
        return False
    scope = rule.scope_node(node)
    for call in rule.nodes_in(scope, False).calls:
        if is_save(rule, call) and any(
            isinstance(n, cst.Name) and n.value == holder.value
            for arg in call.args
            for n in rule.nodes_in(arg.value).names
        ):
            return True
    return False
