"""Optimizers and device moves: which calls build an optimizer, whose parameters it takes, which module a call moves."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import dotted, find_nodes, keyword_arg, positional_args, string_value
from .view import RuleView

OPTIMIZER_MODULES = ("torch.optim.", "torch_xla.amp.syncfree.", "bitsandbytes.optim.", "transformers.optimization.")
NOT_OPTIMIZERS = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.", "torch.optim.Optimizer")
DTYPE_NAMES = frozenset(
    f"torch.{n}"
    for n in (
        "float16 half bfloat16 float32 float float64 double int8 uint8 int16 short int32 int int64 long bool "
        "complex64 complex128 float8_e4m3fn float8_e5m2"
    ).split()
)


def is_optimizer(rule: RuleView, call: cst.Call) -> bool:
    for name in rule.qualified_names(call.func):
        last = name.rsplit(".", 1)[-1]
        if name.startswith(OPTIMIZER_MODULES) and not name.startswith(NOT_OPTIMIZERS) and last[:1].isupper():
            return True
        if name in {"transformers.AdamW", "transformers.Adafactor"}:
            return True
    return False


def parameter_owners(call: cst.Call) -> list[str]:
    """`model` for every `model.parameters()` / `model.named_parameters()` inside `call`."""
    owners = []
    for inner in find_nodes(call, cst.Call):
        func = inner.func
        if isinstance(func, cst.Attribute) and func.attr.value in {"parameters", "named_parameters"}:
            owner = dotted(func.value)
            if owner is not None:
                owners.append(owner)
    return owners


def related(a: str, b: str) -> bool:
    """One names the other or a submodule of it (`model` / `model.encoder`)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def moved_module(rule: RuleView, call: cst.Call) -> str | None:
    """`model` when `call` is `model.to(<device>)` or `model.cuda()`; dtype-only or CPU moves do not count."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in {"to", "cuda"}:
        return None
    owner = dotted(func.value)
    if owner is None or rule.qualified_names(func.value):  # `torch.cuda`, imported modules
        return None
    return owner if _to_device(rule, call) else None


def moved_modules(rule: RuleView, call: cst.Call) -> list[str]:
    """`moved_module`'s, or for a module built around others and moved at once (`trainer = Trainer(net_model,
    beta).to(device)`, `nn.DataParallel(model).cuda()`) the names given to it: they move as its submodules."""
    owner = moved_module(rule, call)
    if owner is not None:
        return [owner]
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in {"to", "cuda"} and type(func.value) is cst.Call):
        return []
    if not _to_device(rule, call):
        return []
    given = [a.value for a in func.value.args]
    return [name for value in given if (name := dotted(value)) is not None and not rule.qualified_names(value)]


def _to_device(rule: RuleView, call: cst.Call) -> bool:
    """Does `x.to(...)` / `x.cuda()` move to a device (not a dtype-only or CPU move)?"""
    func = call.func
    assert isinstance(func, cst.Attribute)
    if func.attr.value == "cuda":
        return True
    args = positional_args(call)
    target = args[0].value if args else getattr(keyword_arg(call, "device"), "value", None)
    if target is None or rule.qualified_names(target) & DTYPE_NAMES:
        return False
    if string_value(target) == "cpu":
        return False
    if rule.is_call_to(target, "torch.device") and positional_args(target):
        if string_value(positional_args(target)[0].value) == "cpu":
            return False
    return True
