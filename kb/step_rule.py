"""`StepContextRule`: the base class of rules that need the training loop, scopes and tensor facts.

- `step_loop(node)`: the innermost loop that itself runs a training step around `node` (see steps.py);
- `is_tensor(expr)`: a conservative guess that an expression holds a tensor
  (`float(args.lr)` is not one; `float(loss)` after `loss.backward()` is);
- `in_device_context(node)`: code that runs on the XLA device, not in a CPU data pipeline.

The module-wide facts live in the engine's `ModuleAnalysis` (`self.analysis`), computed once per module.
"""

from __future__ import annotations

import libcst as cst

from .analysis import steps
from .analysis.steps import SYNC_CALLS, is_optimizer_name
from .cst_helpers import DATALOADERS, code_of, find_nodes, keyword_arg, method_name, positional_args, string_value
from .scoped_rule import DEVICE_LOADERS, ScopedRule

# Tensor methods whose result is again a tensor.
TENSOR_METHODS = frozenset(
    "abs amax amin any all argmax argmin bfloat16 clamp clip clone contiguous cumsum detach double eq exp "
    "expand flatten float ge gt half isfinite isinf isnan le log log_softmax logsumexp lt masked_fill matmul "
    "max mean min mul ne neg norm permute pow prod reshape sigmoid softmax sqrt square squeeze std sub sum "
    "tanh transpose unsqueeze var view".split()
)
# Methods whose result lives on the host (Python values, sizes, containers, strings).
HOST_METHODS = frozenset(
    "item tolist numpy size dim numel nelement element_size stride data_ptr is_contiguous keys values items "
    "get format join split strip lower upper startswith endswith".split()
)
# torch.<name>() functions that do not return a device tensor.
NON_TENSOR_TORCH = frozenset(
    "device dtype is_tensor is_floating_point is_complex numel manual_seed seed set_grad_enabled no_grad "
    "enable_grad inference_mode is_grad_enabled get_default_dtype set_default_dtype compile load save "
    "finfo iinfo autocast set_printoptions use_deterministic_algorithms set_num_threads get_num_threads "
    "get_rng_state set_rng_state set_float32_matmul_precision get_float32_matmul_precision".split()
)
# Factories that build CPU tensors unless given `device=` (a CPU tensor read on the host costs nothing).
TENSOR_FACTORIES_ON_CPU = frozenset(
    "tensor as_tensor from_numpy rand randn randint randperm zeros ones empty full arange linspace logspace eye".split()
)
# torch.nn.utils functions that return a device tensor (the total gradient norm).
TENSOR_UTILS = frozenset(
    {"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.get_total_norm"}
)
TENSOR_ATTRS = frozenset({"loss", "logits", "grad"})  # `outputs.loss`, `outputs.logits`, `p.grad`
TENSOR_VIEW_ATTRS = frozenset({"data", "T", "mT", "real", "imag"})
ORDER_OPS = (cst.LessThan, cst.GreaterThan, cst.LessThanEqual, cst.GreaterThanEqual, cst.Equal, cst.NotEqual)

TQDM = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm"})
NN_MODULE = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
NN_PARAMETER = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})
DATASET = frozenset(
    {
        "torch.utils.data.Dataset",
        "torch.utils.data.IterableDataset",
        "torch.utils.data.dataset.Dataset",
        "torch.utils.data.dataset.IterableDataset",
    }
)
DATA_FUNCTIONS = ("collate", "__getitem__", "__iter__", "preprocess", "tokenize")
# Methods only lists have: a name they are called on holds a list, whatever else the function assumes.
LIST_METHODS = frozenset({"append", "extend", "insert"})
# Annotations of containers and text: a parameter annotated so is not a tensor.
SEQUENCE_TYPES = frozenset({"list", "List", "tuple", "Tuple", "Sequence", "str", "Iterable", "dict", "Dict"})
# Calls on a name that only a torch tensor answers (numpy arrays have `.shape` and `.size`, but not these).
TENSOR_ONLY_METHODS = frozenset(
    "size dim view unsqueeze to float half bfloat16 contiguous masked_fill permute detach new_zeros new_ones "
    "new_full new_empty type_as expand softmax log_softmax".split()
)


