"""Device values within one module: where they come from (origins), where they flow (consumers), and which
code only runs when CUDA is there (guards).

Values are followed by *key*: the last name of the expression that holds them (`device`, `args.device` and
`self.device` all have the key `device`; `cfg["device"]` too). A key is a device key when it reaches a device
consumer (`.to(x)`, `device=x`, `map_location=x`, `torch.device(x)`, autocast's device type) or is named like
one (`device`, `train_device`, `device_type`). The origins of a device key are every place that gives it a
value: assignments (module-level config variables, dataclass fields), parameter defaults, argparse defaults
and choices, dict entries. Module-wide and by name, not by scope: good enough for scripts, where a name
means one thing, and what it misses is reported by the leftover scan instead of passing silently.

A guard is a test that is only true with CUDA (`torch.cuda.is_available()`, `torch.accelerator.is_available()`,
`'cuda' in device`, `device.type == "cuda"`), directly or through a variable (`use_cuda = ... and
torch.cuda.is_available()`). A guard *flips* when the code it protects selects the device (a CUDA device
string, `.cuda()`, `torch.device(...)`, `current_accelerator()`, a bf16 probe): that code is the path a TPU
must take, so the test is rewritten to hold there. A guard that does not flip protects CUDA-only
housekeeping that a TPU host never runs: nothing inside it is rewritten or reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import libcst as cst

from ..cst_helpers import dotted, find_nodes, keyword_arg, positional_args, string_value
from ..cst_walk import module_walk, walk
from .device_facts import DeviceFacts, DeviceWalker, Guard, argparse_dest, is_cuda_value, key_of
from .device_regions import cuda_reference_list, device_path, only_text

DEVICE_NAME = re.compile(r"(\w+_)?(device|dev)(_type|_name|_str|_kind)?$", re.IGNORECASE)
INT_DEVICE_NAME = re.compile(r"((\w+_)?rank|gpu|gpu_id|gpu_idx|device_id|device_idx)$")
AVAILABILITY = frozenset({"torch.cuda.is_available", "torch.accelerator.is_available"})
AUTOCASTS = frozenset({"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast"})
INIT_PROCESS_GROUP = "torch.distributed.init_process_group"
# A flag that may carry a CUDA test to another function or module (`args.cuda`, `self.use_cuda`, `use_gpu`): only
# such names are followed across the tree (project_steps.py `device_flags`).
FLAG_NAME = re.compile(r"cuda|gpu", re.IGNORECASE)
# The keys that the tree shows to choose the device elsewhere (ProjectSteps.device_flags), for the module analysed
# now: set by the engine around one module's rules (`tree_device_flags`).
_TREE_DEVICE_FLAGS: ContextVar[frozenset[str]] = ContextVar("tree_device_flags", default=frozenset())


@contextmanager
def tree_device_flags(keys: frozenset[str]) -> Iterator[None]:
    """Within: a guard assigned to one of `keys` flips (another module or function tests it, or takes it as the
    parameter that guards a device move, and no CUDA-only call of the tree is behind it)."""
    token = _TREE_DEVICE_FLAGS.set(keys)
    try:
        yield
    finally:
        _TREE_DEVICE_FLAGS.reset(token)


def _boolean_pair(node: cst.IfExp) -> bool | None:
    """True for `True if c else False`, False for `False if c else True`, None for anything else."""
    names = [n.value if isinstance(n, cst.Name) else None for n in (node.body, node.orelse)]
    if names == ["True", "False"]:
        return True
    if names == ["False", "True"]:
        return False
    return None


class DeviceAnalysis:
    """Runs once per module (see `analyse`); rules read its `facts`."""

    def __init__(self, module: cst.Module, tree_flags: frozenset[str] = frozenset()) -> None:
        self.tree_flags = tree_flags  # keys the tree shows to choose the device in other modules or functions
        self.nodes, self.parents = module_walk(module)
        self.walker = DeviceWalker(self.nodes)
        self.facts = DeviceFacts()
        self.cpu_utility: bool | None = None  # see `cpu_utility`, asked for by few rules
        self._run()

    # --- name resolution ---------------------------------------------------------------------------------
    def qualified(self, node: cst.CSTNode) -> str | None:
        """The import-resolved dotted name of `node` (`dist.init_process_group` -> torch.distributed...)."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        if head not in self.walker.aliases:
            return None
        base = self.walker.aliases[head]
        return f"{base}.{rest}" if rest else base

    def call_name(self, call: cst.Call) -> str | None:
        return self.qualified(call.func)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(node)

    # --- the analysis ----------------------------------------------------------------------------------
    def _run(self) -> None:
        consumers = self._consumers()
        facts = self.facts
        facts.device_keys = {k for k in (key_of(a) for a, kind in consumers if kind != "backend") if k}
        elsewhere = {key_of(a) for a, kind in consumers if kind not in ("backend", "map_location")}
        facts.map_location_keys = {
            k
            for k in (key_of(a) for a, kind in consumers if kind == "map_location")
            if k and k not in elsewhere and not DEVICE_NAME.match(k)
        }
        facts.int_keys = self._int_keys()
        for arg, kind in consumers:
            self._consumer(arg, kind)
        self._origins()
        self._accelerator()
        self._guards()
        self._cpu_tests()

    def _consumers(self) -> list[tuple[cst.BaseExpression, str]]:
        """(argument, kind) for every place a device value is used. kind: device, device_type, map_location,
        backend."""
        out: list[tuple[cst.BaseExpression, str]] = []
        for call in self.walker.calls:
            name = self.call_name(call)
            args = positional_args(call)
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "to" and args and name is None:
                out.append((args[0].value, "device"))
            if name == "torch.device" and args:
                out.append((args[0].value, "device"))
            if name in AUTOCASTS and args:
                out.append((args[0].value, "device_type"))
            if name == "torch.load" and len(args) > 1:
                out.append((args[1].value, "map_location"))
            if name == INIT_PROCESS_GROUP and args:
                out.append((args[0].value, "backend"))
            for kw, kind in (
                ("device", "device"),
                ("device_type", "device_type"),
                ("map_location", "map_location"),
                ("backend", "backend"),
            ):
                arg = keyword_arg(call, kw)
                if arg is not None and (kind != "backend" or name == INIT_PROCESS_GROUP):
                    out.append((arg.value, kind))
        return out

    def _is_device_key(self, key: str | None) -> bool:
        return key is not None and (key in self.facts.device_keys or bool(DEVICE_NAME.match(key)))

    def _int_keys(self) -> set[str]:
        keys = set()
        for param in self.walker.params:
            annotation = param.annotation.annotation if param.annotation is not None else None
            if isinstance(annotation, cst.Name) and annotation.value == "int":
                keys.add(param.name.value)
        for target, value in self.walker.assigns:
            key = key_of(target)
            if key and (
                isinstance(value, cst.Integer) or (isinstance(value, cst.Call) and dotted(value.func) == "int")
            ):
                keys.add(key)
        for call in self.walker.calls:
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument":
                type_arg = keyword_arg(call, "type")
                dest = argparse_dest(call)
                if dest and type_arg is not None and dotted(type_arg.value) == "int":
                    keys.add(dest)
        return keys

    def _is_int(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Integer):
            return True
        key = key_of(node)
        if key is None or not isinstance(node, (cst.Name, cst.Attribute)):
            return False
        return key in self.facts.int_keys or bool(INT_DEVICE_NAME.match(key))

    def _consumer(self, arg: cst.BaseExpression, kind: str) -> None:
        facts = self.facts
        if kind == "backend":
            if string_value(arg) == "nccl":
                facts.nccl_origins.append(arg)
            return
        if kind in ("device", "map_location") and self._is_int(arg):
            facts.int_devices.append(arg)
            return
        if kind == "map_location":
            if self._holds_device(arg):
                facts.map_locations.append(arg)
            return
        # a literal string right here is XLA202's (`.to('cuda')`, `device='cuda'`); other forms are ours
        if isinstance(arg, cst.SimpleString):
            return
        facts.string_origins.extend(self._value_strings(arg))

    def _holds_device(self, arg: cst.BaseExpression) -> bool:
        """Does this name hold a CUDA or an XLA device (a string, or `torch_xla.device()`) somewhere in the
        module? Literals right at the consumer are the consumer rule's own."""
        key = key_of(arg)
        if key is None or not isinstance(arg, (cst.Name, cst.Attribute, cst.Subscript)):
            return False
        return any(
            key_of(target) == key and (any(True for _ in self._value_strings(value)) or self._is_xla_value(value))
            for target, value in self.walker.assigns
        )

    def _is_xla_value(self, value: cst.BaseExpression) -> bool:
        text = string_value(value)
        if text is not None:
            return text == "xla" or text.startswith("xla:")
        if isinstance(value, cst.IfExp):
            return self._is_xla_value(value.body) or self._is_xla_value(value.orelse)
        return isinstance(value, cst.Call) and self.call_name(value) == "torch_xla.device"

    def _value_strings(self, value: cst.BaseExpression):
        """CUDA device strings in the value positions of an expression (not inside its tests)."""
        if is_cuda_value(value):
            yield value
        elif isinstance(value, cst.IfExp) and not self.is_cuda_fallback(value):
            yield from self._value_strings(value.body)
            yield from self._value_strings(value.orelse)
        elif isinstance(value, cst.BooleanOperation):
            yield from self._value_strings(value.left)
            yield from self._value_strings(value.right)
        elif isinstance(value, cst.Call):
            name = self.call_name(value)
            args = positional_args(value)
            if name in ("os.environ.get", "os.getenv") and len(args) > 1:
                yield from self._value_strings(args[1].value)
            elif name == "torch.device" and args and not isinstance(args[0].value, cst.SimpleString):
                yield from self._value_strings(args[0].value)  # torch.device('cuda') itself is XLA202's
            elif dotted(value.func) == "str" and args:
                yield from self._value_strings(args[0].value)

    def _nccl_values(self, value: cst.BaseExpression) -> list[cst.SimpleString]:
        """'nccl' in the value positions of an expression (`"gloo" if ... else "nccl"`)."""
        if string_value(value) == "nccl" and isinstance(value, cst.SimpleString):
            return [value]
        if isinstance(value, cst.IfExp):
            return self._nccl_values(value.body) + self._nccl_values(value.orelse)
        if isinstance(value, cst.BooleanOperation):
            return self._nccl_values(value.left) + self._nccl_values(value.right)
        return []

    def _origins(self) -> None:
        facts = self.facts
        found: list[cst.BaseExpression] = []
        for target, value in self.walker.assigns:
            key = key_of(target)
            if self._is_device_key(key):
                made = list(self._value_strings(value))
                found.extend(made)
                facts.origin_keys.update((id(n), key) for n in made)  # type: ignore[misc]
            facts.nccl_origins.extend(self._nccl_values(value))
        for param in self.walker.params:
            if param.default is not None:
                if self._is_device_key(param.name.value):
                    made = list(self._value_strings(param.default))
                    found.extend(made)
                    facts.origin_keys.update((id(n), param.name.value) for n in made)
                if string_value(param.default) == "nccl":
                    facts.nccl_origins.append(param.default)
        for entry in self.walker.dict_entries:
            if self._is_device_key(string_value(entry.key)):
                found.extend(self._value_strings(entry.value))
        for call in self.walker.calls:
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument":
                self._argparse(call, found)
        seen = {id(n) for n in facts.string_origins}
        for node in found:
            if id(node) not in seen:
                seen.add(id(node))
                facts.string_origins.append(node)
        facts.nccl_origins = list({id(n): n for n in facts.nccl_origins}.values())

    def _argparse(self, call: cst.Call, found: list[cst.BaseExpression]) -> None:
        default = keyword_arg(call, "default")
        choices = keyword_arg(call, "choices")
        values = [default.value] if default is not None else []
        if choices is not None and isinstance(choices.value, (cst.List, cst.Tuple, cst.Set)):
            values += [e.value for e in choices.value.elements]
        if self._is_device_key(argparse_dest(call)):
            for value in values:
                found.extend(self._value_strings(value))
        self.facts.nccl_origins.extend(v for v in values if string_value(v) == "nccl")

    def _accelerator(self) -> None:
        for call in self.walker.calls:
            name = self.call_name(call)
            if name and name.startswith("torch.accelerator.") and name not in AVAILABILITY:
                self.facts.accelerator_calls.append(call)

    # --- guards ---------------------------------------------------------------------------------------
    def _guards(self) -> None:
        tests: list[cst.CSTNode] = [c for c in self.walker.calls if self.call_name(c) in AVAILABILITY]
        tests += [lit for comp in self.walker.comparisons if (lit := self._cuda_test_literal(comp)) is not None]
        tests += [lit for call in self.walker.calls if (lit := self._cuda_prefix_literal(call)) is not None]
        for test in tests:
            guard = self._guard(test)
            parent = self.parent(test)
            if isinstance(parent, cst.IfExp) and parent.test is test and self.is_cuda_fallback(parent):
                continue  # `'cuda' if torch.cuda.is_available() else 'cpu'` as a whole is XLA203's
            if guard is not None:
                guard.flips = (
                    self._has_device_path(guard.condition)
                    or any(self._has_device_path(r) for r in guard.regions)
                    or self._gives_up_otherwise(guard)
                    or not guard.keys.isdisjoint(self.tree_flags)
                ) and not (isinstance(test, cst.SimpleString) and self._and_no_cuda(test, guard.condition))
                guard.quiet = not guard.flips and (
                    any(self.has_cuda_reference(r) for r in guard.regions)
                    or (bool(guard.regions) and all(only_text(r) for r in guard.regions))
                )
                self.facts.guards.append(guard)

    def _and_no_cuda(self, test: cst.CSTNode, condition: cst.CSTNode) -> bool:
        """Is `test` (`device.type == 'cuda'`) and-ed with `not torch.cuda.is_available()` in `condition`? Then the
        guard handles a CUDA value on a host without CUDA (skorch's `get_map_location` falls back to the CPU for a
        pickled net's 'cuda'): a TPU host runs it only for a value the program was handed, as the original did."""
        for node in walk(condition):
            if not (isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not)):
                continue
            if not (isinstance(node.expression, cst.Call) and self.call_name(node.expression) in AVAILABILITY):
                continue
            chain = [node, test]
            if all(self._and_chain_to(n, condition) for n in chain):
                return True
        return False

    def _and_chain_to(self, node: cst.CSTNode, condition: cst.CSTNode) -> bool:
        """Does `node` reach `condition` through `and`s only (the test's own comparison or call on the way)?"""
        current = node
        while current is not condition:
            parent = self.parent(current)
            if parent is None:
                return False
            if isinstance(parent, cst.BooleanOperation) and not isinstance(parent.operator, cst.And):
                return False
            if isinstance(parent, (cst.UnaryOperation, cst.IfExp)):
                return False
            current = parent
        return True

    def _cpu_tests(self) -> None:
        for comp in self.walker.comparisons:
            found = self._cpu_test_literal(comp)
            if found is None:
                continue
            literal, key = found
            test = self._guard(literal, not_cpu=True)
            if test is not None and test.regions:
                self.facts.cpu_tests.append((key, test))

    def _cpu_test_literal(self, comp: cst.Comparison) -> tuple[cst.SimpleString, str] | None:
        """The `'cpu'` literal of `device_type == 'cpu'`, `device != "cpu"`, `device.type == 'cpu'`, `'cpu' in
        device`, and the key of the device value it tests (`device` for `device.type`)."""
        if len(comp.comparisons) != 1:
            return None
        operator = comp.comparisons[0].operator
        if not isinstance(operator, (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)):
            return None
        sides = (comp.left, comp.comparisons[0].comparator)
        literal = next((s for s in sides if isinstance(s, cst.SimpleString) and string_value(s) == "cpu"), None)
        other = next((s for s in sides if s is not literal), None)
        if literal is None or other is None:
            return None
        key = key_of(other)
        if key == "type" and isinstance(other, cst.Attribute):
            key = key_of(other.value)  # `device.type`, `x.device.type`
        return (literal, key) if self._is_device_key(key) else None  # type: ignore[return-value]

    def _cuda_test_literal(self, comp: cst.Comparison) -> cst.SimpleString | None:
        """The `'cuda'` literal of `'cuda' in device`, `device.type == 'cuda'`, `device_type != "cuda"` (or the
        `'nccl'` of `args.dist_backend == 'nccl'`)."""
        if len(comp.comparisons) != 1:
            return None
        target = comp.comparisons[0]
        sides = (comp.left, target.comparator)
        literal = next(
            (s for s in sides if isinstance(s, cst.SimpleString) and string_value(s) in ("cuda", "nccl")), None
        )
        other = next((s for s in sides if s is not literal), None)
        if literal is None or other is None:
            return None
        if string_value(literal) == "nccl":
            return literal  # `backend == 'nccl'`: only a process-group backend is ever called that
        key = key_of(other)
        if self._is_device_key(key) or key == "type":
            return literal
        return None

    def _cuda_prefix_literal(self, call: cst.Call) -> cst.SimpleString | None:
        """The `'cuda'` literal of `device.startswith('cuda')` (build-nanogpt's `device_type` test)."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "startswith" and len(call.args) == 1):
            return None
        literal = call.args[0].value
        if not (isinstance(literal, cst.SimpleString) and string_value(literal) in ("cuda", "cuda:")):
            return None
        return literal if self._is_device_key(key_of(func.value)) else None

    def _guard(self, test: cst.CSTNode, not_cpu: bool = False) -> Guard | None:
        """The condition around `test` and the code it protects; None when the test is not a plain guard
        (an `or`, a call argument, an assert). `not_cpu`: `test` is the `'cpu'` of a CPU test, and the code
        wanted is what runs when the device is not the CPU."""
        positive = not not_cpu
        node: cst.CSTNode = test
        if isinstance(test, cst.SimpleString) and isinstance(self.parent(test), cst.Arg):
            node = self.parent(self.parent(test))  # the `device.startswith('cuda')` call
        elif isinstance(test, cst.SimpleString):
            comp = self.parent(test)
            if isinstance(comp, cst.ComparisonTarget):
                comp = self.parent(comp)
            assert isinstance(comp, cst.Comparison)
            if isinstance(comp.comparisons[0].operator, (cst.NotEqual, cst.NotIn, cst.IsNot)):
                positive = not positive
            node = comp
        while True:
            parent = self.parent(node)
            if isinstance(parent, cst.BooleanOperation) and isinstance(parent.operator, cst.And) and positive:
                node = parent
            elif isinstance(parent, cst.BooleanOperation) and isinstance(parent.operator, cst.Or) and not positive:
                node = parent  # `args.no_cuda or not torch.cuda.is_available()`: False only with CUDA
            elif isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
                positive = not positive
                node = parent
            elif isinstance(parent, cst.IfExp) and parent.test is node and (pair := _boolean_pair(parent)) is not None:
                positive = positive == pair  # `True if <test> else False` is the test itself
                node = parent
            else:
                break
        parent = self.parent(node)
        regions: list[cst.CSTNode] = []
        keys: set[str] = set()
        if isinstance(parent, cst.If) and parent.test is node:
            regions = self._branch(parent, positive)
        elif isinstance(parent, cst.IfExp) and parent.test is node:
            regions = [parent.body if positive else parent.orelse]
        elif isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is node and positive:
            targets = [t.target for t in parent.targets] if isinstance(parent, cst.Assign) else [parent.target]
            keys = {key_of(t) for t in targets} - {None}
            regions = self._uses_as_test(keys)
        else:
            return None
        return Guard(test=test, condition=node, regions=regions, keys=frozenset(keys))  # type: ignore[arg-type]

    def cuda_only_switch(self, value: cst.BaseExpression) -> bool:
        """Is `value` a switch that stays False on a TPU host: a variable set from a CUDA test that no rewrite
        flips (`use_amp = 'cuda' in device`), or such a test written in place?"""
        if isinstance(value, (cst.Name, cst.Attribute)):
            key = key_of(value)
            return any(not guard.flips and key in guard.keys for guard in self.facts.guards)
        tests = [n for n in walk(value) if isinstance(n, cst.Call) and self.call_name(n) in AVAILABILITY]
        tests += [n for n in walk(value) if isinstance(n, cst.Comparison) and self._cuda_test_literal(n) is not None]
        return bool(tests)

    def _branch(self, node: cst.If, positive: bool) -> list[cst.CSTNode]:
        if positive:
            return [node.body]
        return [node.orelse] if node.orelse is not None else []

    def _uses_as_test(self, keys: set[str]) -> list[cst.CSTNode]:
        """The code that `if use_cuda:` / `x if use_cuda else y` / `if not use_cuda:` protect."""
        regions: list[cst.CSTNode] = []
        for node in self._named(keys):
            parent = self.parents.get(node)
            if isinstance(node, cst.Name) and isinstance(parent, cst.Attribute) and parent.attr is node:
                continue
            positive, test = True, node
            while True:
                up = self.parent(test)
                if isinstance(up, cst.BooleanOperation) and isinstance(up.operator, cst.And) and positive:
                    test = up
                elif isinstance(up, cst.UnaryOperation) and isinstance(up.operator, cst.Not):
                    positive, test = not positive, up
                else:
                    break
            up = self.parent(test)
            if isinstance(up, cst.If) and up.test is test:
                regions += self._branch(up, positive)
            elif isinstance(up, cst.IfExp) and up.test is test:
                regions.append(up.body if positive else up.orelse)
        return regions

    def flag_tests(self) -> Iterator[tuple[cst.Name | cst.Attribute, cst.CSTNode]]:
        """(flag, region) for each name or attribute named like a device flag (FLAG_NAME) that is the test, or an
        `and` operand of the test, of an `if` or a conditional expression (`not` taking the other branch)."""
        for node in self.nodes:
            if type(node) is not cst.If and type(node) is not cst.IfExp:  # exact types (no subclasses): no ABCMeta
                continue
            stack: list[tuple[cst.CSTNode, bool]] = [(node.test, True)]
            while stack:
                test, positive = stack.pop()
                if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                    stack.append((test.expression, not positive))
                elif isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And) and positive:
                    stack += [(test.left, True), (test.right, True)]
                elif isinstance(test, (cst.Name, cst.Attribute)) and FLAG_NAME.search(key_of(test) or ""):
                    if isinstance(node, cst.If):
                        regions = self._branch(node, positive)
                    else:
                        regions = [node.body if positive else node.orelse]
                    for region in regions:
                        yield test, region

    def _named(self, keys: set[str]) -> list[cst.CSTNode]:
        """The names and attributes held under `keys`, in walk order; indexed once per module, not scanned
        once per guard (a module of joined scripts has many guards: that was quadratic)."""
        if not hasattr(self, "_by_key"):
            self._by_key: dict[str, list[tuple[int, cst.CSTNode]]] = {}
            for i, node in enumerate(self.nodes):
                if isinstance(node, (cst.Name, cst.Attribute)):
                    self._by_key.setdefault(key_of(node), []).append((i, node))
        found = [pair for key in keys for pair in self._by_key.get(key, ())]
        return [node for _, node in sorted(found, key=lambda pair: pair[0])]

    def has_cuda_reference(self, region: cst.CSTNode) -> bool:
        """Does `region` touch CUDA (torch.cuda, cuDNN, torch.accelerator, `.cuda()`, `.pin_memory()`, nccl)?"""
        return bool(cuda_reference_list(self, region))

    def is_cuda_fallback(self, node: cst.IfExp) -> bool:
        """`'cuda' if torch.cuda.is_available() else ...` (or `torch.device(...)`, `f'cuda:{i}'`, or a device
        variable such as `args.device` as the body): XLA203 rewrites the whole expression, so neither its string
        nor its test is reported again here."""
        test_is_probe = isinstance(node.test, cst.Call) and self.call_name(node.test) == "torch.cuda.is_available"
        body = node.body
        body_is_device = (
            is_cuda_value(body)
            or (isinstance(body, cst.Call) and self.call_name(body) == "torch.device")
            or self.is_device_variable(body)
        )
        return test_is_probe and body_is_device

    def is_device_variable(self, node: cst.CSTNode) -> bool:
        """`device`, `args.device`, `cfg["device"]`: a value held under a device key (named so, or given to a
        device consumer), whose CUDA origins XLA226 rewrites where they are made."""
        return isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)) and self._is_device_key(key_of(node))

    def _gives_up_otherwise(self, guard: Guard) -> bool:
        """`if torch.cuda.is_available(): ... else: print('needs a GPU'); sys.exit(1)`: without the accelerator
        the program stops, so the guard asks for the accelerator, and a TPU is one."""
        node = self.parent(guard.condition)
        if not isinstance(node, cst.If) or node.test is not guard.condition or guard.regions != [node.body]:
            return False  # a negative test (`if not ...: raise`) is an early exit: XLA203 leaves it alone
        orelse = node.orelse
        if not isinstance(orelse, cst.Else) or not isinstance(orelse.body, cst.IndentedBlock):
            return False
        lines = orelse.body.body
        return bool(lines) and all(_reports_or_stops(line) for line in lines) and _stops(lines[-1])

    def _has_device_path(self, region: cst.CSTNode) -> bool:
        """Does `region` select the device (what a TPU must run), not just CUDA housekeeping?"""
        return device_path(self, region)


STOPS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


def _stops(line: cst.BaseStatement) -> bool:
    """`raise ...` or `sys.exit(...)` on a line of its own."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return False
    small = line.body[0]
    if isinstance(small, cst.Raise):
        return True
    return isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and dotted(small.value.func) in STOPS


