"""What a module's tests of device flags guard, for the tree summary (`ModuleSteps.gates`): `if args.cuda:` around
`model.cuda()` chooses the device; around a CUDA-only call, or a move of a sparse tensor, it is blocked
(devices.py `flag_tests`, project_steps.py `_device_flags`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ..cst_walk import walk
from .device_facts import key_of
from .device_regions import region_verdict
from .devices import DeviceAnalysis
from .devices import analyse as analyse_devices
from .project import definition_name
from .sparse import is_sparse

if TYPE_CHECKING:
    from .view import StepView


def device_gates(rule: StepView) -> tuple[tuple[str, str], ...]:
    """What this module's tests of device flags guard (ModuleSteps.gates): a parameter of the function around the
    test is named by the function, any other flag by its key."""
    devices = analyse_devices(rule.analysis.module)
    found = set()
    for flag, region in devices.flag_tests():
        verdict = region_verdict(devices, region)
        if verdict is None:
            continue
        if verdict == "device" and _moves_sparse(rule, region):
            verdict = "blocked"  # no device rule moves a sparse tensor by default (XLA520 densifies: unsafe)
        function = _function_with_parameter(devices, flag)
        if function is not None:
            found.add((f"param:{definition_name(rule, function)}:{flag.value}", verdict))  # type: ignore[union-attr]
        else:
            found.add((f"key:{key_of(flag)}", verdict))
    return tuple(sorted(found))


def _moves_sparse(rule: StepView, region: cst.CSTNode) -> bool:
    """Does `region` move a sparse tensor (`adj.cuda()`, `adj.to(device)`)?"""
    for call in walk(region):
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in ("cuda", "to")
        ):
            receiver = call.func.value
            # a name that is sparse after any of its assignments may be sparse here (`adj, x = prep(adj)` then
            # `adj = to_sparse(adj).float()` before `adj.cuda()`): the flip is withheld on a doubt
            values = rule.assigned_values(receiver) if isinstance(receiver, cst.Name) else []
            if is_sparse(rule, receiver) or any(is_sparse(rule, v) for v in values):
                return True
    return False


def _function_with_parameter(devices: DeviceAnalysis, flag: cst.CSTNode) -> cst.FunctionDef | None:
    """The function around `flag` when `flag` is one of its parameters."""
    if not isinstance(flag, cst.Name):
        return None
    node = devices.parent(flag)
    while node is not None and not isinstance(node, cst.FunctionDef):
        node = devices.parent(node)
    if node is None:
        return None
    params = node.params
    names = {p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]}
    return node if flag.value in names else None
