"""`ScopedRule`: the rule base class that reads the module-wide analysis: the module's nodes by kind,
the nodes inside a subtree, what each function binds (scopes), and whole-module facts."""

from __future__ import annotations

import re
import weakref
from functools import partial

import libcst as cst

from .analysis.cst_scopes import full_name, head_name
from .analysis.module import ModuleAnalysis, ModuleFacts, Nodes, Scope
from .cst_helpers import code_of, is_cuda_string, method_name, node_kinds, string_value
from .cst_walk import walk
from .rule import Rule

DEVICE_LOADERS = frozenset(
    {
        "torch_xla.distributed.parallel_loader.MpDeviceLoader",
        "torch_xla.distributed.parallel_loader.ParallelLoader",
    }
)
AUTOCASTS = frozenset(
    {
        "torch.autocast",
        "torch.amp.autocast",
        "torch.amp.autocast_mode.autocast",
        "torch.cuda.amp.autocast",
        "torch_xla.amp.autocast",
        "torch_xla.amp.autocast_mode.autocast",
    }
)

# Device words at the start of a word (`use_cuda`, `ngpu`-style names aside): `output` names no TPU.
DEVICE_WORDS = re.compile(r"(?<![a-z])n?(cuda|xla|mps|tpu|gpu|device|accelerator|dev)s?(?![a-z])", re.IGNORECASE)
# What `nodes_in` collects.
SUBTREE_KINDS = frozenset(
    {cst.Call, cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Name, cst.Attribute, cst.SimpleString}
)
FLAG_PREFIXES = ("return_", "output_", "use_", "is_", "do_", "num_", "n_", "enable_", "skip_")


def may_hold_tensor(param: cst.Param) -> bool:
    """A `forward` parameter holds a tensor unless its name, annotation or default says otherwise."""
    name = param.name.value
    if name in ("self", "cls", "training", "deterministic") or name.startswith(FLAG_PREFIXES):
        return False
    if param.annotation is not None:
        return "Tensor" in code_of(param.annotation.annotation)
    default = param.default
    return default is None or (isinstance(default, cst.Name) and default.value == "None")


def _names_device(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.SimpleString):
        return bool(DEVICE_WORDS.search(node.value))
    word = node.attr.value if isinstance(node, cst.Attribute) else node.value
    return bool(DEVICE_WORDS.search(word.replace("_", " ")))


