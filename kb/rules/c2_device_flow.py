"""C2 — device values followed through the module (kb/analysis/devices.py): origins rewritten where the value
is made, so a `--device` flag or a config variable keeps working; ranks used as devices; CUDA guards.

One representation of the XLA device: the string `"xla"` where the code holds a string (it keeps working in
`'xla' in device`, `torch.device(device)`, `autocast(device_type=...)`), `torch_xla.device()` where it holds
an object.
"""

from __future__ import annotations

import libcst as cst

from ..analysis.device_facts import argparse_dest
from ..analysis.devices import DEVICE_NAME, DeviceAnalysis, Guard, analyse
from ..cst_helpers import code_of, expr, is_cuda_string, keyword_arg, method_name, string_value
from ..rule import IMPORT_TORCH_XLA, IMPORT_XM, REMOVE, Rule

XLA_BACKEND: tuple[str, None, None] = ("torch_xla.distributed.xla_backend", None, None)


def _quote(node: cst.BaseExpression) -> str:
    """The quote character of a string literal or f-string (double quotes otherwise)."""
    if isinstance(node, cst.SimpleString):
        return node.quote
    if isinstance(node, cst.FormattedString):
        return node.start.lstrip("fFrRbB") or '"'
    return '"'


def _string(value: str, like: cst.BaseExpression) -> cst.SimpleString:
    quote = _quote(like)
    return cst.SimpleString(f"{quote}{value}{quote}")


def call_taking(analysis: DeviceAnalysis, node: cst.CSTNode) -> cst.Call | None:
    """The call that takes `node` as one of its arguments, else None."""
    arg = analysis.parent(node)
    call = analysis.parent(arg) if isinstance(arg, cst.Arg) else None
    return call if isinstance(call, cst.Call) else None


def nccl_values_made_apart(analysis: DeviceAnalysis) -> list[cst.SimpleString]:
    """The module's `'nccl'` backend values but a literal given to `init_process_group` itself (the entries about
    that call, XLA223 and TPU701, rewrite it there)."""
    return [
        node
        for node in analysis.facts.nccl_origins
        if (call := call_taking(analysis, node)) is None
        or analysis.call_name(call) != "torch.distributed.init_process_group"
    ]


class DeviceFlowRule(Rule):
    """Rules that read the module's device analysis."""

    def visit_Module(self, node: cst.Module) -> None:
        self.check(analyse(node))

    def check(self, analysis: DeviceAnalysis) -> None:
        raise NotImplementedError


class CudaDeviceOrigin(DeviceFlowRule):
    code = "XLA226"
    title = "A device value made as a CUDA string (config variable, default, flag, f-string)"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "CUDA device strings where a device value is made and then flows to `.to()`, `device=`, `torch.device()` "
        "or autocast: module-level config variables (`device = 'cuda'`), argparse defaults and choices, "
        "parameter defaults, dict and dataclass fields, `f'cuda:{rank}'`, `'cuda:{}'.format(i)`."
    )
    why = (
        "The value is used far from where it is written, so rewriting the uses misses it: the program dies with "
        "`Found no NVIDIA driver` or, behind a test such as `'cuda' in device`, runs on the CPU. Rewriting where "
        "the value is made keeps the configuration surface (`--device=...`, a config file) working. The XLA "
        "device as a string is `'xla'` (each process owns one chip: `f'cuda:{rank}'` becomes `'xla'`). A value used "
        "only as `torch.load`'s `map_location` becomes `'cpu'`: XLA tensors cannot be restored, CPU ones are "
        "copied onto the device by `load_state_dict`."
    )
    before = "import torch\n\ndevice = 'cuda'\nx = torch.zeros(2).to(device)\n"
    after = "import torch\nimport torch_xla  # noqa: F401\n\ndevice = 'xla'\nx = torch.zeros(2).to(device)\n"
    message = "CUDA device value made here; the XLA device string is `'xla'`"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("xla-device-facts: the string 'xla' works wherever a device string is accepted",)
    valid = ("import torch\ndevice = 'cpu'\nx = torch.zeros(2).to(device)\n", "name = 'cuda'\nprint(name)\n")

    def check(self, analysis: DeviceAnalysis) -> None:
        facts = analysis.facts
        for node in facts.string_origins:
            if facts.origin_keys.get(id(node)) in facts.map_location_keys:
                # only ever a `map_location`: XLA tensors cannot be restored there (XLA711), the CPU can
                self.report(node, MAP_LOCATION_ONLY, replacement=_string("cpu", node))
            else:
                self.report(node, replacement=_string("xla", node), imports=(IMPORT_TORCH_XLA,))


