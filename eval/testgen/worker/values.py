"""Inputs from specs (seeded, on the CPU, then moved to the side's device) and outputs flattened for comparison."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

MARK = "__xlaport__"  # key of an input spec dict (a literal dict argument never has it)
INPUT_KEYS = {"init_args": list, "init_kwargs": dict, "args": list, "kwargs": dict}  # in materializing order


def materialize(value: Any, generator) -> Any:
    """Turns input specs into CPU tensors, in order, from one seeded generator."""
    import torch

    if isinstance(value, dict) and MARK in value:
        kind = value[MARK]
        if kind == "randn":
            dtype = getattr(torch, value.get("dtype", "float32"))
            return torch.randn(value["shape"], generator=generator).to(dtype)
        if kind == "randint":
            return torch.randint(value["low"], value["high"], value["shape"], generator=generator)
        if kind == "device":
            return value  # replaced per side by to_side
        raise ValueError(f"unknown input spec {kind!r}")
    if isinstance(value, list):
        return [materialize(v, generator) for v in value]
    if isinstance(value, dict):
        return {k: materialize(v, generator) for k, v in value.items()}
    return value


def load_inputs(spec: dict, seed: int) -> dict:
    """{"args", "kwargs", "init_args", "init_kwargs"} on the CPU, from a spec or a recording."""
    import torch

    if spec.get("recorded"):
        # the user's own recording (it may hold arbitrary picklable objects, so not weights_only)
        data = torch.load(spec["recorded"], map_location="cpu", weights_only=False)
    else:
        generator = torch.Generator().manual_seed(seed)
        data = {key: materialize(spec.get(key) or empty(), generator) for key, empty in INPUT_KEYS.items()}
    return {key: data.get(key) or empty() for key, empty in INPUT_KEYS.items()}


def to_side(value: Any, device, device_arg: Any) -> Any:
    """Moves tensors (and modules) to the side's device; the device marker becomes `device_arg`."""
    import torch

    if isinstance(value, dict) and value.get(MARK) == "device":
        return device_arg
    if isinstance(value, torch.device) and value.type in ("cuda", "cpu"):
        # a device recorded under the shim, where the CPU stands for CUDA: the side's device
        return device_arg if isinstance(device_arg, torch.device) else torch.device(device_arg)
    if isinstance(value, torch.Tensor | torch.nn.Module):
        return value.to(device)
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(to_side(v, device, device_arg) for v in value)
    if isinstance(value, dict):
        return {k: to_side(v, device, device_arg) for k, v in value.items()}
    return value


def module_parameters(values: list) -> list[tuple[Any, list]]:
    """(module, its parameters) for the modules among `values`, taken before they move."""
    import torch

    return [(v, list(v.named_parameters(remove_duplicate=False))) for v in values if isinstance(v, torch.nn.Module)]


def follow_moved_parameters(values: list, before: list[tuple[Any, list]]) -> None:
    """Optimizers among the arguments hold the parameters of module arguments; a move to XLA replaced
    those by new ones, so point the optimizers at the moved parameters (as building them after the move would)."""
    import torch

    new_by_old = {}
    for module, params in before:
        now = dict(module.named_parameters(remove_duplicate=False))
        new_by_old.update({id(p): now[name] for name, p in params if name in now})
    for value in values:
        if isinstance(value, torch.optim.Optimizer):
            for group in value.param_groups:
                group["params"] = [new_by_old.get(id(p), p) for p in group["params"]]


def draws_random_numbers(module) -> bool:
    """Dropout layers with p > 0: the two sides' generators differ, so their results cannot match."""
    import torch.nn as nn

    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


# ---------------------------------------------------------------- outputs


def flatten(value: Any, path: str, into: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """{"output[0]": tensor, "output['loss']": 1.5, ...}: every leaf under a readable path."""
    import torch

    if depth > 8:
        into[path] = f"<{type(value).__name__}>"
    elif isinstance(value, torch.Tensor):
        into[path] = value
    elif value is None or isinstance(value, bool | int | float | str | complex):
        into[path] = value
    elif isinstance(value, torch.Size):
        into[path] = list(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            flatten(item, f"{path}[{key!r}]", into, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            flatten(getattr(value, field.name), f"{path}.{field.name}", into, depth + 1)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            flatten(item, f"{path}[{i}]", into, depth + 1)
    else:
        into[path] = f"<{type(value).__name__}>"  # devices, modules, custom objects: compared by type only
    return into


def weighted_sum(outputs: dict[str, Any], seed: int):
    """sum(output * fixed random weights) over the float outputs that need grad (a plain sum gives
    zero gradients through softmax-like outputs)."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    total = None
    for value in outputs.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.requires_grad:
            weights = torch.randn(value.shape, generator=generator).to(value.device)
            term = (value.float() * weights).sum()
            total = term if total is None else total + term
    return total