def _reports_or_stops(line: cst.BaseStatement) -> bool:
    """A line of a give-up branch: a message (`print`, `logger.error(...)`, `warnings.warn`) or the stop."""
    if _stops(line):
        return True
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return False
    small = line.body[0]
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    name = dotted(small.value.func) or ""
    return name == "print" or name.rpartition(".")[2] in ("error", "warning", "warn", "critical", "info")


def imports_torch_xla(module: cst.Module) -> bool:
    """Is `module` torch_xla code? A CUDA program that works on GPUs already has, somewhere in its files, what
    torch_xla idioms replace (a process group, a gradient all-reduce): findings about their absence need this."""
    return any(m == "torch_xla" or m.startswith("torch_xla.") for m in analyse(module).walker.aliases.values())


# What a script that only converts, exports or evaluates does with its model.
CHECKPOINT_CALLS = frozenset(
    {
        "torch.load",
        "torch.save",
        "torch.onnx.export",
        "torch.jit.trace",
        "torch.jit.script",
        "torch.jit.save",
        "torch.export.export",
        "safetensors.torch.save_file",
        "safetensors.torch.load_file",
    }
)
CHECKPOINT_METHODS = frozenset({"save_pretrained", "from_pretrained", "load_state_dict", "push_to_hub"})
# Calls that train (or may: a Trainer, a fit loop, a stepping helper).
TRAINING_METHODS = frozenset({"backward", "step", "train", "fit", "optimizer_step", "training_step"})