MAP_LOCATION_ONLY = (
    "CUDA device value made here and used only as `map_location`: load on the CPU (`'cpu'`), "
    "`load_state_dict` copies onto the device"
)


class IntRankAsDevice(DeviceFlowRule):
    code = "XLA227"
    title = "An int (a rank or GPU index) used as a device"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "Ints given where a device goes: `.to(rank)`, `.to(self.gpu_id)`, `torch.device(local_rank)`, "
        "`device=args.gpu` (parameters annotated `int`, `int(...)` values, `type=int` flags, rank-named values)."
    )
    why = (
        "An int device is a CUDA index: `.to(0)` means `cuda:0` and fails with `Found no NVIDIA driver` on a TPU "
        "host. Each XLA process owns one chip, `torch_xla.device()`; the rank itself stays (logging, "
        "checkpointing on rank 0), only its use as a device changes."
    )
    before = "import torch\n\ndef run(model, rank: int):\n    model.to(rank)\n"
    after = "import torch\nimport torch_xla\n\ndef run(model, rank: int):\n    model.to(torch_xla.device())\n"
    message = "an int used as a device is a CUDA index; use `torch_xla.device()`"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    valid = ("import torch\nx = torch.zeros(2).to(torch.float16)\n",)

    def check(self, analysis: DeviceAnalysis) -> None:
        for node in analysis.facts.int_devices:
            call = call_taking(analysis, node)
            device = call if call is not None and analysis.call_name(call) == "torch.device" else node
            if _map_location_of_load(analysis, device):
                continue  # XLA711 loads on the CPU and moves the result (XLA is no map_location)
            self.report(device, replacement=expr("torch_xla.device()"), imports=(IMPORT_TORCH_XLA,))


def _map_location_of_load(analysis: DeviceAnalysis, value: cst.CSTNode) -> bool:
    """`value` is the map_location of a `torch.load` call (its keyword or its second positional argument)."""
    load = call_taking(analysis, value)
    if load is None or analysis.call_name(load) != "torch.load":
        return False
    arg = analysis.parent(value)
    return (
        arg.keyword is not None
        and arg.keyword.value == "map_location"
        or (arg.keyword is None and len(load.args) > 1 and load.args[1] is arg)
    )


