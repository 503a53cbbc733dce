"""The parts of the device analysis (devices.py) that need no analysis: reading a device expression
(`is_cuda_value`, `key_of`, `argparse_dest`), what the analysis records (`Guard`, `DeviceFacts`), and the one
walk over the module that collects the nodes it looks at (`DeviceWalker`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from ..cst_helpers import dotted, string_value

CUDA_STRING = re.compile(r"cuda(:\d+)?$")


# --- small expression helpers --------------------------------------------------------------------


def is_cuda_value(node: cst.CSTNode | None) -> bool:
    """`'cuda'`, `'cuda:1'`, `f'cuda:{rank}'`, `'cuda:{}'.format(i)`, `'cuda:' + str(i)`, `'cuda:%d' % i`."""
    text = string_value(node)
    if text is not None:
        return bool(CUDA_STRING.match(text))
    if isinstance(node, cst.FormattedString):
        head = node.parts[0] if node.parts else None
        if all(isinstance(p, cst.FormattedStringText) for p in node.parts):  # f"cuda" without fields
            return bool(CUDA_STRING.match("".join(p.value for p in node.parts)))
        return isinstance(head, cst.FormattedStringText) and head.value.startswith("cuda:")
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        text = string_value(node.func.value)
        return text is not None and text.startswith("cuda:")
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add, cst.Modulo)):
        text = string_value(node.left)  # 'cuda:' + str(i), 'cuda:%d' % i
        return text is not None and text.startswith("cuda:")
    return False


def key_of(node: cst.CSTNode | None) -> str | None:
    """The name a value is held under: `device`, `args.device` -> device, `cfg['device']` -> device."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Call) and dotted(node.func) == "str" and len(node.args) == 1:
        return key_of(node.args[0].value)  # str(device)
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Index):
            return string_value(index.value)
    return None


def argparse_dest(call: cst.Call) -> str | None:
    """`add_argument('--dist-backend', ...)` -> dist_backend (or its `dest=`)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "dest":
            return string_value(arg.value)
    flags = [string_value(a.value) for a in call.args if a.keyword is None]
    longs = [f for f in flags if f and f.startswith("--")]
    name = longs[0] if longs else next((f for f in flags if f), None)
    return name.lstrip("-").replace("-", "_") if name else None


# --- facts ---------------------------------------------------------------------------------------------
@dataclass
class Guard:
    """A test that holds only with CUDA. `test` is the availability call or the `'cuda'` literal compared;
    `condition` the whole test expression around it; `regions` the code it protects."""

    test: cst.CSTNode
    condition: cst.BaseExpression
    regions: list[cst.CSTNode]
    # The variables the test is assigned to (`use_amp = 'cuda' in device`): their uses are the regions.
    keys: frozenset[str] = frozenset()
    flips: bool = False
    # Not flipped, and what it protects touches CUDA (seeds, cuDNN, pinned copies): dead code on a TPU host.
    # A guard around plain code (`if device.type == 'cuda': bs = 64`) is not quiet: that choice may matter.
    quiet: bool = False


@dataclass
class DeviceFacts:
    device_keys: set[str] = field(default_factory=set)
    int_keys: set[str] = field(default_factory=set)
    # CUDA device strings where a device value is made (assignment, default, argparse, dict entry, consumer).
    string_origins: list[cst.BaseExpression] = field(default_factory=list)
    # 'nccl' given as a process-group backend (literal, variable, default, argparse).
    nccl_origins: list[cst.SimpleString] = field(default_factory=list)
    # Ints used as devices (`.to(rank)`, `torch.device(local_rank)`, `device=args.gpu`): CUDA indices.
    int_devices: list[cst.BaseExpression] = field(default_factory=list)
    # `map_location=x` where the name x holds a CUDA or XLA device value: load on the CPU instead (XLA711).
    map_locations: list[cst.BaseExpression] = field(default_factory=list)
    # Keys used only as `map_location` (`loc = 'cuda:{}'.format(gpu)`): their origins become 'cpu', not 'xla'.
    map_location_keys: set[str] = field(default_factory=set)
    # The key each origin in `string_origins` is made for (id(origin) -> key; consumers' literals have none).
    origin_keys: dict[int, str] = field(default_factory=dict)
    accelerator_calls: list[cst.Call] = field(default_factory=list)
    guards: list[Guard] = field(default_factory=list)
    # (key, test): `device_type == "cpu"`, `device != "cpu"`, `device.type == "cpu"`, with `regions` the code
    # that runs when the device is not the CPU. On a TPU host the original fell back to the CPU there; once a
    # flip makes the device XLA, that code runs (flips.py checks that nothing in it needs CUDA).
    cpu_tests: list[tuple[str, Guard]] = field(default_factory=list)

    def dead_regions(self) -> list[cst.CSTNode]:
        """CUDA-only code a TPU host never runs: what quiet guards protect, and their tests."""
        out: list[cst.CSTNode] = []
        for guard in self.guards:
            if guard.quiet:
                out.extend(guard.regions)
                out.append(guard.condition)
        return out


class DeviceWalker:
    """What the analysis looks at, from one pass over the module's nodes (in syntax order): imports, calls,
    assignments, parameters, dict entries, comparisons, strings."""

    def __init__(self, nodes: list[cst.CSTNode]) -> None:
        self.aliases: dict[str, str] = {}
        self.calls: list[cst.Call] = []
        self.assigns: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []  # (target, value)
        self.params: list[cst.Param] = []
        self.dict_entries: list[cst.DictElement] = []
        self.comparisons: list[cst.Comparison] = []
        self.strings: list[cst.SimpleString] = []
        visits = {
            cst.Import: self.visit_Import,
            cst.ImportFrom: self.visit_ImportFrom,
            cst.Call: self.calls.append,
            cst.Assign: self.visit_Assign,
            cst.AnnAssign: self.visit_AnnAssign,
            cst.Param: self.params.append,
            cst.DictElement: self.dict_entries.append,
            cst.Comparison: self.comparisons.append,
            cst.SimpleString: self.strings.append,
        }
        self.star_import = False
        for node in nodes:
            visit = visits.get(type(node))  # exact types: isinstance on libcst's abstract classes is slow
            if visit is not None:
                visit(node)
        if self.star_import and "torch" not in self.aliases:
            self.aliases["torch"] = "torch"  # what `from utils import *` gives (names.py ImportNames.star_torch)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = dotted(alias.name)
            if name is None:
                continue
            if alias.asname is not None:
                self.aliases[dotted(alias.asname.name) or name] = name
            else:
                self.aliases[name.split(".")[0]] = name.split(".")[0]

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = dotted(node.module) if node.module is not None else None
        if isinstance(node.names, cst.ImportStar):
            self.star_import = True
            return
        if module is None or node.relative:
            return
        for alias in node.names:
            name = dotted(alias.name)
            local = dotted(alias.asname.name) if alias.asname is not None else name
            if name and local:
                self.aliases[local] = f"{module}.{name}"

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._target(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._target(node.target, node.value)

    def _target(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if (
            isinstance(target, cst.Tuple)
            and isinstance(value, cst.Tuple)
            and len(target.elements) == len(value.elements)
        ):
            for t, v in zip(target.elements, value.elements, strict=True):
                self._target(t.value, v.value)
        else:
            self.assigns.append((target, value))
