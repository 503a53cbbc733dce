"""The per-module analysis record: the engine builds one per lint pass and hands it to every rule."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import cache, partial
from typing import TYPE_CHECKING, Literal, get_args, get_origin

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider, QualifiedName, ScopeProvider

from .names import ImportNames
from .positions import Positions

if TYPE_CHECKING:
    from .project import ProjectSteps

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
    tensor_attrs: dict[int, frozenset[str]] | None = None  # class id -> its buffers and parameters (context.py)
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
            self._names = ImportNames(tree, self.nodes.imports, self.parents, scope_names, functions, line_of)
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


# Nodes that only hold layout and punctuation: whitespace, comments, commas, brackets, dots, operators. About two
# thirds of a module's nodes; no analysis reaches them through the tree (an operator is read as its expression's
# `operator` field), so the walks below leave them out, and a rule cannot visit them (see engine._visit_batched).
LAYOUT: tuple[type[cst.CSTNode], ...] = (
    cst.BaseParenthesizableWhitespace,
    cst.Newline,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Comment,
    cst.Comma,
    cst.Dot,
    cst.Colon,
    cst.Semicolon,
    cst.AssignEqual,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.ImportStar,
    cst.ParamStar,
    cst.ParamSlash,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
    cst.BaseAugOp,
)


@cache
def _node_fields(node_type: type) -> tuple[str, ...]:
    """The fields of a node type that can hold a walked node (not only LAYOUT ones), in the order libcst visits
    them (its syntax order), read once from the `visit_*(self, "field", ...)` calls of the type's
    `_visit_and_replace_children`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(node_type._visit_and_replace_children)))
    visits = [
        call
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id.startswith("visit_")
        and len(call.args) >= 2
        and isinstance(call.args[1], ast.Constant)
    ]
    ordered = [c.args[1].value for c in sorted(visits, key=lambda c: (c.lineno, c.col_offset))]
    names = [f.name for f in fields(node_type) if _may_hold_walked(f.type)]
    return tuple(dict.fromkeys([*(n for n in ordered if n in names), *names]))


def _may_hold_walked(annotation: object) -> bool:
    """Can a field declared as `annotation` (`Sequence[Arg]`, `Union[Comma, MaybeSentinel]`, ...) hold a node
    that is not LAYOUT? Unknown forms (a forward reference) count as yes."""
    if isinstance(annotation, type):
        return issubclass(annotation, cst.CSTNode) and not issubclass(annotation, LAYOUT)
    if get_origin(annotation) is Literal:
        return False
    parts = get_args(annotation)
    return any(_may_hold_walked(part) for part in parts) if parts else annotation is not type(None)


@cache
def _is_walked(kind: type) -> bool:
    return issubclass(kind, cst.CSTNode) and not issubclass(kind, LAYOUT)


def children_of(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The children of `node` in syntax order, without LAYOUT nodes (a list: cheaper than a generator here)."""
    children = []
    for name in _node_fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            children.extend(item for item in value if _is_walked(type(item)))
        elif _is_walked(kind):
            children.append(value)
    return children


def walk(root: cst.CSTNode, skip: tuple[type, ...] = ()) -> Iterator[cst.CSTNode]:
    """`root` and the nodes under it, in syntax order; nodes of the `skip` types (exact types) below `root`
    are left out with everything under them."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node is not root and type(node) in skip:
            continue
        yield node
        stack.extend(reversed(children_of(node)))


_WALKS: dict[int, tuple[cst.Module, list[cst.CSTNode], dict[cst.CSTNode, cst.CSTNode], list[int]]] = {}


def module_walk(module: cst.Module) -> tuple[list[cst.CSTNode], dict[cst.CSTNode, cst.CSTNode]]:
    """Every node of `module` in syntax order (module first), and child -> parent for every node but the
    module, in the order libcst's ParentNodeProvider fills it (a node's children are added when the walk
    leaves it). One plain walk per module, shared by the analyses that need it (the last few modules are
    kept). Reading dataclass fields is ~10x cheaper than a libcst visitor, which rebuilds every node."""
    walked = _walk(module)
    return walked[1], walked[2]


def node_depths(module: cst.Module) -> list[int]:
    """The depth of each node of `module_walk(module)`'s list (the module is 0): a batched visit leaves a node
    when the next one is not deeper. (libcst shares some leaf nodes between parents, so the parent map cannot
    tell where a subtree ends.)"""
    return _walk(module)[3]


def _walk(module: cst.Module) -> tuple[cst.Module, list[cst.CSTNode], dict[cst.CSTNode, cst.CSTNode], list[int]]:
    cached = _WALKS.get(id(module))
    if cached is not None and cached[0] is module:
        return cached
    nodes: list[cst.CSTNode] = []
    depths: list[int] = []
    parents: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[tuple[cst.CSTNode, list[cst.CSTNode] | None, int]] = [(module, None, 0)]
    while stack:
        node, kids, depth = stack.pop()
        if kids is None:
            nodes.append(node)
            depths.append(depth)
            kids = children_of(node)
            if kids:  # a leaf (half the nodes) has no children to give a parent when the walk leaves it
                stack.append((node, kids, depth))
                stack.extend([(kid, None, depth + 1) for kid in reversed(kids)])
        else:
            for kid in kids:
                parents[kid] = node
    if len(_WALKS) >= 4:
        _WALKS.pop(next(iter(_WALKS)))
    _WALKS[id(module)] = walked = (module, nodes, parents, depths)
    return walked


def parent_map(module: cst.Module) -> dict[cst.CSTNode, cst.CSTNode]:
    """Child -> parent for every node but the module (see `module_walk`)."""
    return module_walk(module)[1]


def inside(inner: Span, outer: Span) -> bool:
    """Is source span `inner` within span `outer`?"""
    return outer[0] <= inner[0] and inner[1] <= outer[1]