class AcceleratorApi(DeviceFlowRule):
    code = "XLA228"
    title = "`torch.accelerator` does not see the XLA device"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.accelerator.current_accelerator()`, `set_device_index()`, `synchronize()` and the other "
        "`torch.accelerator` calls (`is_available()` is a guard: XLA230)."
    )
    why = (
        "On an XLA host `torch.accelerator.is_available()` is False and `current_accelerator()` does not return "
        "the XLA device: code that picks its device this way trains on the CPU with exit code 0. The XLA device is "
        "`torch_xla.device()`; `set_device_index` has nothing to select (one chip per process) and "
        "`synchronize()` is `xm.wait_device_ops()`."
    )
    before = "import torch\n\ndevice = torch.accelerator.current_accelerator()\n"
    after = "import torch_xla\n\ndevice = torch_xla.device()\n"
    message = "`torch.accelerator` does not know the XLA device; use `torch_xla.device()`"
    references = ("xla-device-facts: torch.accelerator on an XLA host",)
    valid = ("import torch_xla\ndevice = torch_xla.device()\n",)

    def check(self, analysis: DeviceAnalysis) -> None:
        for call in analysis.facts.accelerator_calls:
            name = analysis.call_name(call)
            if name == "torch.accelerator.current_accelerator":
                self.report(call, replacement=expr("torch_xla.device()"), imports=(IMPORT_TORCH_XLA,))
            elif name == "torch.accelerator.synchronize":
                self.report(call, replacement=expr("xm.wait_device_ops()"), imports=(IMPORT_XM,))
            elif name == "torch.accelerator.set_device_index" and _alone(analysis, call) is not None:
                self.report(_alone(analysis, call), replacement=REMOVE)  # type: ignore[arg-type]
            elif name == "torch.accelerator.device_count":
                continue  # a device count like `torch.cuda.device_count()`: XLA211's
            else:
                self.report(call, f"`{name}` does not see the XLA device; rewrite it for `torch_xla` by hand")


def _alone(analysis: DeviceAnalysis, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The statement line when `call` is the whole statement."""
    stmt = analysis.parent(call)
    line = analysis.parent(stmt) if isinstance(stmt, cst.Expr) else None
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line
    return None


class NcclBackendValue(DeviceFlowRule):
    code = "XLA229"
    title = "`'nccl'` given as the process-group backend through a variable, default or flag"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "The string `'nccl'` where a backend value is made: `backend = 'nccl'` config variables, "
        "`def setup(backend='nccl')`, `add_argument('--dist-backend', default='nccl')`, and literals passed to "
        "`init_process_group` through a helper."
    )
    why = (
        "NCCL needs GPUs (`ProcessGroupNCCL is only supported with GPUs, no GPUs found!`). The XLA collective "
        "backend is `'xla'`, registered by `import torch_xla.distributed.xla_backend`; rank and world size keep "
        "coming from the launcher (torchrun's environment, or `init_method='xla://'` under `torch_xla.launch`)."
    )
    before = "import torch.distributed as dist\n\nbackend = 'nccl'\ndist.init_process_group(backend=backend)\n"
    after = (
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n\n"
        "backend = 'xla'\ndist.init_process_group(backend=backend)\n"
    )
    message = "NCCL needs GPUs; the XLA process-group backend is `'xla'`"
    symptoms = ("ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",)
    references = ("docs/source/perf/ddp.md",)
    valid = ("backend = 'gloo'\n",)

    def check(self, analysis: DeviceAnalysis) -> None:
        for node in nccl_values_made_apart(analysis):  # a literal at the call is XLA223's (it sets init_method too)
            self.report(node, replacement=_string("xla", node), imports=(XLA_BACKEND,))


class CudaGuard(DeviceFlowRule):
    code = "XLA230"
    title = "A CUDA guard around the device choice stays False on TPU"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "Tests that hold only with CUDA — `torch.cuda.is_available()`, `torch.accelerator.is_available()`, "
        "`'cuda' in device`, `device.type == 'cuda'`, directly or through `use_cuda = ... and "
        "torch.cuda.is_available()` — whose protected code selects the device."
    )
    why = (
        "The guard is False on a TPU host, so the migrated branch never runs and the program trains on the CPU "
        "with exit code 0. The test is rewritten so the TPU takes that branch; user switches (`not "
        "args.no_cuda`) keep working. Guards around CUDA-only housekeeping (seeds, cuDNN flags, pinned "
        "copies) are left alone: a TPU never runs that code, so it is neither rewritten nor reported."
    )
    before = (
        "import torch\n\nuse_cuda = not args.no_cuda and torch.cuda.is_available()\n"
        "device = torch.device('cuda' if use_cuda else 'cpu')\n"
    )
    after = "import torch\n\nuse_cuda = not args.no_cuda\ndevice = torch.device('cuda' if use_cuda else 'cpu')\n"
    message = "this CUDA test is False on TPU and keeps the migrated device code from running"
    valid = ("import torch\nif torch.cuda.is_available():\n    torch.cuda.manual_seed_all(0)\n",)

    def check(self, analysis: DeviceAnalysis) -> None:
        for guard in analysis.facts.guards:
            if guard.flips:
                self._flip(analysis, guard)

    def _flip(self, analysis: DeviceAnalysis, guard: Guard) -> None:
        if isinstance(guard.test, cst.SimpleString):  # 'cuda' in device -> 'xla' in device
            self.report(guard.test, replacement=_string("xla", guard.test))
            return
        folded = _fold(guard.condition, guard.test)
        parent = analysis.parent(guard.condition)
        constant = folded.value if isinstance(folded, cst.Name) and folded.value in ("True", "False") else None
        if isinstance(parent, cst.If) and constant is not None and not _is_elif(analysis, parent):
            self.report(guard.test, target=parent, replacement=_taken_branch(parent, constant == "True"))
            if constant == "True" and _ends_in_return(parent.body):
                for dead in _after(analysis, parent):  # `return torch.device("cpu")` after the taken branch
                    self.report(dead, "unreachable once the CUDA guard above is always taken on XLA", REMOVE)
        elif isinstance(parent, cst.If) and constant == "True":  # `elif <guard>:` -> `else:` (what follows is dead)
            replacement = cst.Else(body=parent.body, leading_lines=parent.leading_lines)
            self.report(guard.test, target=parent, replacement=replacement)
        elif isinstance(parent, cst.IfExp) and constant is not None:
            branch = parent.body if constant == "True" else parent.orelse
            self.report(guard.test, target=parent, replacement=branch.with_changes(lpar=parent.lpar, rpar=parent.rpar))
        else:
            self.report(guard.test, target=guard.condition, replacement=folded)


