"""Every kb entry, listed in one place: the modules below hold the rules, each a concrete `Rule` class with its
own code, defined in that module. Nothing registers itself by being imported; a rule module that is not listed
here is not part of the kb, and tests/kb/test_registry.py fails until it is.
"""

from __future__ import annotations

from types import ModuleType

from xlaport.targets import DEFAULT_TARGET, check_target

from . import configs, tpu_pins
from .rule import Rule
from .rules import (
    c1_cuda_only,
    c1_env_vars,
    c1_kernel_choice,
    c1_removed_apis,
    c2_compile_and_launch,
    c2_cuda_runtime,
    c2_device_flow,
    c2_device_handles,
    c2_device_moves,
    c2_seeds,
    c2_tensor_types,
    c3_checkpoints,
    c3_hf_trainer,
    c3_model_loading,
    c3_stale_optimizer,
    c3_weight_tying,
    c4_barriers,
    c4_dynamic_shapes,
    c4_generation,
    c4_host_sync,
    c4_recompiles,
    c5_amp,
    c5_fallback_ops,
    c5_full_reductions,
    c5_inference_mode,
    c5_numerics,
    c5_op_rewrites,
    c6_memory,
    c7_checkpoints,
    c7_distributed,
    c7_profiling,
    c7_sharding,
    tpu_device,
)

RULE_MODULES: tuple[ModuleType, ...] = (
    c1_cuda_only,
    c1_env_vars,
    c1_kernel_choice,
    c1_removed_apis,
    c2_compile_and_launch,
    c2_cuda_runtime,
    c2_device_flow,
    c2_device_handles,
    c2_device_moves,
    c2_seeds,
    c2_tensor_types,
    c3_checkpoints,
    c3_hf_trainer,
    c3_model_loading,
    c3_stale_optimizer,
    c3_weight_tying,
    c4_barriers,
    c4_dynamic_shapes,
    c4_generation,
    c4_host_sync,
    c4_recompiles,
    c5_amp,
    c5_fallback_ops,
    c5_full_reductions,
    c5_inference_mode,
    c5_numerics,
    c5_op_rewrites,
    c6_memory,
    c7_checkpoints,
    c7_distributed,
    c7_profiling,
    c7_sharding,
    tpu_device,
    configs,  # config files and run scripts
    tpu_pins,  # the torch_tpu target's library pins
)


def rules_in(module: ModuleType) -> list[type[Rule]]:
    """The rules a module defines: its `Rule` classes that set a code of their own (bases set none)."""
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Rule)
        and value.__module__ == module.__name__
        and "code" in vars(value)
    ]


def _by_code(modules: tuple[ModuleType, ...]) -> dict[str, type[Rule]]:
    rules: dict[str, type[Rule]] = {}
    for module in modules:
        for rule in rules_in(module):
            if rule.code in rules:
                raise ValueError(f"duplicate rule code {rule.code} ({rules[rule.code].__module__}, {module.__name__})")
            rules[rule.code] = rule
    return rules


RULES: dict[str, type[Rule]] = _by_code(RULE_MODULES)


def all_rules(target: str = DEFAULT_TARGET) -> list[type[Rule]]:
    """The rules that apply to `target` (xlaport/targets.py), by code."""
    return sorted((r for r in RULES.values() if target in r.targets), key=lambda r: r.code)


def get_rule(code: str) -> type[Rule]:
    try:
        return RULES[code.upper()]
    except KeyError:
        raise KeyError(f"unknown rule code {code!r}") from None


def select_rules(
    select: list[str] | None = None, ignore: list[str] | None = None, target: str = DEFAULT_TARGET
) -> list[type[Rule]]:
    """Rules of `target` whose code starts with one of `select` (a code, a prefix like `XLA1`, or a category `C4`)."""
    chosen = all_rules(check_target(target))

    def matches(rule: type[Rule], patterns: list[str]) -> bool:
        return any(rule.code.startswith(p.upper()) or rule.category == p.upper() for p in patterns)

    unknown = [p for p in (select or []) + (ignore or []) if not any(matches(r, [p]) for r in chosen)]
    if unknown:  # a typo in --ignore is as much a mistake as one in --select
        raise KeyError(f"no rule matches {', '.join(unknown)}")
    if select:
        chosen = [r for r in chosen if matches(r, select)]
    if ignore:
        chosen = [r for r in chosen if not matches(r, ignore)]
    return chosen
