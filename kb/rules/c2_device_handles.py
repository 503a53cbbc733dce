"""C2 — the CUDA device by name: `.cuda()`, `"cuda"` strings, `is_available()` fallbacks, CUDA type checks, device counting and selection."""

from __future__ import annotations

import libcst as cst

from ..analysis.device_facts import is_cuda_value
from ..analysis.devices import analyse as analyse_devices
from ..analysis.guards import after_cuda_early_return, guarded_by_cuda, is_cuda_early_return, needs_gpu_guard
from ..analysis.launch import world_size_move
from ..analysis.sparse import is_sparse
from ..cst_helpers import (
    code_of,
    expr,
    find_nodes,
    identifier,
    is_cuda_string,
    keyword_arg,
    positional_args,
    same_quotes,
    string_value,
    with_commas,
)
from ..rule import IMPORT_TORCH_XLA, IMPORT_XR, REMOVE, XLA_DEVICE, Rule
from ..scoped_rule import ScopedRule
from .c2_tensor_types import is_rewritten_use


class CudaMethod(ScopedRule):
    code = "XLA201"
    needs = ("cuda",)
    title = "`.cuda()` moves to a GPU that a TPU host does not have"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "Calls of the `.cuda()` method on tensors and modules, with or without a device index. A sparse tensor's "
        "`.cuda()` is left to XLA520: XLA has no sparse kernels, so moving it as it is would fail."
    )
    why = (
        "A TPU VM has no NVIDIA driver: with the CUDA build of torch, `.cuda()` raises "
        "`RuntimeError: Found no NVIDIA driver on your system`. On XLA the device is `torch_xla.device()`."
    )
    before = "x = x.cuda()\nmodel.cuda(0)\n"
    after = "import torch_xla\n\nx = x.to(torch_xla.device())\nmodel.to(torch_xla.device())\n"
    # the CUDA build of torch, and the CPU build (TPU images often install it)
    symptoms = (
        "RuntimeError: Found no NVIDIA driver on your system",
        "AssertionError: Torch not compiled with CUDA enabled",
    )
    references = ("pytorch/xla docs: migration-to-xla-on-tpus.md",)
    message = "`.cuda()` targets a GPU; move to `torch_xla.device()`"
    valid = (
        "import torch\nx = torch.cuda.is_initialized\n",
        "cuda = make()\ncuda.to(dev)\n",
        "import torch\nadj = torch.sparse_coo_tensor(i, v, (3, 3))\nadj = adj.cuda()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "cuda"):
            return
        if "torch.cuda" in self.qualified_names(func):  # the module, not the method
            return
        if is_sparse(self, func.value):  # no SparseXLA kernels: XLA520 densifies it first
            return
        kept = [a for a in node.args if a.keyword is not None and a.keyword.value == "non_blocking"]
        args = [cst.Arg(expr(XLA_DEVICE)), *kept]
        replacement = node.with_changes(func=func.with_changes(attr=cst.Name("to")), args=with_commas(args))
        self.report(node, replacement=replacement, imports=(IMPORT_TORCH_XLA,))


class CudaDeviceString(Rule):
    code = "XLA202"
    needs = ("cuda",)
    title = 'Device given as the string `"cuda"`'
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        '`torch.device("cuda")`, `torch.device("cuda", 0)`, `.to("cuda:0")` and `device="cuda"` keyword '
        "arguments of tensor factories and `.to()`."
    )
    why = (
        "There is no CUDA device on a TPU host: allocation fails with `Found no NVIDIA driver`, "
        "or, behind a fallback, the code silently runs on the CPU. torch's own calls get `torch_xla.device()`; "
        "a `device='cuda'` handed to the program's own functions (or another library's) becomes the string "
        "`'xla'`, because the callee may treat it as text (`'cuda' in device`, `device.split(':')`), which a "
        "`torch.device` object breaks (`TypeError: argument of type 'torch.device' is not iterable`, measured)."
    )
    before = "import torch\n\nd = torch.device('cuda:0')\ny = x.to('cuda')\nz = torch.zeros(3, device='cuda')\n"
    after = (
        "import torch\nimport torch_xla\n\nd = torch_xla.device()\ny = x.to(torch_xla.device())\n"
        "z = torch.zeros(3, device=torch_xla.device())\n"
    )
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("pytorch/xla docs: migration-to-xla-on-tpus.md",)
    message = "CUDA device string; use `torch_xla.device()`"
    valid = ("print('cuda')\n", "# runs on cuda\nx = 1\n", "name = 'cuda'\n")

    def visit_Call(self, node: cst.Call) -> None:
        if not any(is_cuda_string(arg.value) for arg in node.args):
            return  # each report below is of a CUDA string among the call's arguments
        if after_cuda_early_return(self, node):
            return  # the function returned already on hosts without CUDA
        if self.is_call_to(node, "torch.device"):
            args = positional_args(node)
            type_arg = args[0].value if args else getattr(keyword_arg(node, "type"), "value", None)
            if is_cuda_string(type_arg):
                self.report(node, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))
            return
        device_kw = keyword_arg(node, "device")
        if device_kw is not None and is_cuda_string(device_kw.value):
            if self._takes_device_object(node):
                self.report(device_kw.value, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))
            else:  # the callee may treat it as text (`'cuda' in device`, `device.split(':')`): keep a string
                value = device_kw.value
                assert isinstance(value, cst.SimpleString)
                self.report(value, replacement=same_quotes(value, "xla"), imports=(IMPORT_TORCH_XLA,))
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "to":
            args = positional_args(node)
            if args and is_cuda_string(args[0].value):
                self.report(args[0].value, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))

    def _takes_device_object(self, call: cst.Call) -> bool:
        """torch's own calls (`torch.zeros`, `.to`, `.new_zeros`, modules' constructors) take a device object as well
        as a string; a call of the program's own code or of another library may read the value as a string."""
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in TENSOR_METHODS_WITH_DEVICE:
            return True
        return any(n == "torch" or n.startswith(("torch.", "torch_xla.")) for n in self.qualified_names(func))