class ScopedRule(Rule):
    """A rule that reads the module's analysis: nodes by kind, scopes and module facts."""

    # --- names ---------------------------------------------------------------------
    def is_builtin(self, node: cst.CSTNode, *names: str) -> bool:
        head = (full_name(node) or "").partition(".")[0]
        return head in names and self.analysis.names().builtin(node) == f"builtins.{head}"

    def qualified_startswith(self, node: cst.CSTNode, *prefixes: str) -> bool:
        return any(q == p or q.startswith(p + ".") for q in self.qualified_names(node) for p in prefixes)

    # --- module index ------------------------------------------------------------------
    def module_nodes(self) -> Nodes:
        return self.analysis.nodes

    def nodes_in(self, root: cst.CSTNode, enter_functions: bool = True) -> Nodes:
        """The calls, assignments, names and strings inside `root` (`root` included), without those in nested
        functions and lambdas unless `enter_functions`. Walked once per root, then kept."""
        index = self.analysis
        if isinstance(root, cst.Module):
            return index.nodes
        key = (id(root), enter_functions)
        if key not in index.subtrees:
            found = Nodes()
            inside = walk(root, () if enter_functions else (cst.FunctionDef, cst.Lambda))
            found.add_all(node for node in inside if type(node) in SUBTREE_KINDS)  # exact types: no subclasses
            index.subtrees[key] = found
        return index.subtrees[key]

    def facts(self) -> ModuleFacts:
        index = self.analysis
        if index.facts is None:
            index.facts = self._scan_module(index.nodes)
        return index.facts

    def _scan_module(self, found: Nodes) -> ModuleFacts:
        facts = ModuleFacts(resolve=partial(_resolve_fact, weakref.ref(self.analysis)))
        for assign in found.assigns:
            if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
                continue
            target = assign.targets[0].target
            if isinstance(target, cst.Attribute) and target.attr.value == "cache_implementation":
                facts.sets_static_cache = True
            if not isinstance(assign.value, cst.Call):
                continue
            call = assign.value
            key = code_of(target)
            for q in self.qualified_names(call.func):
                last = q.rsplit(".", 1)[-1]
                if q.startswith("torch.nn.") and not q.startswith("torch.nn.functional") and last[:1].isupper():
                    facts.nn_keys.add(key)
                if (q.startswith("torch.optim.") and "lr_scheduler" not in q) or q.startswith(
                    "torch_xla.amp.syncfree."
                ):
                    facts.optimizer_keys.add(key)
                if q in DEVICE_LOADERS:
                    facts.device_loader_keys.add(key)
            if method_name(call) == "per_device_loader":
                facts.device_loader_keys.add(key)
        facts.cuda_spelled = any(is_cuda_string(s) for s in found.strings) or any(
            method_name(c) == "cuda" for c in found.calls
        )
        facts.script = self._is_script()
        facts.bf16_spelled = any(method_name(c) == "bfloat16" for c in found.calls) or any(
            string_value(s) in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16", "bfloat16") for s in found.strings
        )
        return facts

    def _qnames(self) -> set[str]:
        qnames: set[str] = set()
        imported = self.analysis.names().imported_heads  # a name no import binds resolves to nothing: most names
        for name in self.analysis.nodes.names:
            # outermost names and attribute chains only
            if head_name(name) in imported and type(self.parent(name)) is not cst.Attribute:
                qnames |= self.qualified_names(name)
        return qnames

    def _is_script(self) -> bool:
        for stmt in self.analysis.module.body:
            if isinstance(stmt, (cst.For, cst.While)):
                return True
            if isinstance(stmt, cst.If) and "__main__" in code_of(stmt.test):
                return True
        return False

    def _casts_to_bf16(self, name: cst.CSTNode) -> bool:
        """`torch.bfloat16` used outside autocast (autocast keeps weights and reductions in float32)."""
        if "torch.bfloat16" not in self.qualified_names(name):
            return False
        return not any(isinstance(a, cst.Call) and self.is_call_to(a, *AUTOCASTS) for a in self.ancestors(name))

    # --- scopes ----------------------------------------------------------------------
    def scope_node(self, node: cst.CSTNode) -> cst.CSTNode:
        """The function (or module) whose local names `node` sees."""
        for anc in self.ancestors(node):
            if type(anc) is cst.FunctionDef or type(anc) is cst.Module:  # exact types: isinstance goes through ABCMeta
                return anc
        return self.analysis.module

    def scope(self, scope_node: cst.CSTNode) -> Scope:
        index = self.analysis
        if index.scopes is None:
            index.scopes = self._build_scopes(index)
        return index.scopes.get(id(scope_node), Scope())

    def _owner(self, node: cst.CSTNode, kinds: tuple[type, ...]) -> cst.CSTNode | None:
        exact = node_kinds(kinds)
        for anc in self.ancestors(node):
            if type(anc) in exact:
                return anc
        return None

    def _build_scopes(self, index: ModuleAnalysis) -> dict[int, Scope]:
        scopes: dict[int, Scope] = {}

        def scope_at(owner: cst.CSTNode | None) -> Scope:
            return scopes.setdefault(id(owner), Scope())

        for assign in index.nodes.assigns:
            owner = self._owner(assign, (cst.FunctionDef, cst.ClassDef, cst.Module))
            if isinstance(assign, cst.Assign):
                targets = [t.target for t in assign.targets]
            else:
                targets = [assign.target] if assign.value is not None else []
            for target in targets:
                if isinstance(target, cst.Name):
                    scope_at(owner).assigns.setdefault(target.value, []).append(assign.value)
        for call in index.nodes.calls:
            if method_name(call) == "backward" and isinstance(call.func.value, cst.Name):
                owner = self._owner(call, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module))
                scope_at(owner).backward_names.add(call.func.value.value)
        for func in index.nodes.functions:
            if not isinstance(func, cst.FunctionDef):
                continue
            scope = scope_at(func)
            params = func.params
            for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
                scope.params.add(param.name.value)
                if func.name.value == "forward" and may_hold_tensor(param):
                    scope.tensor_params.add(param.name.value)
        return scopes

    def assigned_values(self, name: cst.Name) -> list[cst.BaseExpression]:
        """Values assigned to `name` in its function, or in the module when the function never binds it."""
        scope_node = self.scope_node(name)
        scope = self.scope(scope_node)
        if name.value in scope.assigns or name.value in scope.params or isinstance(scope_node, cst.Module):
            return scope.assigns.get(name.value, [])
        return self.scope(self.analysis.module).assigns.get(name.value, [])


def _resolve_fact(analysis: weakref.ref[ModuleAnalysis], name: str) -> object:
    """One of ModuleFacts' facts found on first use, by a rule reading the module's analysis (a weak reference:
    the facts are kept by the analysis, which frees with its module by reference counting, no cycle)."""
    rule = ScopedRule()
    rule.analysis = analysis()
    rule.qualified_names = rule.analysis.imported_names
    if name == "qnames":
        return rule._qnames()
    names = rule.analysis.nodes.names
    if name == "names_device":
        return any(_names_device(n) for n in (*names, *rule.analysis.nodes.strings))
    if name == "casts_to_bf16":
        return any(rule._casts_to_bf16(n) for n in names)
    raise ValueError(f"no module fact {name!r}")
