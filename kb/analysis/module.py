"""The per-module analysis record: the engine builds one per lint pass and hands it to every rule."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import libcst as cst

Span = tuple[tuple[int, int], tuple[int, int]]  # ((line, column), (line, column))


@dataclass
class Scope:
    """What one function (or the module) binds, without nested functions and classes."""

    assigns: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)
    backward_names: set[str] = field(default_factory=set)
    params: set[str] = field(default_factory=set)
    tensor_params: set[str] = field(default_factory=set)


@dataclass
class ModuleFacts:
    qnames: set[str] = field(default_factory=set)
    nn_keys: set[str] = field(default_factory=set)  # `criterion`, `self.fc`: assigned from torch.nn.<Module>()
    optimizer_keys: set[str] = field(default_factory=set)
    device_loader_keys: set[str] = field(default_factory=set)
    device_code: bool = False
    # A script (imports torch; a `__main__` block or a module-level loop) that names no device anywhere: no
    # `cuda`, `xla`, `mps`, `device`, `accelerator` or `gpu` in a name or string. Its tensors live on the CPU.
    # (A fragment without imports is taken as part of a larger device program.)
    cpu_script: bool = False
    uses_bf16: bool = False
    sets_static_cache: bool = False

    def uses(self, *prefixes: str) -> bool:
        return any(q == p or q.startswith(p + ".") for q in self.qnames for p in prefixes)


@dataclass
class Nodes:
    """Nodes of one kind each, in a module or a subtree."""

    calls: list[cst.Call] = field(default_factory=list)
    assigns: list[cst.Assign | cst.AugAssign | cst.AnnAssign] = field(default_factory=list)
    names: list[cst.Name | cst.Attribute] = field(default_factory=list)
    strings: list[cst.SimpleString] = field(default_factory=list)
    fors: list[cst.For] = field(default_factory=list)
    functions: list[cst.FunctionDef | cst.Lambda] = field(default_factory=list)

    def add(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.Call):
            self.calls.append(node)
        elif isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            self.assigns.append(node)
        elif isinstance(node, (cst.Name, cst.Attribute)):
            self.names.append(node)
        elif isinstance(node, cst.SimpleString):
            self.strings.append(node)
        elif isinstance(node, cst.For):
            self.fors.append(node)
        elif isinstance(node, (cst.FunctionDef, cst.Lambda)):
            self.functions.append(node)


@dataclass
class ModuleAnalysis:
    """What the rules of one lint pass share about its module. The engine builds it once per pass;
    the facts that need name resolution are filled in by the first rule that asks (`StepContextRule`)."""

    module: cst.Module
    nodes: Nodes
    facts: ModuleFacts | None = None
    scopes: dict[int, Scope] | None = None
    step_loops: set[int] | None = None  # loops whose own body runs a training step
    training_loops: set[int] | None = None  # step loops and the loops around them
    barrier_sites: list | None = None  # steps.BarrierSite: where the steps need a barrier
    subtrees: dict[tuple[int, bool], Nodes] = field(default_factory=dict)
    by_start: list[tuple[tuple[int, int], tuple[int, int], int, cst.CSTNode]] | None = None
    function_spans: list[Span] = field(default_factory=list)
    tensor_guard: set[tuple[int, str]] = field(default_factory=set)  # (scope, name) being resolved

    @classmethod
    def of(cls, module: cst.Module, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> ModuleAnalysis:
        """`parents`: ParentNodeProvider's mapping of `module` (every node but the module itself)."""
        nodes = Nodes()
        for node in parents:
            nodes.add(node)
        return cls(module, nodes)


def inside(inner: Span, outer: Span) -> bool:
    """Is source span `inner` within span `outer`?"""
    return outer[0] <= inner[0] and inner[1] <= outer[1]