# Tensor methods whose `device=` is torch's (a torch.device or a string both work).
TENSOR_METHODS_WITH_DEVICE = frozenset({"to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor"})


ASSERT_MESSAGE = (
    "`assert torch.cuda.is_available()` fails on TPU: the program asks for an accelerator, and the XLA device is "
    "one; the assert goes"
)
STOP_MESSAGE = (
    "`if ... not torch.cuda.is_available(): raise/exit` stops the program on TPU: it asks for an accelerator, and "
    "the XLA device is one; the stop goes"
)


class CudaIsAvailableFallback(Rule):
    code = "XLA203"
    needs = ("cuda",)
    title = "`torch.cuda.is_available()` fallback trains on the CPU"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.cuda.is_available()` used to pick a device (`'cuda' if torch.cuda.is_available() else 'cpu'`, "
        "`torch.device(...)` around it) or in any other condition."
    )
    why = (
        "On a TPU host `torch.cuda.is_available()` is False, so the fallback picks the CPU and the whole "
        "run trains on the host CPU, slowly, with exit code 0 — a silent failure. A string stays a string "
        "(`'cuda' if ... else 'cpu'` becomes `'xla'`, so `'xla' in device` still works); a `torch.device(...)` "
        'becomes `torch_xla.device()`. `assert torch.cuda.is_available()` ("needs a GPU") is removed, and so is '
        "`if args.cuda and not torch.cuda.is_available(): raise ...` (a stop whose body only raises or exits): "
        "the TPU is the accelerator they ask for. Guards whose protected code picks the device are XLA230's; guards around "
        "CUDA-only housekeeping are code a TPU never runs and are not reported."
    )
    before = "import torch\n\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
    after = "import torch_xla\n\ndevice = torch_xla.device()\n"
    references = ("xla_migration_facts C2: is_available() fallback",)
    message = "`torch.cuda.is_available()` is False on TPU: this picks the CPU silently"
    valid = ("import torch_xla\ndevice = torch_xla.device()\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.device"):
            args = positional_args(node)
            if args and self._is_fallback(args[0].value):
                if self._device_variable(args[0].value.body):  # the flag's value stays the user's choice
                    self.report(args[0].value, replacement=args[0].value.body)
                else:
                    self.report(node, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))
            return
        if self.is_call_to(node, "torch.cuda.is_available"):
            parent = self.parent(node)
            if isinstance(parent, cst.IfExp) and self._is_fallback(parent):
                return  # reported on the IfExp / torch.device call
            if isinstance(parent, cst.Assert) and parent.test is node:
                line = self.parent(parent)
                target = line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else parent
                self.report(node, ASSERT_MESSAGE, replacement=REMOVE, target=target)
                return
            stop = needs_gpu_guard(self, node)
            if stop is not None:
                self.report(node, STOP_MESSAGE, replacement=REMOVE, target=stop)
                return
            guards = analyse_devices(self.analysis.module).facts.guards
            if any(g.test is node and (g.flips or g.quiet) for g in guards):
                return  # a guard around the device choice (XLA230 rewrites it) or around CUDA-only housekeeping
            if self._early_return(node) or self._unread_flag(node):
                return
            self.report(
                node,
                "`torch.cuda.is_available()` is False on TPU; branch on the XLA device instead "
                "(e.g. `torch_xla.device()`), or the CPU branch runs silently",
            )

    def visit_IfExp(self, node: cst.IfExp) -> None:
        if not self._is_fallback(node):
            return
        parent = self.parent(self.parent(node))  # IfExp -> Arg -> Call
        if isinstance(parent, cst.Call) and self.is_call_to(parent, "torch.device"):
            return
        if isinstance(node.body, cst.SimpleString):  # one representation: strings stay strings
            self.report(node, replacement=same_quotes(node.body, "xla"), imports=(IMPORT_TORCH_XLA,))
        elif is_cuda_value(node.body):  # f'cuda:{rank}', 'cuda:%d' % gpu: one chip per process, the string 'xla'
            self.report(node, replacement=cst.SimpleString('"xla"'), imports=(IMPORT_TORCH_XLA,))
        elif self._device_variable(node.body):  # `args.device if ... else 'cpu'`: the flag's value, made 'xla'
            self.report(node, replacement=node.body.with_changes(lpar=node.lpar, rpar=node.rpar))
        else:
            self.report(node, replacement=expr(XLA_DEVICE), imports=(IMPORT_TORCH_XLA,))

    def _early_return(self, node: cst.Call) -> bool:
        """The test of `if not torch.cuda.is_available(): return` (it skips CUDA-only setup, no CPU path)."""
        return any(isinstance(a, cst.If) and is_cuda_early_return(self, a) for a in self.ancestors(node))

    def _unread_flag(self, node: cst.Call) -> bool:
        """`self.use_cuda = torch.cuda.is_available()` with the flag never read in the module (nor star-imported by
        another module of the tree)."""
        assign = self.parent(node)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
            return False
        name = identifier(assign.targets[0].target)
        project = self.analysis.project
        if project is not None and (self.analysis.module_name, name) in project.exports:
            return False  # `CUDA = ...` in parameters.py, read by every module that does `from parameters import *`
        uses = [
            n
            for n in self.analysis.nodes.names
            if identifier(n) == name and not (isinstance(n, cst.Name) and isinstance(self.parent(n), cst.Attribute))
        ]
        return name is not None and len(uses) == 1  # the assignment itself

    def _is_fallback(self, node: cst.CSTNode) -> bool:
        return (
            isinstance(node, cst.IfExp)
            and self.is_call_to(node.test, "torch.cuda.is_available")
            and (
                is_cuda_value(node.body)
                or self.is_call_to(node.body, "torch.device")
                or self._device_variable(node.body)
            )
        )

    def _device_variable(self, node: cst.CSTNode) -> bool:
        return analyse_devices(self.analysis.module).is_device_variable(node)


# --- device counting and selection -----------------------------------------------------
LAUNCHERS = frozenset(
    {
        "torch.multiprocessing.spawn",
        "torch_xla.launch",
        "torch_xla.torch_xla.launch",
        "torch_xla.distributed.xla_multiprocessing.spawn",
    }
)


COUNTS = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})


class CudaDeviceCount(Rule):
    code = "XLA211"
    needs = ("device_count",)
    title = "`torch.cuda.device_count()` is 0 on TPU"
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = "Calls of `torch.cuda.device_count()` and `torch.accelerator.device_count()`."
    why = (
        "Both return 0 on an XLA host, so world sizes, per-device batch sizes and `if n > 1:` branches silently "
        "take the wrong value (or divide by zero). `torch_xla.device_count()` counts the XLA devices this process "
        "can address. Unsafe: the numbers differ where a GPU host and a TPU host differ, and that call starts "
        "the XLA runtime, and a runtime started in the parent makes `torch_xla.launch` fail (`RuntimeError: "
        "Runtime is already initialized. Do not use the XLA device before calling xmp.spawn.`; `xr.world_size()` "
        "in the parent does the same, measured). In a file that launches processes, a count assigned to a name "
        "that is only handed to the launched function through `torch_xla.launch(fn, args=(n, ...))` is moved "
        "into that function: the parent's count and the argument go, and `fn` starts with `n = xr.world_size()` "
        "(safe: the number of processes the launch started, what the GPU count was). Other uses are reported."
    )
    before = "import torch\n\nn_gpus = torch.cuda.device_count()\n"
    after = "import torch_xla\n\nn_gpus = torch_xla.device_count()\n"
    message = "`torch.cuda.device_count()` is 0 on TPU; use `torch_xla.device_count()`"
    symptoms = (
        "ZeroDivisionError: division by zero",
        "Runtime is already initialized. Do not use the XLA device before calling xmp.spawn.",
    )
    references = ("torch_xla/torch_xla.py device_count", "torch_xla/runtime.py world_size")
    valid = ("import torch_xla\nn = torch_xla.device_count()\n",)

    def __init__(self) -> None:
        super().__init__()
        self.counts: list[cst.Call] = []
        self.launches = False

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if names & COUNTS and not self._multi_gpu_test(node):
            self.counts.append(node)
        elif names & LAUNCHERS:
            self.launches = True

    def _multi_gpu_test(self, call: cst.Call) -> bool:
        """`device_count() > 1` (or `>= 2`): it only chooses DataParallel, and 0 takes the single-device path."""
        comp = self.parent(call)
        if not (isinstance(comp, cst.Comparison) and comp.left is call and len(comp.comparisons) == 1):
            return False
        target = comp.comparisons[0]
        bound = target.comparator
        if not isinstance(bound, cst.Integer):
            return False
        return (isinstance(target.operator, cst.GreaterThan) and bound.value == "1") or (
            isinstance(target.operator, cst.GreaterThanEqual) and bound.value == "2"
        )

    def leave_Module(self, original_node: cst.Module) -> None:
        for call in self.counts:
            what = f"`{code_of(call.func)}()`"
            if not self.launches:
                self.report(
                    call,
                    f"{what} is 0 on TPU; use `torch_xla.device_count()`",
                    replacement=expr("torch_xla.device_count()"),
                    imports=(IMPORT_TORCH_XLA,),
                )
                continue
            move = world_size_move(self, call)
            if move is None:
                self.report(
                    call,
                    f"{what} is 0 on TPU, and counting XLA devices before `torch_xla.launch` "
                    "breaks the launch: let the runtime pick one process per chip and read `xr.world_size()` "
                    "inside the launched function",
                )
                continue
            # one edit each, applied together (the engine keeps a rule's edits of one pass together)
            said = f"{what} is 0 on TPU and nothing can count the processes before the launch"
            self.report(
                call, f"{said}: `{move.function}` reads `xr.world_size()`", REMOVE, target=move.assignment, fix="safe"
            )
            self.report(move.args, f"{said}: the world size is no longer passed", move.new_args, fix="safe")
            self.report(move.params, f"{said}: `{move.function}` reads it", move.new_params, fix="safe")
            self.report(
                move.first, f"{said}: read it from the runtime", move.new_first, imports=(IMPORT_XR,), fix="safe"
            )