def _is_elif(analysis: DeviceAnalysis, node: cst.If) -> bool:
    return isinstance(analysis.parent(node), cst.If)


def _ends_in_return(block: cst.BaseSuite) -> bool:
    last = block.body[-1] if isinstance(block, cst.IndentedBlock) and block.body else None
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Return)


def _after(analysis: DeviceAnalysis, node: cst.If) -> list[cst.BaseStatement]:
    """The statements after `node` in its function's block (none at module level: no return there)."""
    block = analysis.parent(node)
    if not (isinstance(block, cst.IndentedBlock) and isinstance(analysis.parent(block), cst.FunctionDef)):
        return []
    body = list(block.body)
    index = next(i for i, statement in enumerate(body) if statement is node)
    return body[index + 1 :]


def _taken_branch(node: cst.If, truth: bool) -> cst.FlattenSentinel | cst.RemovalSentinel:
    """The statements that run when the test of `node` is `truth`, in place of the whole `if`."""
    block = node.body if truth else (node.orelse.body if isinstance(node.orelse, cst.Else) else None)
    if block is None:
        return REMOVE
    body = list(block.body) if isinstance(block, cst.IndentedBlock) else [cst.SimpleStatementLine(list(block.body))]
    if body:
        first = body[0]
        body[0] = first.with_changes(leading_lines=[*node.leading_lines, *getattr(first, "leading_lines", ())])
    return cst.FlattenSentinel(body)


def _fold(node: cst.BaseExpression, test: cst.CSTNode) -> cst.BaseExpression:
    """`node` with `test` replaced by True, and `and` / `not` around it simplified."""
    true, false = cst.Name("True"), cst.Name("False")

    def const(n: cst.BaseExpression) -> str | None:
        return n.value if isinstance(n, cst.Name) and n.value in ("True", "False") and not n.lpar else None

    def walk(n: cst.BaseExpression) -> cst.BaseExpression:
        if n is test:
            return true
        if isinstance(n, cst.BooleanOperation) and isinstance(n.operator, (cst.And, cst.Or)):
            left, right = walk(n.left), walk(n.right)
            neutral = "True" if isinstance(n.operator, cst.And) else "False"  # `x and True` / `x or False` is x
            if const(left) == neutral:
                return right.with_changes(lpar=n.lpar, rpar=n.rpar) if n.lpar else right
            if const(right) == neutral:
                return left.with_changes(lpar=n.lpar, rpar=n.rpar) if n.lpar else left
            return n.with_changes(left=left, right=right)
        if isinstance(n, cst.UnaryOperation) and isinstance(n.operator, cst.Not):
            inner = walk(n.expression)
            if const(inner) is not None:
                return false if const(inner) == "True" else true
            return n.with_changes(expression=inner)
        if isinstance(n, cst.IfExp):  # `True if <test> else False`
            inner = walk(n.test)
            if const(inner) is not None:
                return n.body if const(inner) == "True" else n.orelse
            return n.with_changes(test=inner)
        return n

    return walk(node)


