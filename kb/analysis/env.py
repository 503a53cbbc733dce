"""Environment variables a module sets in code: `os.environ[K] = v`, `setdefault`, `update`, `os.putenv`."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..cst_helpers import positional_args, string_value
from .view import RuleView


@dataclass
class EnvWrite:
    """One environment variable set in code: `os.environ[key] = value` and friends."""

    key: str
    value: cst.BaseExpression | None
    node: cst.CSTNode  # where the finding is reported


def env_writes(rule: RuleView, node: cst.Assign | cst.Call) -> list[EnvWrite]:
    """Env vars that `node` sets: `os.environ[K] = v`, `os.environ.setdefault(K, v)`,
    `os.environ.update({K: v})` / `update(K=v)` and `os.putenv(K, v)` (K a string literal)."""
    found: list[EnvWrite] = []
    if isinstance(node, cst.Assign):
        for target in node.targets:
            sub = target.target
            if not (isinstance(sub, cst.Subscript) and "os.environ" in rule.qualified_names(sub.value)):
                continue
            if len(sub.slice) == 1 and isinstance(sub.slice[0].slice, cst.Index):
                key = string_value(sub.slice[0].slice.value)
                if key is not None:
                    found.append(EnvWrite(key, node.value, node))
        return found
    if rule.is_call_to(node, "os.environ.setdefault", "os.putenv"):
        args = positional_args(node)
        key = string_value(args[0].value) if args else None
        if key is not None:
            found.append(EnvWrite(key, args[1].value if len(args) > 1 else None, node))
    elif rule.is_call_to(node, "os.environ.update"):
        for arg in node.args:
            if arg.keyword is not None:
                found.append(EnvWrite(arg.keyword.value, arg.value, node))
            elif isinstance(arg.value, cst.Dict):
                for element in arg.value.elements:
                    key = string_value(getattr(element, "key", None))
                    if key is not None:
                        found.append(EnvWrite(key, element.value, node))
    return found