class CudaSetDevice(Rule):
    code = "XLA212"
    needs = ("cuda",)
    title = "`torch.cuda.set_device()` is not needed on TPU"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`torch.cuda.set_device(local_rank)` statements (per-rank GPU selection)."
    why = (
        "Without a GPU it raises `RuntimeError: Found no NVIDIA driver on your system`. Under `torch_xla.launch` "
        "each process already owns its chip and sees it as `torch_xla.device()` (`xla:0`): the call has no "
        "XLA counterpart and is deleted."
    )
    before = "import torch\n\ntorch.cuda.set_device(local_rank)\nmodel = build()\n"
    after = "\nmodel = build()\n"
    message = "`torch.cuda.set_device` raises on TPU; each process already sees its chip as `torch_xla.device()`"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("docs/source/learn/pytorch-on-xla-devices.md (launch)",)
    valid = ("import torch_xla\ndevice = torch_xla.device()\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.cuda.set_device"):
            return
        self.report_removal(node)


class CudaCurrentDevice(Rule):
    code = "XLA213"
    needs = ("cuda",)
    title = "`torch.cuda.current_device()` / `torch.cuda.device(i)` select a GPU index"
    category = "C2"
    fix = "safe"  # `with torch.cuda.device(i):` blocks; the other uses are manual
    detects = "Calls of `torch.cuda.current_device()` and `torch.cuda.device(i)` (often as a context manager)."
    why = (
        "Both initialise CUDA: on a TPU host they raise `RuntimeError: Found no NVIDIA driver on your system`. "
        "There is no 'current device' to switch on XLA: each launched process has one chip, `torch_xla.device()`. "
        "Use `xr.local_ordinal()` / `xr.global_ordinal()` where the code wanted the process' index, and drop "
        "`with torch.cuda.device(i):` blocks (keep their body)."
    )
    before = "import torch\n\n\ndef fit(args):\n    with torch.cuda.device(args.gpu):\n        torch.save(train(args), args.out)\n"
    after = "import torch\n\n\ndef fit(args):\n    torch.save(train(args), args.out)\n"
    autofix = True
    message = "`torch.cuda.current_device()` raises on TPU; use `torch_xla.device()` / `xr.local_ordinal()`"
    symptoms = ("RuntimeError: Found no NVIDIA driver on your system",)
    references = ("torch_xla/runtime.py local_ordinal",)
    valid = ("import torch_xla.runtime as xr\nrank = xr.local_ordinal()\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.is_call_to(node, "torch.cuda.current_device"):
            self.report(node, fix="manual")
        elif self.is_call_to(node, "torch.cuda.device"):
            self._report_device_context(node)

    def _report_device_context(self, node: cst.Call) -> None:
        """`with torch.cuda.device(i):` only selects the GPU its body runs on (no value, no numbers change): its
        body runs as it is, safely. Without CUDA the context is a no-op only for a negative index, which a
        device flip no longer reaches (`gpu_index = -1` stays in the CPU branch). Other uses stay manual."""
        message = "`torch.cuda.device(i)` raises on TPU; drop it (each process sees its chip as `torch_xla.device()`)"
        item = self.parent(node)
        statement = self.parent(item) if isinstance(item, cst.WithItem) and item.asname is None else None
        if not isinstance(statement, cst.With) or statement.asynchronous is not None:
            self.report(node, message, fix="manual")
            return
        if len(statement.items) > 1:
            items = [i for i in statement.items if i is not item]
            items[-1] = items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            replacement = statement.with_changes(
                items=items, lpar=cst.MaybeSentinel.DEFAULT, rpar=cst.MaybeSentinel.DEFAULT
            )
            self.report(node, message, replacement=replacement, target=statement, fix="safe")
            return
        body = list(statement.body.body) if isinstance(statement.body, cst.IndentedBlock) else None
        if not body:  # `with torch.cuda.device(i): run()` on one line
            body = [cst.SimpleStatementLine(list(statement.body.body))]
        first = body[0]
        body[0] = first.with_changes(leading_lines=[*statement.leading_lines, *getattr(first, "leading_lines", ())])
        self.report(node, message, replacement=cst.FlattenSentinel(body), target=statement, fix="safe")


# --- device-type branches ---------------------------------------------------------------
def _is_cudaish(rule: Rule, node: cst.CSTNode) -> bool:
    if is_cuda_string(node) or (string_value(node) or "").startswith("torch.cuda."):
        return True
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        return any(_is_cudaish(rule, e.value) for e in node.elements)
    return False


def _is_type_probe(node: cst.CSTNode) -> bool:
    """`x.device.type` or `x.type()`."""
    if isinstance(node, cst.Attribute):
        return node.attr.value == "type"
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "type"
        and not node.args
    )