class TensorPinMemory(Rule):
    code = "XLA231"
    needs = ("pin_memory",)
    title = "`tensor.pin_memory()` needs a CUDA driver"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`.pin_memory()` called on a tensor (page-locked staging for an asynchronous copy to a GPU)."
    why = (
        "Pinning asks the CUDA driver for page-locked memory: on a TPU host it raises `Found no NVIDIA driver on "
        "your system`. The copy to the XLA device does not need it; dropping the call keeps the values."
    )
    before = "x = batch.pin_memory().to(device, non_blocking=True)\n"
    after = "x = batch.to(device, non_blocking=True)\n"
    message = "`.pin_memory()` needs a CUDA driver; the copy to the XLA device does not need it"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    valid = ("from torch.utils.data import DataLoader\nloader = DataLoader(ds, pin_memory=False)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "pin_memory") or node.args:
            return
        if self.qualified_names(func):  # a module function, not the tensor method
            return
        self.report(node, replacement=func.value)


# store_true switches: the accelerator only when asked for
CUDA_FLAG = ("cuda", "use_cuda", "gpu", "use_gpu", "accel", "use_accel")
CPU_DEVICES = ("cpu", "mps")  # defaults that run on the host when the flag is not given


class CommandLineCpuDevice(Rule):
    code = "XLA233"
    title = "The device is picked on the command line, and the default is the CPU"
    category = "C2"
    fix = "manual"
    autofix = False
    detects = (
        "An argparse flag that picks the device and defaults to the CPU while the program is meant for CUDA: "
        "`--device` with a default such as `'cpu'` and CUDA named in its help or choices, or a `--cuda` / `--accel` / "
        "`--use-gpu` switch (`store_true`, off unless given)."
    )
    why = (
        "The GPU run passed `--device cuda` (or `--cuda`); the migrated program, run the same way, asks for a CUDA "
        "device a TPU host does not have, and run without it, trains on the CPU with exit code 0. Nothing in the "
        "code is wrong, so nothing is rewritten: the run needs `--device xla` (or the switch), and the report "
        "says so (`xlaport verify --migrated-arg` gives it to the migrated run alone)."
    )
    before = "parser.add_argument('--device', default='cpu', help='cpu|cuda')\n"
    after = "parser.add_argument('--device', default='cpu', help='cpu|cuda')  # run with --device xla\n"
    message = "the device comes from the command line and defaults to the CPU: run the migrated program with `{how}`"
    needs = ("add_argument",)
    symptoms = ("params off the XLA device", "ran on the CPU, not on the XLA device")
    valid = (
        "parser.add_argument('--device', default='cuda')\n",
        "parser.add_argument('--device', default='cpu', help='where the eval runs')\n",
        "parser.add_argument('--no-cuda', action='store_true')\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) != "add_argument":
            return
        dest = argparse_dest(node) or ""
        default = getattr(keyword_arg(node, "default"), "value", None)
        if _keyword_string(node, "action") == "store_true" and dest.lower() in CUDA_FLAG:
            if default is None or code_of(default) != "True":
                self.report(node, self.message.format(how=_long_flag(node, dest)))
            return
        if not DEVICE_NAME.match(dest) or string_value(default) not in CPU_DEVICES:
            return
        choices = getattr(keyword_arg(node, "choices"), "value", None)
        named = [e.value for e in getattr(choices, "elements", ())]
        if "cuda" in (_keyword_string(node, "help") or "").lower() or any(
            is_cuda_string(v) or string_value(v) == "xla" for v in named
        ):
            self.report(node, self.message.format(how=f"{_long_flag(node, dest)} xla"))


def _keyword_string(call: cst.Call, keyword: str) -> str | None:
    return string_value(getattr(keyword_arg(call, keyword), "value", None))


def _long_flag(call: cst.Call, dest: str) -> str:
    """`--device` of `add_argument('-d', '--device', ...)`."""
    flags = [string_value(a.value) or "" for a in call.args if a.keyword is None]
    return next((f for f in flags if f.startswith("--")), "--" + dest.replace("_", "-"))