# Within a fix (all its passes): the answer `cpu_utility` gave first, on the program as written. The fix's own
# rewrites remove the `.cuda()` that made a script need CUDA; asked again, the rewritten script would look like one
# that ran on the CPU.
_DECIDED: ContextVar[list[bool] | None] = ContextVar("cpu_utility_decided", default=None)


@contextmanager
def one_cpu_decision() -> Iterator[None]:
    """Within: `cpu_utility` answers what it answered the first time (the engine opens this around one fix)."""
    token = _DECIDED.set([])
    try:
        yield
    finally:
        _DECIDED.reset(token)


def cpu_utility(module: cst.Module) -> bool:
    """A script (a `__main__` block or module-level statements that run) that works on checkpoints (load, save,
    convert, export), trains nowhere, and ran on the CPU of a TPU host: its cuda-if-available device is a
    convenience, and moving it onto XLA breaks its saves (`save_pretrained` of XLA tensors: `invalid python
    storage`) for no speed that matters. A script with a line that asks for CUDA whatever its tests say failed
    there instead: it is migrated like any other."""
    decided = _DECIDED.get()
    if decided:
        return decided[0]
    analysis = analyse(module)
    if analysis.cpu_utility is None:
        # a flat script counts when it also picks a CUDA device (the convenience kept on the CPU)
        flat_script = _picks_cuda(analysis) and _checkpoints_at_top_level(module, analysis)
        analysis.cpu_utility = (
            (_is_script(module) or flat_script)
            and _checkpoints_without_training(analysis)
            and not _needs_cuda(analysis)
        )
    if decided is not None:
        decided.append(analysis.cpu_utility)
    return analysis.cpu_utility


