"""Parameter sharing (tied weights) of a module, and whether a device move lost it.

`Module.to(xla_device)` creates a new `nn.Parameter` per module, so two modules that shared one
parameter hold two after the move (kb entry XLA314). The execution check and the generated tests
compare `shared_groups` before and after a move. Only torch is used (the check's child imports this).
"""

from __future__ import annotations

from typing import Any


def shared_groups(module: Any) -> list[list[str]]:
    """Names of the parameters that are one object, one sorted group per shared object (2+ names)."""
    names_by_id: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names_by_id.setdefault(id(param), []).append(name)
    return sorted(sorted(names) for names in names_by_id.values() if len(names) > 1)


def lost_groups(before: list[list[str]], module: Any) -> list[list[str]]:
    """The groups of `before` whose names are no longer one object in `module`."""
    after = {name: i for i, group in enumerate(shared_groups(module)) for name in group}
    lost = []
    for group in before:
        if len({after.get(name, f"alone:{name}") for name in group}) > 1:
            lost.append(group)
    return lost


def describe(groups: list[list[str]]) -> str:
    """`lm_head.weight = transformer.wte.weight; ...`."""
    return "; ".join(" = ".join(group) for group in groups) or "none"


def lost_ties_message(owner: str, lost: list[list[str]]) -> str:
    return (
        f"{owner}: moving it to the device untied {len(lost)} shared parameter group(s) ({describe(lost)}): "
        "each module now trains its own copy; tie them again after the move (kb XLA314)"
    )
