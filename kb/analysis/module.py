"""The per-module analysis record: the engine builds one per lint pass and hands it to every rule."""

from __future__ import annotations

import ast
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider, QualifiedName, ScopeProvider

from ..cst_walk import _walk, remember_walk
from .names import ImportNames
from .positions import Positions

if TYPE_CHECKING:
    from .project_steps import ProjectSteps

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
    """Facts about the whole module. Those that need every name of the module resolved (`qnames`, and the facts
    read from it) are found on first use, by `resolve`: most modules' rules never ask (in a lint of torch's nn,
    optim and distributed, 12 modules of 471 did), and resolving every name costs about a tenth of a lint."""

    nn_keys: set[str] = field(default_factory=set)  # `criterion`, `self.fc`: assigned from torch.nn.<Module>()
    optimizer_keys: set[str] = field(default_factory=set)
    device_loader_keys: set[str] = field(default_factory=set)
    sets_static_cache: bool = False
    cuda_spelled: bool = False  # a CUDA device string or a `.cuda()` call
    script: bool = False  # a `__main__` block or a module-level loop
    bf16_spelled: bool = False  # a `.bfloat16()` call, or a string naming bfloat16 or XLA's bf16 switches
    # ("qnames" | "names_device" | "casts_to_bf16") -> its value, computed from the module (scoped_rule.py)
    resolve: Callable[[str], object] | None = None

    @cached_property
    def qnames(self) -> set[str]:
        """The import-resolved names of the module's outermost names and attribute chains."""
        return self.resolve("qnames") if self.resolve is not None else set()

    @cached_property
    def device_code(self) -> bool:
        return self.cuda_spelled or self.uses("torch_xla", "torch.cuda")

    @cached_property
    def cpu_script(self) -> bool:
        """A script (imports torch; a `__main__` block or a module-level loop) that names no device anywhere: no
        `cuda`, `xla`, `mps`, `device`, `accelerator` or `gpu` in a name or string. Its tensors live on the CPU.
        (A fragment without imports is taken as part of a larger device program.)"""
        return self.script and self.uses("torch") and self.resolve is not None and not self.resolve("names_device")

    @cached_property
    def uses_bf16(self) -> bool:
        """The module casts to bfloat16 (outside autocast), or switches XLA's bf16 on."""
        if self.bf16_spelled:
            return True
        return self.uses("torch.bfloat16") and self.resolve is not None and bool(self.resolve("casts_to_bf16"))

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
    imports: list[cst.Import | cst.ImportFrom] = field(default_factory=list)

    def add(self, node: cst.CSTNode) -> None:
        kind = _KINDS.get(type(node))  # by exact type: isinstance on libcst's abstract classes is slow
        if kind is not None:
            getattr(self, kind).append(node)

    def add_all(self, nodes: Iterable[cst.CSTNode]) -> None:
        """`add` for each of `nodes` (one lookup per node: this runs over every node of a module)."""
        lists = {node_type: getattr(self, kind) for node_type, kind in _KINDS.items()}
        for node in nodes:
            found = lists.get(type(node))
            if found is not None:
                found.append(node)


_KINDS = {
    cst.Call: "calls",
    cst.Assign: "assigns",
    cst.AugAssign: "assigns",
    cst.AnnAssign: "assigns",
    cst.Name: "names",
    cst.Attribute: "names",
    cst.SimpleString: "strings",
    cst.For: "fors",
    cst.FunctionDef: "functions",
    cst.Lambda: "functions",
    cst.Import: "imports",
    cst.ImportFrom: "imports",
}