class CudaTypeCheck(Rule):
    code = "XLA220"
    needs = ("cuda",)
    title = "Device-type checks for CUDA are False for XLA tensors"
    category = "C2"
    fix = "manual"
    detects = (
        '`t.is_cuda`, `t.device.type == "cuda"` (also `in ("cuda", ...)`), `t.type() == "torch.cuda.FloatTensor"` '
        "and `torch.cuda.*Tensor` types."
    )
    why = (
        "An XLA tensor has `is_cuda == False`, `device.type == 'xla'` and `type() == 'torch.xla.FloatTensor'`: "
        "every GPU branch silently takes its CPU/else path on TPU (slow host code, skipped AMP, wrong batch "
        "size). Test for XLA instead (`t.device.type == 'xla'`, `xm.is_xla_tensor(t)`), or drop the branch; "
        "use `.to()`/`.type_as()` rather than `.type(...)` conversions."
    )
    before = "def step(x):\n    if x.is_cuda:\n        return fast(x)\n    return slow(x)\n"
    message = "CUDA device-type check is False for XLA tensors: this takes the non-GPU branch on TPU"
    # a branch that allocates on the CPU meets the XLA tensors (torch_xla 2.9: `Expected XLA tensor. Got: ...`)
    symptoms = (
        "is_cuda=False on XLA tensor",
        "type()=='torch.xla.FloatTensor'",
        "RuntimeError: Expected XLA tensor. Got: torch.FloatTensor",
        "Expected all tensors to be on the same device",
    )
    references = ("lucidrains/reformer-pytorch #105",)
    valid = (
        "def f(x):\n    return x.device.type == 'xla'\n",
        "import torch\nwith torch.autocast(device_type='cuda'):\n    pass\n",
        "kind = cfg.type == 'cuda_like'\n",
    )

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "is_cuda" and not self.qualified_names(node):
            if self._and_multi_gpu(node):
                return  # `x.is_cuda and ngpu > 1` only picks data_parallel; False takes the plain forward
            if self._picks_cuda_only_value(node):
                return  # `self.cuda_config if x.is_cuda else self.cpu_config`: the GPU value is None without CUDA
            self.report(
                node, "`.is_cuda` is False for XLA tensors; use `t.device.type == 'xla'` or `xm.is_xla_tensor(t)`"
            )
            return
        for name in self.qualified_names(node):
            if (
                name.startswith("torch.cuda.")
                and name.endswith("Tensor")
                and not isinstance(self.parent(node), cst.Attribute)
                and not is_rewritten_use(self, node)  # XLA232 rewrites constructors and conversions
            ):
                self.report(
                    node,
                    f"`{name}` is a CUDA tensor type; XLA tensors are `torch.xla.*Tensor`: use dtype/device checks",
                )
                return

    def _picks_cuda_only_value(self, node: cst.Attribute) -> bool:
        """Is `node` (directly, or through the name it is unpacked into) the test of `a if t.is_cuda else b`
        where `a` is an attribute the class sets to something other than None only on CUDA hosts (after
        `if not torch.cuda.is_available(): return`, or under a CUDA guard)? A TPU host gets `b` either way."""
        tests: list[cst.CSTNode] = [node]
        target = self._unpacked_into(node)
        if target is not None:
            func = next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)
            if func is not None:
                tests += [n for n in find_nodes(func, cst.Name) if n.value == target and n is not node]
        choices = [p for t in tests if isinstance(p := self.parent(t), cst.IfExp) and p.test is t]
        return bool(choices) and all(self._cuda_only_attribute(c.body) for c in choices)

    def _unpacked_into(self, node: cst.CSTNode) -> str | None:
        """`a, is_cuda, d = *s, q.is_cuda, q.device` -> "is_cuda" (matched from the end past a starred value)."""
        element = self.parent(node)
        values = self.parent(element)
        assign = self.parent(values)
        if not (isinstance(element, cst.Element) and isinstance(values, cst.Tuple) and isinstance(assign, cst.Assign)):
            return None
        targets = assign.targets[0].target if len(assign.targets) == 1 else None
        if not isinstance(targets, cst.Tuple):
            return None
        from_end = len(values.elements) - values.elements.index(element)
        if from_end > len(targets.elements) or any(isinstance(e, cst.StarredElement) for e in targets.elements):
            return None
        name = targets.elements[-from_end].value
        return name.value if isinstance(name, cst.Name) else None

    def _cuda_only_attribute(self, value: cst.CSTNode) -> bool:
        if not (isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.value.value == "self"):
            return False
        cls = next((a for a in self.ancestors(value) if isinstance(a, cst.ClassDef)), None)
        if cls is None:
            return False
        methods = [m for m in cls.body.body if isinstance(m, cst.FunctionDef)]
        sets = [
            a
            for m in methods
            for a in find_nodes(m, cst.Assign)
            if len(a.targets) == 1 and code_of(a.targets[0].target) == code_of(value)
        ]
        real = [a for a in sets if not (isinstance(a.value, cst.Name) and a.value.value == "None")]
        return bool(real) and all(guarded_by_cuda(self, a) for a in real)

    def _and_multi_gpu(self, node: cst.CSTNode) -> bool:
        """Is `node` part of a test and-ed with `n > 1` (a multi-GPU count)?"""
        for anc in self.ancestors(node):
            if isinstance(anc, cst.BooleanOperation) and isinstance(anc.operator, cst.And):
                for side in (anc.left, anc.right):
                    if (
                        isinstance(side, cst.Comparison)
                        and len(side.comparisons) == 1
                        and isinstance(side.comparisons[0].operator, cst.GreaterThan)
                        and isinstance(side.comparisons[0].comparator, cst.Integer)
                        and side.comparisons[0].comparator.value == "1"
                    ):
                        return True
            elif not isinstance(anc, (cst.BooleanOperation, cst.UnaryOperation)):
                return False
        return False

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(c.comparator for c in node.comparisons)]
        if any(_is_type_probe(o) for o in operands) and any(_is_cudaish(self, o) for o in operands):
            if self._flipped_guard(node):
                return  # a guard around the device choice: XLA230 rewrites this test to hold on XLA
            self.report(node)

    def _flipped_guard(self, node: cst.Comparison) -> bool:
        guards = analyse_devices(self.analysis.module).facts.guards
        return any(
            g.flips and any(o is g.test for o in (node.left, *(c.comparator for c in node.comparisons))) for g in guards
        )
