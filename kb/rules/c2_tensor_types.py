"""C2 — legacy CUDA tensor types (`torch.cuda.FloatTensor`) used as constructors and conversion targets."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import expr, string_value, with_commas
from ..rule import IMPORT_TORCH_XLA, XLA_DEVICE, Rule

# The legacy type name -> the dtype its values have.
DTYPES = {
    "FloatTensor": "torch.float32",
    "DoubleTensor": "torch.float64",
    "HalfTensor": "torch.float16",
    "BFloat16Tensor": "torch.bfloat16",
    "LongTensor": "torch.int64",
    "IntTensor": "torch.int32",
    "ShortTensor": "torch.int16",
    "CharTensor": "torch.int8",
    "ByteTensor": "torch.uint8",
    "BoolTensor": "torch.bool",
}


def cuda_type(rule: Rule, node: cst.CSTNode) -> str | None:
    """`FloatTensor` for `torch.cuda.FloatTensor` (or the string "torch.cuda.FloatTensor"), else None."""
    if type(node) is cst.Attribute and node.attr.value not in DTYPES:
        return None  # an attribute's names all end with its own: no name lookup needed
    names = rule.qualified_names(node) if isinstance(node, (cst.Attribute, cst.Name)) else set()
    text = string_value(node) if isinstance(node, cst.SimpleString) else None
    for name in (*names, text or ""):
        head, _, last = name.rpartition(".")
        if head == "torch.cuda" and last in DTYPES:
            return last
    return None


def _cpu_type(rule: Rule, node: cst.CSTNode, kind: str) -> bool:
    names = rule.qualified_names(node)
    return f"torch.{kind}" in names or (kind == "FloatTensor" and "torch.Tensor" in names)


def alias_value(rule: Rule, value: cst.CSTNode) -> str | None:
    """The legacy type an alias is bound to: `torch.cuda.FloatTensor`, or `torch.cuda.FloatTensor if cuda else
    torch.FloatTensor` (either order; the CPU side may be `torch.Tensor`)."""
    if isinstance(value, cst.IfExp):
        for gpu, cpu in ((value.body, value.orelse), (value.orelse, value.body)):
            kind = cuda_type(rule, gpu)
            if kind is not None and _cpu_type(rule, cpu, kind):
                return kind
        return None
    return cuda_type(rule, value) if isinstance(value, cst.Attribute) else None


def _constructor_call(rule: Rule, node: cst.CSTNode) -> cst.Call | None:
    """The `T(...)` call that builds a tensor with `node` (a legacy type) as its callee."""
    parent = rule.parent(node)
    return parent if isinstance(parent, cst.Call) and parent.func is node else None


def _type_call(rule: Rule, arg: cst.CSTNode) -> cst.Call | None:
    """The `x.type(T)` call whose only argument is `arg`."""
    holder = rule.parent(arg)
    call = rule.parent(holder) if isinstance(holder, cst.Arg) else None
    if (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "type"
        and len(call.args) == 1
        and call.args[0].keyword is None
    ):
        return call
    return None


def is_rewritten_use(rule: Rule, node: cst.CSTNode) -> bool:
    """Is `node` (a legacy type) a constructor call, a `.type()` target or an alias value? XLA232 owns those."""
    if _constructor_call(rule, node) is not None or _type_call(rule, node) is not None:
        return True
    parent = rule.parent(node)
    while isinstance(parent, cst.IfExp):
        node, parent = parent, rule.parent(parent)
    return isinstance(parent, cst.Assign) and parent.value is node


class LegacyCudaTensorType(Rule):
    code = "XLA232"
    needs = ("cuda",)
    title = "Legacy CUDA tensor types (`torch.cuda.FloatTensor`) build tensors on a GPU"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.cuda.FloatTensor(...)` and its siblings used as constructors, as `x.type(torch.cuda.FloatTensor)` "
        "targets, and through aliases such as `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`."
    )
    why = (
        "A TPU host has no NVIDIA driver: the CUDA types raise `Found no NVIDIA driver`, and behind a guard that "
        "is False on TPU the CPU types put the data on the host while the model is on the XLA device. There is "
        "no XLA tensor type to construct, and `x.type(T)` always returns a CPU tensor for the XLA device. The "
        "fix builds the same values with the CPU type and moves them (`T(...).to(torch_xla.device())`), and "
        "converts with `x.to(torch_xla.device(), dtype)`: same values, on the device."
    )
    before = (
        "import torch\n\nTensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor\n"
        "valid = Tensor(n, 1).fill_(1.0)\nreal = imgs.type(Tensor)\n"
    )
    after = (
        "import torch\nimport torch_xla\n\nTensor = torch.FloatTensor\n"
        "valid = Tensor(n, 1).to(torch_xla.device()).fill_(1.0)\nreal = imgs.to(torch_xla.device(), torch.float32)\n"
    )
    message = "legacy CUDA tensor type: build on the CPU type and move to `torch_xla.device()`"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system", "Expected all tensors to be on the same device")
    references = ("pytorch/xla docs: migration-to-xla-on-tpus.md",)
    valid = (
        "import torch\nx = torch.FloatTensor(3)\n",
        "import torch\nok = isinstance(t, torch.Tensor)\n",
    )

    def visit_Module(self, node: cst.Module) -> None:
        bindings = self._bindings(node)
        uses: dict[str, list[cst.Name]] = {name: [] for name in bindings}
        for name in self.analysis.nodes.names:
            if type(name) is cst.Name and name.value in uses and self._is_read(name):
                uses[name.value].append(name)
            elif type(name) is cst.Attribute and (kind := cuda_type(self, name)) is not None:
                self._direct(name, kind)
        for alias, found in bindings.items():
            kind = found[0][1]
            # one use the fix cannot carry (`isinstance(x, Tensor)`) keeps the whole alias for a human, and so
            # does no use at all: the alias serves other modules (`from utils import *`), whose uses this fix
            # cannot move to the device
            fixable = bool(uses[alias]) and all(self._fixable(use) for use in uses[alias])
            for value, _ in found:
                message = f"`{alias}` is a legacy CUDA tensor type: bind the CPU type, move what it builds"
                if not uses[alias]:
                    message += " (no code of this module uses it: move what other modules build with it)"
                self.report(
                    value,
                    message,
                    replacement=expr(f"torch.{kind}") if fixable else None,
                    fix=None if fixable else "manual",
                )
            for use in uses[alias]:
                self._use(use, kind, fixable)
        for string in self.analysis.nodes.strings:
            kind = cuda_type(self, string)
            call = _type_call(self, string) if kind is not None else None
            if call is not None and kind is not None:
                self._convert(call, kind)

    def _bindings(self, module: cst.Module) -> dict[str, list[tuple[cst.BaseExpression, str]]]:
        """Names bound only to legacy CUDA types of one kind, with their bound values (any other binding of the
        name, or an import of it, disqualifies)."""
        found: dict[str, list[tuple[cst.BaseExpression, str]]] = {}
        other = _imported_names(module)
        for assign in self.analysis.nodes.assigns:
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            kind = alias_value(self, assign.value) if isinstance(assign, cst.Assign) else None
            for target in targets:
                if isinstance(target, cst.Name) and kind is not None:
                    found.setdefault(target.value, []).append((assign.value, kind))
                elif isinstance(target, cst.Name):
                    other.add(target.value)
        aliases = {k: v for k, v in found.items() if k not in other and len({kind for _, kind in v}) == 1}
        for name, values in found.items():
            if name not in aliases:  # XLA220 leaves these values to this rule: never silent
                for value, _ in values:
                    message = f"`{name}` is bound to a legacy CUDA tensor type here and to something else elsewhere"
                    self.report(value, message, fix="manual")
        return aliases

    def _is_read(self, name: cst.Name) -> bool:
        parent = self.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            return False  # the `FloatTensor` of `torch.FloatTensor`
        return not isinstance(parent, cst.AssignTarget)

    def _fixable(self, use: cst.Name) -> bool:
        return _constructor_call(self, use) is not None or _type_call(self, use) is not None

    def _direct(self, node: cst.Attribute, kind: str) -> None:
        """`torch.cuda.FloatTensor(...)` or `x.type(torch.cuda.FloatTensor)` written out."""
        self._rewrite(node, kind, self.message)

    def _use(self, name: cst.Name, kind: str, fixable: bool) -> None:
        if fixable:
            self._rewrite(name, kind, f"`{name.value}(...)` builds a tensor off the XLA device")
        else:
            message = f"`{name.value}` is a legacy CUDA tensor type; use dtypes and `torch_xla.device()` instead"
            self.report(name, message, fix="manual")

    def _rewrite(self, node: cst.Name | cst.Attribute, kind: str, message: str) -> None:
        """A constructor call builds with the CPU type and moves; a `.type()` conversion becomes `.to()`."""
        if (call := _constructor_call(self, node)) is not None:
            built = call if isinstance(node, cst.Name) else call.with_changes(func=expr(f"torch.{kind}"))
            self.report(call, message, _moved(built), (IMPORT_TORCH_XLA,))
        elif (call := _type_call(self, node)) is not None:
            self._convert(call, kind)

    def _convert(self, call: cst.Call, kind: str) -> None:
        assert isinstance(call.func, cst.Attribute)
        args = [cst.Arg(expr(XLA_DEVICE)), cst.Arg(expr(DTYPES[kind]))]
        replacement = call.with_changes(func=call.func.with_changes(attr=cst.Name("to")), args=with_commas(args))
        self.report(call, "`.type(...)` to a legacy type returns a CPU tensor", replacement, (IMPORT_TORCH_XLA,))


def _moved(call: cst.Call) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=call, attr=cst.Name("to")), args=[cst.Arg(expr(XLA_DEVICE))])


def _imported_names(module: cst.Module) -> set[str]:
    """Names the module's top-level imports bind (`from torch import Tensor` keeps `Tensor` as it is)."""
    names: set[str] = set()
    for line in module.body:
        for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
            if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    if isinstance(bound, cst.Name):
                        names.add(bound.value)
    return names