def _needs_cuda(analysis: DeviceAnalysis) -> bool:
    """A line that asks for CUDA whatever a test says: `.cuda()`, a CUDA tensor type, a CUDA device string that
    no conditional expression chooses (`device = "cuda"`, `.to("cuda")`), outside the code a CUDA guard keeps."""
    guarded = {id(n) for g in analysis.facts.guards for r in (*g.regions, g.condition) for n in walk(r)}

    def unconditional(node: cst.CSTNode) -> bool:
        while node is not None and not isinstance(node, cst.Module):
            if id(node) in guarded or isinstance(node, cst.IfExp):
                return False
            node = analysis.parent(node)
        return True

    for call in analysis.walker.calls:
        func = call.func
        cuda_move = isinstance(func, cst.Attribute) and func.attr.value == "cuda"
        tensor_type = (analysis.call_name(call) or "").startswith("torch.cuda.") and _func_name(call).endswith("Tensor")
        if (cuda_move or tensor_type) and unconditional(call):
            return True
    return any(unconditional(origin) for origin in analysis.facts.string_origins)


def _func_name(call: cst.Call) -> str:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""


def _checkpoints_without_training(analysis: DeviceAnalysis) -> bool:
    """A checkpoint call outside the classes (a method's `ema.load_state_dict(...)` is a model library's) and no
    training call anywhere."""
    checkpoints = False
    for call in analysis.walker.calls:
        func = call.func
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        if method in TRAINING_METHODS:
            return False
        if method in CHECKPOINT_METHODS or analysis.call_name(call) in CHECKPOINT_CALLS:
            checkpoints = checkpoints or not _in_class(analysis, call)
    return checkpoints