class StepContextRule(ScopedRule):
    """A rule that needs to know about the training loop and which values are tensors."""

    # --- tensors -----------------------------------------------------------------------
    def is_tensor(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """True when `node` clearly holds a tensor (a loss, a model output, a reduction of one)."""
        if depth > 8:
            return False
        if isinstance(node, cst.Name):
            return self._name_is_tensor(node, depth)
        if isinstance(node, cst.Attribute):
            if self._is_module_tensor(node):
                return True
            if node.attr.value in TENSOR_ATTRS:
                return not (isinstance(node.value, cst.Name) and node.value.value in ("self", "args", "config"))
            if node.attr.value in TENSOR_VIEW_ATTRS:
                return self.is_tensor(node.value, depth + 1)
            return False
        if isinstance(node, cst.Subscript):
            return self.is_tensor(node.value, depth + 1)
        if isinstance(node, cst.BinaryOperation):
            return self.is_tensor(node.left, depth + 1) or self.is_tensor(node.right, depth + 1)
        if isinstance(node, cst.UnaryOperation):
            return not isinstance(node.operator, cst.Not) and self.is_tensor(node.expression, depth + 1)
        if isinstance(node, cst.Comparison):
            if not all(isinstance(c.operator, ORDER_OPS) for c in node.comparisons):
                return False
            return self.is_tensor(node.left, depth + 1) or any(
                self.is_tensor(c.comparator, depth + 1) for c in node.comparisons
            )
        if isinstance(node, cst.Call):
            return self._call_is_tensor(node, depth)
        return False

    def is_known_tensor(self, node: cst.CSTNode) -> bool:
        """`is_tensor` without taking a `forward` parameter for a tensor on its name alone: its annotation, a
        tensor-only method called on it or a torch function given it must say so. A safe rewrite that calls a
        tensor method (`x.size(1)`) needs this evidence; an untyped argument may be a list of tensors."""
        self._params_need_evidence = True
        try:
            return self.is_tensor(node)
        finally:
            self._params_need_evidence = False

    def _is_module_tensor(self, node: cst.Attribute) -> bool:
        """`self.queue_ptr` in a method of a class that registers it as a buffer (`self.register_buffer(
        "queue_ptr", ...)`) or assigns it an `nn.Parameter`: it moves with the module, onto the device."""
        if not (isinstance(node.value, cst.Name) and node.value.value == "self"):
            return False
        cls = self.enclosing_class(node)
        return cls is not None and node.attr.value in self._module_tensors(cls)

    def _module_tensors(self, cls: cst.ClassDef) -> frozenset[str]:
        known = self.analysis.tensor_attrs
        if known is None:
            known = self.analysis.tensor_attrs = {}
        if id(cls) not in known:
            found = set()
            for call in self.nodes_in(cls).calls:
                func = call.func
                args = positional_args(call)
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value == "register_buffer"
                    and code_of(func.value) == "self"
                    and args
                    and (name := string_value(args[0].value))
                ):
                    found.add(name)
            for assign in self.nodes_in(cls).assigns:
                if not (isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)):
                    continue
                if not self.qualified_names(assign.value.func) & NN_PARAMETER:
                    continue
                for target in assign.targets:
                    t = target.target
                    if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self":
                        found.add(t.attr.value)
            known[id(cls)] = frozenset(found)
        return known[id(cls)]

    def _name_is_tensor(self, name: cst.Name, depth: int) -> bool:
        scope_node = self.scope_node(name)
        scope = self.scope(scope_node)
        if self.holds_sequence(name):
            return False
        if name.value in scope.backward_names:
            return True
        if (
            name.value in scope.tensor_params
            and not self._overrides_a_number(name.value, scope_node)
            and (not getattr(self, "_params_need_evidence", False) or self._used_as_tensor(name.value, scope_node))
        ):
            return True
        guard = (id(scope_node), name.value)
        if guard in self.analysis.tensor_guard:
            return False
        self.analysis.tensor_guard.add(guard)
        try:
            return any(self.is_tensor(v, depth + 1) for v in self.assigned_values(name))
        finally:
            self.analysis.tensor_guard.discard(guard)

    def holds_sequence(self, name: cst.Name) -> bool:
        """Does the function of `name` use it as a list, tuple or string: a list method on it (`kvs.append(x)`),
        list concatenation (`kvs + [x]`), a list or tuple literal or comprehension assigned to it, or a container
        annotation? (`len()` alone says nothing: tensors have a length too.)"""
        scope_node = self.scope_node(name)
        key = (id(scope_node), name.value)
        cache = self.analysis.sequence_names
        if key not in cache:
            cache[key] = self._uses_as_sequence(name.value, scope_node)
        return cache[key]

    def _uses_as_sequence(self, name: str, scope_node: cst.CSTNode) -> bool:
        found = self.nodes_in(scope_node, False)
        if isinstance(scope_node, cst.FunctionDef):
            params = scope_node.params
            for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
                if param.name.value == name and param.annotation is not None:
                    members = [m for m in _union_members(param.annotation.annotation) if code_of(m) != "None"]
                    heads = [m.value if isinstance(m, cst.Subscript) else m for m in members]
                    if heads and all(code_of(h).rpartition(".")[2] in SEQUENCE_TYPES for h in heads):
                        return True
        for value in self.scope(scope_node).assigns.get(name, []):
            if isinstance(value, (cst.List, cst.Tuple, cst.ListComp)):
                return True
        for call in found.calls:
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in LIST_METHODS
                and isinstance(func.value, cst.Name)
                and func.value.value == name
            ):
                return True
        for node in found.names:
            if not (type(node) is cst.Name and node.value == name):
                continue
            parent = self.parent(node)
            if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Add):
                other = parent.right if parent.left is node else parent.left
                if _is_list_expression(other):
                    return True
            if isinstance(parent, cst.AugAssign) and parent.target is node and _is_list_expression(parent.value):
                return True
        return False

    def _used_as_tensor(self, name: str, scope_node: cst.CSTNode) -> bool:
        """Does the function say that its parameter `name` is a tensor: a `Tensor` annotation, a tensor-only
        method called on it (`x.size(1)`, `x.view(...)`), or `x` given to a torch function (`torch.cat`)?"""
        if isinstance(scope_node, cst.FunctionDef):
            params = scope_node.params
            for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
                if param.name.value == name and param.annotation is not None:
                    # `Tensor | None` says so; `list[tuple[Tensor, Tensor]]` names tensors inside a container
                    if any(code_of(m).endswith("Tensor") for m in _union_members(param.annotation.annotation)):
                        return True
        for call in self.nodes_in(scope_node, False).calls:
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in TENSOR_ONLY_METHODS
                and isinstance(func.value, cst.Name)
                and func.value.value == name
            ):
                return True
            if self._is_torch_function(func) and any(
                isinstance(a.value, cst.Name) and a.value.value == name for a in call.args
            ):
                return True
        return False

    def _overrides_a_number(self, param: str, func: cst.CSTNode) -> bool:
        """`p = default(p, self.p)` (or `p or self.p`) in `forward`, where `__init__` sets `self.p` to a number:
        the parameter is a per-call override of a scalar setting (a dropout probability, a count), not a tensor."""
        for value in self.scope(func).assigns.get(param, []):
            for node in self.nodes_in(value).names:
                if (
                    isinstance(node, cst.Attribute)
                    and isinstance(node.value, cst.Name)
                    and node.value.value == "self"
                    and self._number_setting(func, node.attr.value)
                ):
                    return True
        return False

    def _number_setting(self, method: cst.CSTNode, attr: str) -> bool:
        """Does the `__init__` of `method`'s class set `self.<attr>` only to numbers (literals, or parameters
        whose default is a number)?"""
        cls = self.enclosing_class(method)
        init = (
            next(
                (s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"),
                None,
            )
            if cls is not None
            else None
        )
        if init is None:
            return False
        defaults = {p.name.value: p.default for p in init.params.params + init.params.kwonly_params}
        values = [
            a.value
            for a in self.nodes_in(init, False).assigns
            if isinstance(a, cst.Assign)
            and len(a.targets) == 1
            and isinstance(a.targets[0].target, cst.Attribute)
            and code_of(a.targets[0].target) == f"self.{attr}"
        ]
        for i, value in enumerate(values):
            if isinstance(value, cst.Name) and value.value in defaults:
                values[i] = defaults[value.value]
        return bool(values) and all(_is_number(v) for v in values)

    def _call_is_tensor(self, call: cst.Call, depth: int) -> bool:
        func = call.func
        method = method_name(call)
        if method in HOST_METHODS:
            return False
        if self.is_builtin(func, "float", "int", "bool", "len", "str", "repr", "round", "abs", "sum", "max", "min"):
            return False
        if self._is_torch_function(func):
            last = self.call_name(call).rsplit(".", 1)[-1]
            return last not in TENSOR_FACTORIES_ON_CPU or keyword_arg(call, "device") is not None
        if self.qualified_startswith(func, "numpy", "pandas", "math"):
            return False
        if method in TENSOR_METHODS:
            receiver = func.value
            return self.is_tensor(receiver, depth + 1) or not self.is_host_value(receiver)
        if code_of(func) in self.facts().nn_keys:
            return True
        return False

    def _is_torch_function(self, func: cst.CSTNode) -> bool:
        """`torch.sum`, `F.cross_entropy`, `torch.linalg.norm`; not `torch.device`, not methods of values."""
        node = func
        while isinstance(node, cst.Attribute):
            node = node.value
        if not isinstance(node, cst.Name):  # a method called on a value, e.g. torch.randn(3).sum
            return False
        for q in self.qualified_names(func):
            parts = q.split(".")
            if q in TENSOR_UTILS:
                return True
            if parts[0] != "torch":
                continue
            if len(parts) == 2 and parts[1][:1].islower() and parts[1] not in NON_TENSOR_TORCH:
                return True
            if len(parts) == 4 and parts[1:3] == ["nn", "functional"]:
                return True
            if len(parts) == 3 and parts[1] in ("linalg", "special", "fft"):
                return True
        return False

    def is_host_value(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """True when `node` is clearly a NumPy/pandas/Python value (so `.sum()` on it is not a tensor)."""
        if depth > 6:
            return False
        if isinstance(node, cst.Call):
            if method_name(node) in HOST_METHODS:
                return True
            if self.qualified_startswith(node.func, "numpy", "pandas", "math"):
                return True
            if isinstance(node.func, cst.Attribute):
                return self.is_host_value(node.func.value, depth + 1)
            return False
        if isinstance(node, (cst.Attribute, cst.Subscript)):
            return self.is_host_value(node.value, depth + 1)
        if isinstance(node, cst.Name):
            if self.qualified_startswith(node, "numpy", "pandas"):
                return True
            if self.qualified_names(node) and not self.qualified_startswith(node, "torch", "torch_xla"):
                return True  # an imported module or function that is not torch's: `statistics`, `math`
            values = self.assigned_values(node)
            return bool(values) and all(self.is_host_value(v, depth + 1) for v in values)
        if isinstance(node, (cst.List, cst.Tuple, cst.Dict, cst.Integer, cst.Float, cst.SimpleString)):
            return True
        return False

    def is_cpu_tensor(self, node: cst.CSTNode, depth: int = 0, seen: frozenset[str] = frozenset()) -> bool:
        """A tensor made on the CPU and never moved: a torch factory call without `device=` (`torch.arange(n)`),
        and what is computed from one without a move (`r[mask] - offset`, `F.pad(r, (1, 0))`, `r.sum()`), through
        names whose every assignment is one (`idx = ...; idx = F.pad(idx, ...)`). Reading it costs no device sync."""
        if depth > 8:
            return False
        if isinstance(node, cst.Name):
            if node.value in seen:
                return True  # `idx = F.pad(idx, ...)`: as on the CPU as idx's other values say
            if node.value in self.scope(self.scope_node(node)).params:
                return False  # what the caller passed may live anywhere
            # `idx = F.pad(idx, ...)` is as on the CPU as idx was: the values that do not read the name itself must
            # say so (none when it was bound otherwise: `a, idx = torch.split(...)` then `idx = idx[mask]`)
            values = self.assigned_values(node)
            own = [v for v in values if any(n.value == node.value for n in find_nodes(v, cst.Name))]
            others = [v for v in values if not any(v is o for o in own)]
            inner = seen | {node.value}
            return bool(others) and all(self.is_cpu_tensor(v, depth + 1, inner) for v in [*others, *own])
        if isinstance(node, cst.Subscript):
            return self.is_cpu_tensor(node.value, depth + 1, seen)
        if isinstance(node, cst.BinaryOperation):
            return self.is_cpu_tensor(node.left, depth + 1, seen) or self.is_cpu_tensor(node.right, depth + 1, seen)
        if isinstance(node, cst.Comparison):
            operands = [node.left, *(c.comparator for c in node.comparisons)]
            return any(self.is_cpu_tensor(o, depth + 1, seen) for o in operands)
        if not isinstance(node, cst.Call) or keyword_arg(node, "device") is not None:
            return False
        if self._is_torch_function(node.func):
            if self.call_name(node).rsplit(".", 1)[-1] in TENSOR_FACTORIES_ON_CPU:
                return True
            args = positional_args(node)
            return bool(args) and self.is_cpu_tensor(args[0].value, depth + 1, seen)  # `F.pad(cpu_tensor, ...)`
        if isinstance(node.func, cst.Attribute) and method_name(node) not in ("to", "cuda", "type"):
            return self.is_cpu_tensor(node.func.value, depth + 1, seen)  # `r.sum()`, `r.long()`
        return False

    # --- loops (the one definition is in steps.py) ------------------------------------
    def runs_step(self, loop: cst.For | cst.While) -> bool:
        return steps.runs_step(self, loop)

    def step_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        return steps.step_loop(self, node)

    def per_step_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        """The step loop that runs `node` every step on the device (a script that names no device runs its
        steps on the CPU, where host reads cost nothing)."""
        if steps.trains_on_cpu(self):
            return None
        return steps.per_step_loop(self, node)

    def per_step_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The function around `node` that runs once per training step on the device, `node` each time
        (steps.py `per_step_function`; never in a script that names no device)."""
        if self.facts().cpu_script:
            return None
        return steps.per_step_function(self, node)

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for anc in self.ancestors(node):
            if isinstance(anc, cst.FunctionDef):
                return anc
        return None

    def enclosing_class(self, node: cst.CSTNode) -> cst.ClassDef | None:
        for anc in self.ancestors(node):
            if isinstance(anc, cst.ClassDef):
                return anc
        return None

    def class_derives(self, cls: cst.ClassDef, names: frozenset[str]) -> bool:
        return any(self.qualified_names(base.value) & names for base in cls.bases)

    def in_device_context(self, node: cst.CSTNode) -> bool:
        """Code that runs on the XLA device: the step loop, model code, or a device script's other code.

        Dataset classes, collate functions and preprocessing run on the CPU in DataLoader workers,
        where dynamic shapes and CPU-only ops cost nothing.
        """
        cls = self.enclosing_class(node)
        if cls is not None and self.class_derives(cls, DATASET):
            return False
        func = self.enclosing_function(node)
        if func is not None and any(part in func.name.value.lower() for part in DATA_FUNCTIONS):
            return False
        if self.step_loop(node) is not None:
            return True
        if cls is not None and self.class_derives(cls, NN_MODULE):
            return True
        if func is not None and func.name.value == "forward":
            return True
        if func is not None and self.per_step_function(node) is not None:
            return True  # a helper the step loop runs every step, in this file or from another one
        return self.facts().device_code

    def contains_sync(self, node: cst.CSTNode) -> bool:
        return any(self.qualified_names(c.func) & SYNC_CALLS for c in self.nodes_in(node, False).calls)

    def contains_backward(self, node: cst.CSTNode) -> bool:
        return any(method_name(c) == "backward" for c in self.nodes_in(node, False).calls)

    def is_optimizer_step(self, call: cst.Call) -> bool:
        """`optimizer.step()` (not `scheduler.step()`, not `scaler.step(opt)`)."""
        if method_name(call) != "step" or positional_args(call):
            return False
        receiver = call.func.value
        return is_optimizer_name(receiver) or code_of(receiver) in self.facts().optimizer_keys

    def iterates_device_loader(self, loop: cst.For) -> bool:
        facts = self.facts()
        found = self.nodes_in(loop.iter)
        if any(self.qualified_names(c.func) & DEVICE_LOADERS for c in found.calls):
            return True
        if any(method_name(c) == "per_device_loader" for c in found.calls):
            return True
        for name in found.names:
            if not isinstance(name, cst.Name):
                continue
            if name.value in facts.device_loader_keys:
                return True
            # a loader handed in as a parameter, in a module that builds device loaders
            scope = self.scope(self.scope_node(loop))
            if facts.device_loader_keys and name.value in scope.params:
                return True
        return False

    def iterated_name(self, loop: cst.For) -> cst.Name | None:
        """`loader` in `for b in loader`, `enumerate(loader)`, `tqdm(loader)`, `enumerate(tqdm(loader))`."""
        node: cst.CSTNode = loop.iter
        for _ in range(3):
            if isinstance(node, cst.Name):
                return node
            if isinstance(node, cst.Call) and (self.is_builtin(node.func, "enumerate") or self.is_call_to(node, *TQDM)):
                args = positional_args(node)
                if not args:
                    return None
                node = args[0].value
                continue
            return None
        return None

    def plain_dataloader_name(self, loop: cst.For) -> cst.Name | None:
        """The iterated name when every assignment of it in scope is `DataLoader(...)`."""
        name = self.iterated_name(loop)
        if name is None:
            return None
        scope = self.scope(self.scope_node(loop))
        values = scope.assigns.get(name.value, [])
        if not values or name.value in scope.params:
            return None
        if all(isinstance(v, cst.Call) and self.is_call_to(v, *DATALOADERS) for v in values):
            return name
        return None


def _is_list_expression(node: cst.CSTNode) -> bool:
    """`[x]`, `[f(v) for v in vs]`, `[None] * n`, `list(...)`: a value that only a list can be added to."""
    if isinstance(node, (cst.List, cst.ListComp)):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return isinstance(node.left, cst.List) or isinstance(node.right, cst.List)
    return isinstance(node, cst.Call) and code_of(node.func) == "list"


def _union_members(annotation: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`A | B | None` and `Optional[A]` / `Union[A, B]` -> their members; anything else is its own member."""
    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        return _union_members(annotation.left) + _union_members(annotation.right)
    if isinstance(annotation, cst.Subscript) and code_of(annotation.value).rpartition(".")[2] in ("Optional", "Union"):
        found: list[cst.BaseExpression] = []
        for element in annotation.slice:
            if isinstance(element.slice, cst.Index):
                found += _union_members(element.slice.value)
        return found
    return [annotation]


def _is_number(node: cst.CSTNode | None) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float))