@dataclass
class ModuleAnalysis:
    """What the rules of one lint pass share about its module. The engine builds it once per pass;
    the facts that need name resolution are filled in by the first rule that asks (`StepContextRule`).

    Parents come from one plain walk of the tree; positions and scopes are resolved by libcst only when a
    rule first asks (most modules have no finding, so never need positions), and a node's qualified names
    are looked up in its scope on demand instead of by a visitor over every node."""

    module: cst.Module
    nodes: Nodes
    parents: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    wrapper: MetadataWrapper | None = None
    facts: ModuleFacts | None = None
    scopes: dict[int, Scope] | None = None
    step_loops: set[int] | None = None  # loops whose own body runs a training step
    training_loops: set[int] | None = None  # step loops and the loops around them
    barrier_sites: list | None = None  # steps.BarrierSite: where the steps need a barrier
    # The tree this module is part of (project.ProjectSteps: its callables that step) and the module's dotted
    # name in it; None when the module is analysed alone.
    project: ProjectSteps | None = None
    module_name: str | None = None
    climb: tuple | None = None  # (the project, steps._climb's result): the update calls, loops and helpers
    # steps.per_step_functions: (the project, ids of the functions that run once per training step)
    per_step: tuple | None = None
    tensor_attrs: dict[int, frozenset[str]] | None = None  # class id -> its buffers and parameters (kb/step_rule.py)
    subtrees: dict[tuple[int, bool], Nodes] = field(default_factory=dict)
    tensor_guard: set[tuple[int, str]] = field(default_factory=set)  # (scope, name) being resolved
    sequence_names: dict[tuple[int, str], bool] = field(default_factory=dict)  # (scope, name): used as a list?
    tree: ast.Module | None = None  # CPython's AST of the same source (parsed from the module when not given)
    source: str | None = None  # the module's text, when the caller has it (positions come cheaper)
    _positions: Positions | None = None
    _spans: dict[int, tuple[int, int]] | None = None
    # id(node) -> (node, its imported names): an id key skips libcst's hash method (a Python call per lookup), and
    # keeping the node makes a reused id (a node a rule built and dropped) a miss.
    _qualified: dict[int, tuple[cst.CSTNode, frozenset[str]]] = field(default_factory=dict)
    _names: ImportNames | None = None
    # every node in syntax order and its depth (module_walk, node_depths), kept with the analysis: a tree's
    # modules are walked for its summary and walked again for their lint, long after the shared cache let go
    walked: tuple[list[cst.CSTNode], list[int]] = ((), ())

    @classmethod
    def of(
        cls,
        module: cst.Module,
        wrapper: MetadataWrapper | None = None,
        tree: ast.Module | None = None,
        source: str | None = None,
    ) -> ModuleAnalysis:
        """`wrapper`: the MetadataWrapper of `module` (made here when not given); `tree`: its CPython AST;
        `source`: its text."""
        wrapper = wrapper or MetadataWrapper(module, unsafe_skip_copy=True)
        _, walk_nodes, parents, depths = _walk(module)
        nodes = Nodes()
        nodes.add_all(parents)
        return cls(module, nodes, parents, wrapper, tree=tree, source=source, walked=(walk_nodes, depths))

    def next_pass(self) -> None:
        """Ready for another pass over the same module, maybe with another tree summary (kb/batch.py's summary
        rounds, then the lint): what depends on the summary is found again (`climb` is keyed by it), the rest
        (names, scopes, positions) is kept."""
        self.barrier_sites = None
        self.per_step = None
        self.tensor_guard.clear()
        # the device analysis and the parent map walk the module again unless its walk is in cst_walk's cache
        if self.walked[0]:
            remember_walk(self.module, self.walked[0], self.parents, self.walked[1])

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(node)

    def position(self, node: cst.CSTNode) -> CodeRange:
        return self.positions()[node]

    def positions(self) -> Positions | Mapping[cst.CSTNode, CodeRange]:
        """node -> CodeRange: a statement at a time when the source and its AST are known, else libcst's
        PositionProvider for the whole module (resolved once: the wrapper keeps it)."""
        if self.source is None or self.tree is None:
            return self.wrapper.resolve(PositionProvider)
        if self._positions is None:
            self._positions = Positions(self.module, self.source, self.tree, self.parents, self.wrapper)
        return self._positions

    def walk_span(self, node: cst.CSTNode) -> tuple[int, int]:
        """(first, last): the indexes of `node` and of its last descendant in the module's syntax-order walk.
        Comparing them orders nodes as their source positions do, without generating code to place them."""
        if self._spans is None:
            nodes, depths = self.walked
            spans: dict[int, tuple[int, int]] = {}
            open_nodes: list[int] = []  # indexes of the nodes whose subtree the walk is still in
            for index, depth in enumerate([*depths, -1]):  # the -1 closes every subtree at the end
                while open_nodes and depths[open_nodes[-1]] >= depth:
                    first = open_nodes.pop()
                    spans[id(nodes[first])] = (first, index - 1)
                open_nodes.append(index)
            self._spans = spans
        return self._spans[id(node)]

    def names(self) -> ImportNames:
        """The module's alias table (built on first use)."""
        if self._names is None:
            tree = self.tree if self.tree is not None else ast.parse(self.module.code)
            functions = [n for n in self.walked[0] if type(n) is cst.FunctionDef]
            # functions of the wrapper and the positions, not bound methods of this analysis: the table is kept
            # here, and a method of ours in it would make the analysis a reference cycle that only the cyclic
            # garbage collector frees (~20k objects, ~20 ms, after every lint and fix)
            line_of = (
                partial(_first_line, self.positions()) if self.source is not None and self.tree is not None else None
            )
            scope_names = partial(_scope_names, self.wrapper)
            star_names = (
                self.project.star_torch_names(self.module_name, tree)
                if self.project is not None and self.module_name is not None
                else None
            )
            self._names = ImportNames(
                tree, self.nodes.imports, self.parents, scope_names, functions, line_of, star_names
            )
        return self._names

    def imported_names(self, node: cst.CSTNode) -> frozenset[str]:
        """libcst's import-resolved qualified names of `node` (QualifiedNameProvider, source IMPORT)."""
        known = self._qualified.get(id(node))
        if known is not None and known[0] is node:
            return known[1]
        found = self.names().imported(node)
        self._qualified[id(node)] = (node, found)
        return found

    def qualified_name_objects(self, node: cst.CSTNode) -> Collection[QualifiedName]:
        """libcst's QualifiedNameProvider value for `node` (local names too); prefer `imported_names`."""
        return self.names().qualified(node)

    def has_qualified_names(self, node: cst.CSTNode) -> bool:
        """Does libcst's QualifiedNameProvider give `node` any name (an import, a builtin, a local)?"""
        return self.names().has_names(node)


def _scope_names(wrapper: MetadataWrapper, node: cst.CSTNode) -> Collection[QualifiedName]:
    """libcst's answer from its scope analysis of the whole module (resolved once, on first use)."""
    scope = wrapper.resolve(ScopeProvider).get(node)
    return scope.get_qualified_names_for(node) if scope is not None else set()


def _first_line(positions: Positions, node: cst.CSTNode) -> int | None:
    found = positions.get(node)
    return found.start.line if found is not None else None


def inside(inner: Span, outer: Span) -> bool:
    """Is source span `inner` within span `outer`?"""
    return outer[0] <= inner[0] and inner[1] <= outer[1]