def _in_class(analysis: DeviceAnalysis, node: cst.CSTNode) -> bool:
    while node is not None:
        node = analysis.parent(node)
        if isinstance(node, cst.ClassDef):
            return True
    return False


def _picks_cuda(analysis: DeviceAnalysis) -> bool:
    """The module asks for CUDA: a CUDA device string, a guard, or a `torch.cuda.is_available()` test."""
    facts = analysis.facts
    if facts.guards or facts.string_origins:
        return True
    return any(analysis.call_name(call) == "torch.cuda.is_available" for call in analysis.walker.calls)


def _checkpoints_at_top_level(module: cst.Module, analysis: DeviceAnalysis) -> bool:
    """A flat script: a statement of the module itself (not a def or class) loads or saves a checkpoint, so the
    module does its work when it runs (`state = torch.load(...)` ... `torch.save(...)` with no `__main__` block)."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for call in find_nodes(stmt, cst.Call):
            func = call.func
            method = func.attr.value if isinstance(func, cst.Attribute) else None
            if method in CHECKPOINT_METHODS or analysis.call_name(call) in CHECKPOINT_CALLS:
                return True
    return False


def _is_script(module: cst.Module) -> bool:
    for stmt in module.body:
        if isinstance(stmt, (cst.For, cst.While)):
            return True
        if isinstance(stmt, cst.If) and "__main__" in cst.Module(body=[]).code_for_node(stmt.test):
            return True
    return False


_CACHE: dict[int, tuple[cst.Module, DeviceAnalysis]] = {}  # a few modules' analyses (see `analyse`)


def analyse(module: cst.Module) -> DeviceAnalysis:
    """The analysis of `module`, shared by every rule that visits the same module object (within the same
    `tree_device_flags`)."""
    flags = _TREE_DEVICE_FLAGS.get()
    cached = _CACHE.get(id(module))
    if cached is not None and cached[0] is module and cached[1].tree_flags == flags:
        return cached[1]
    analysis = DeviceAnalysis(module, flags)
    remember(module, analysis)
    return analysis


def analysed(module: cst.Module) -> DeviceAnalysis | None:
    """The analysis of `module` that `analyse` holds now, if any: a caller that keeps the module for a later pass
    (kb/batch.py keeps a tree's modules from its summary to their lint) keeps this too, and `remember`s it then."""
    cached = _CACHE.get(id(module))
    return cached[1] if cached is not None and cached[0] is module else None


def remember(module: cst.Module, analysis: DeviceAnalysis) -> None:
    """`analyse` answers `analysis` for `module` again (while its tree flags are the same)."""
    if len(_CACHE) > 16:
        _CACHE.clear()
    _CACHE[id(module)] = (module, analysis)
