"""C3 — stale parameters across functions: the optimizer is built in one function, the model is moved to the
device in another (`Trainer.__init__` does `self.model = model.to(rank)` with an optimizer built by the
caller). XLA215 handles the layout where both sit in one block."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from ..analysis.devices import analyse, is_cuda_value
from ..analysis.optimizers import is_optimizer, moved_module, parameter_owners, related
from ..cst_helpers import (
    block_of,
    bound_names,
    code_of,
    dotted,
    find_nodes,
    keyword_arg,
    positional_args,
    statements,
    string_value,
    used_names,
)
from ..cst_walk import walk
from ..rule import IMPORT_TORCH_XLA, XLA_DEVICE, Rule

OPTIMIZER_PARAM = re.compile(r"((\w+_)?(optimizer|optim|opt)|optimizers)$")


@dataclass
class Mover:
    """A function (or a class, through its `__init__`) that moves one of its parameters to the device."""

    name: str  # what callers call: the function's or the class's name
    function: cst.FunctionDef
    param: str
    index: int | None  # position among the call's arguments (None: keyword-only)
    move: cst.Call
    certain: bool  # the move is a plain statement of the body and its target becomes the XLA device
    takes_optimizer: bool


@dataclass
class Site:
    """Where a caller's optimizer takes the parameters of a model that a mover later moves."""

    optimizer: cst.Call
    owner: str  # the model's name where the optimizer is built
    blocker: str | None  # why it is not rewritten
    block: cst.IndentedBlock | cst.Module  # the move goes into this block,
    anchor: cst.BaseStatement  # right above this statement of it, which builds the optimizer (maybe in a branch)


class OptimizerBeforeCalleeMove(Rule):
    code = "XLA315"
    title = "Optimizer built before a called function moves the model trains nothing"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = (
        "A function or class `__init__` that moves a parameter to the device (`self.model = model.to(rank)`), "
        "called with a model whose optimizer the caller built earlier: in the same block, or in a helper that "
        "returns both (`model, opt = build()`). Where the caller cannot be followed and the function also takes "
        "an optimizer, the move itself is reported."
    )
    why = (
        "Moving a CPU module to XLA creates new Parameter objects (measured on torch_xla 2.9: `model.to('xla')` "
        "replaces every parameter; CUDA keeps them). An optimizer built before the move keeps the CPU copies: "
        "`step()` updates tensors the model no longer uses, the loss stays flat, exit code 0. The fix moves the "
        "model to `torch_xla.device()` right before the optimizer is built; the later move in the callee is then "
        "a no-op that keeps the same Parameter objects (measured). Safe: the optimizer holds the parameters that "
        "train, as on CUDA. Only rewritten when the callee's move is a plain statement to what becomes the XLA "
        "device and nothing between the optimizer and the move uses the model; otherwise reported."
    )
    before = (
        "import torch\n\n\nclass Trainer:\n    def __init__(self, model, optimizer, rank: int):\n"
        "        self.model = model.to(rank)\n        self.optimizer = optimizer\n\n\n"
        "def build():\n    model = Net()\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    return model, optimizer\n\n\n"
        "def main(rank):\n    model, optimizer = build()\n    Trainer(model, optimizer, rank)\n"
    )
    after = (
        "import torch\nimport torch_xla\n\n\nclass Trainer:\n    def __init__(self, model, optimizer, rank: int):\n"
        "        self.model = model.to(rank)\n        self.optimizer = optimizer\n\n\n"
        "def build():\n    model = Net()\n    model.to(torch_xla.device())\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    return model, optimizer\n\n\n"
        "def main(rank):\n    model, optimizer = build()\n    Trainer(model, optimizer, rank)\n"
    )
    message = "optimizer built before a called function moves the model to the device: it updates stale CPU parameters"
    symptoms = ("loss does not decrease on TPU", "stale optimizer params")
    references = ("xla-device-facts: model.to('xla') replaces the Parameter objects", "pytorch/xla #3675")
    valid = (
        "import torch\nclass T:\n    def __init__(self, model, opt):\n        self.model = model.to('cuda')\n"
        "def main():\n    model = Net().to('cuda')\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    T(model, opt)\n",
        "import torch\nclass T:\n    def __init__(self, model, lr):\n        self.model = model.to('cuda')\n"
        "        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)\n"
        "def main():\n    T(Net(), 0.1)\n",
    )

    def visit_Module(self, node: cst.Module) -> None:
        self.module = node
        self.int_devices = {id(n) for n in analyse(node).facts.int_devices}

    def leave_Module(self, original_node: cst.Module) -> None:
        movers = self._movers()
        if not movers:
            return
        unresolved: dict[int, Mover] = {}
        for call in self.analysis.nodes.calls:
            mover = movers.get(dotted(call.func) or "")
            if mover is None:
                continue
            site = self._site(call, mover)
            if site is None:
                unresolved[id(mover)] = mover
            elif site is not False:
                self._report(site, mover)
        called = {dotted(c.func) for c in self.analysis.nodes.calls}
        for mover in movers.values():
            if mover.takes_optimizer and (id(mover) in unresolved or mover.name not in called):
                self.report(
                    mover.move,
                    f"`{mover.param}` moves to the device here, after the caller may have built the optimizer it "
                    "passes in from its parameters: on XLA that optimizer keeps stale CPU parameters. Move the "
                    "model before the optimizer is built, or build the optimizer after this move",
                    fix="manual",
                )

    # --- functions that move a parameter ------------------------------------------------------------
    def _movers(self) -> dict[str, Mover]:
        movers: dict[str, Mover] = {}
        # what the module moves anywhere: a function none of whose parameters is among it moves no parameter
        moved_anywhere = {moved_module(self, call) for call in self.analysis.nodes.calls} - {None}
        for function in self.analysis.nodes.functions:
            if not isinstance(function, cst.FunctionDef):
                continue
            name, offset = self._callable_name(function)
            if name is None:
                continue
            params = [p.name.value for p in function.params.params]
            keyword_only = [p.name.value for p in function.params.kwonly_params]
            if moved_anywhere.isdisjoint(params[offset:]) and moved_anywhere.isdisjoint(keyword_only):
                continue
            takes_optimizer = any(
                OPTIMIZER_PARAM.match(p.name.value)
                or (p.annotation is not None and "Optimizer" in code_of(p.annotation.annotation))
                for p in (*function.params.params, *function.params.kwonly_params)
            )
            body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
            for k, stmt in enumerate(body):
                for call in find_nodes(stmt, cst.Call, enter_root=False):
                    moved = moved_module(self, call)
                    if moved not in params[offset:] and moved not in keyword_only:
                        continue
                    if any(moved in bound_names(s) for s in body[:k]):
                        continue  # the parameter was replaced first: the caller's model is not the one moved
                    own = self.statement_of(call)
                    certain = (
                        isinstance(own, cst.SimpleStatementLine)
                        and self._runs_each_call(own, function)
                        and self._becomes_xla(call, function)
                    )
                    index = params.index(moved) - offset if moved in params else None
                    movers.setdefault(name, Mover(name, function, moved, index, call, certain, takes_optimizer))
        return movers

    def _callable_name(self, function: cst.FunctionDef) -> tuple[str | None, int]:
        """(`f`, 0) for a module-level function, (`Trainer`, 1) for `Trainer.__init__`, (None, 0) otherwise."""
        block = self.parent(function)
        owner = self.parent(block) if block is not None else None
        if isinstance(block, cst.Module):
            return function.name.value, 0
        if isinstance(owner, cst.ClassDef) and function.name.value == "__init__":
            return owner.name.value, 1
        return None, 0

    def _runs_each_call(self, stmt: cst.CSTNode, function: cst.FunctionDef) -> bool:
        """Does `stmt` run whenever `function` runs: in its body, or in loops and `with` blocks of it (a move in
        the training loop), never under an `if` or `try`?"""
        node = self.parent(stmt)
        while node is not None and node is not function:
            if not isinstance(node, (cst.IndentedBlock, cst.For, cst.While, cst.With)):
                return False
            node = self.parent(node)
        return node is function

    def _becomes_xla(self, move: cst.Call, function: cst.FunctionDef | None = None) -> bool:
        """Is the move's target the XLA device after migration (a CUDA device, an int rank, `torch_xla.device()`,
        `'xla'`)? A device in a variable may be anything the user configures, unless `function` assigns that
        variable once, from such a device (`device = torch_xla.device()`, what the migration writes for
        `torch.device("cuda:0" if torch.cuda.is_available() else "cpu")`)."""
        if move.func.attr.value == "cuda":
            return not move.args
        args = positional_args(move)
        target = args[0].value if args else keyword_arg(move, "device").value
        if isinstance(target, cst.Name) and function is not None:
            assigned = [
                a.value
                for a in find_nodes(function.body, cst.Assign)
                if any(isinstance(t.target, cst.Name) and t.target.value == target.value for t in a.targets)
            ]
            if len(assigned) == 1 and isinstance(assigned[0], cst.Call):
                return "torch_xla.device" in self.qualified_names(assigned[0].func)
        text = string_value(target)
        if text is not None:
            return text.split(":")[0] in ("cuda", "xla")
        if isinstance(target, cst.Integer) or id(target) in self.int_devices or is_cuda_value(target):
            return True
        if not isinstance(target, cst.Call):
            return False
        names = self.qualified_names(target.func)
        if "torch.device" in names and positional_args(target):
            return (string_value(positional_args(target)[0].value) or "").split(":")[0] in ("cuda", "xla")
        return "torch_xla.device" in names

    # --- where the caller built the optimizer ----------------------------------------------------------
    def _site(self, call: cst.Call, mover: Mover) -> Site | bool | None:
        """The optimizer site for this call; False when the model cannot be stale here; None when unknown."""
        argument = self._argument(call, mover)
        stmt = self.statement_of(call)
        block = block_of(self, stmt) if stmt is not None else None
        if argument is None or block is None:
            return None
        model = dotted(argument)
        if model is None:
            return False  # `Trainer(Net(), ...)`: built right there, no optimizer can hold it yet
        index = next(k for k, s in enumerate(block.body) if s is stmt)
        for k in range(index - 1, -1, -1):
            earlier = block.body[k]
            if self._moves(earlier, model):
                return False
            optimizers = self._optimizers_of(earlier, model)
            if optimizers:
                if self._on_device(block.body[:k], model):
                    return False
                between = block.body[k + 1 : index]
                return Site(optimizers[0], model, self._blocker(mover, model, between), block, earlier)
            if model in bound_names(earlier):
                return self._built_in_helper(earlier, model, mover, block.body[k + 1 : index])
        return None

    def _argument(self, call: cst.Call, mover: Mover) -> cst.BaseExpression | None:
        given = keyword_arg(call, mover.param)
        if given is not None:
            return given.value
        args = positional_args(call)
        if mover.index is None or any(a.star for a in call.args) or mover.index >= len(args):
            return None
        return args[mover.index].value

    def _built_in_helper(self, stmt: cst.CSTNode, model: str, mover: Mover, between) -> Site | bool | None:
        """`model, opt = build()`: the optimizer `build` makes from the model it returns."""
        if not (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)):
            return None
        assign = stmt.body[0]
        if len(assign.targets) != 1 or not isinstance(assign.value, cst.Call):
            return None
        target = assign.targets[0].target
        names = [dotted(e.value) for e in target.elements] if isinstance(target, cst.Tuple) else [dotted(target)]
        helper = self._function(dotted(assign.value.func))
        if model not in names:
            return None
        if helper is None:
            # `model = Net()`: made here, after no optimizer; `model, opt = elsewhere()`: not followed
            return None if len(names) > 1 else False
        returned = self._returned(helper, names.index(model) if len(names) > 1 else None)
        if returned is None:
            return None
        body = helper.body
        if not isinstance(body, cst.IndentedBlock):
            return None
        if self._on_device(body.body, returned):
            return False  # the helper moves it itself (before the optimizer, or XLA215 reports it)
        for anchor in body.body:
            optimizers = self._optimizers_of(anchor, returned)
            if optimizers:
                blocker = self._blocker(mover, model, between) or self._used_after(helper, optimizers[0], returned)
                return Site(optimizers[0], returned, blocker, body, anchor)
        return False

    def _function(self, name: str | None) -> cst.FunctionDef | None:
        for function in self.analysis.nodes.functions:
            if isinstance(function, cst.FunctionDef) and function.name.value == name:
                if isinstance(self.parent(function), cst.Module):
                    return function
        return None

    def _returned(self, helper: cst.FunctionDef, position: int | None) -> str | None:
        """The name `helper` returns (at `position` of its returned tuple), the same in every `return`."""
        found = set()
        for ret in find_nodes(helper.body, cst.Return):
            value = ret.value
            if position is None:
                found.add(dotted(value) if value is not None else None)
            elif isinstance(value, cst.Tuple) and position < len(value.elements):
                found.add(dotted(value.elements[position].value))
            else:
                return None
        return found.pop() if len(found) == 1 else None

    def _optimizers_of(self, root: cst.CSTNode, model: str) -> list[cst.Call]:
        return [
            c
            for c in find_nodes(root, cst.Call, enter_root=False)
            if is_optimizer(self, c) and any(related(o, model) for o in parameter_owners(c))
        ]

    def _moves(self, stmt: cst.CSTNode, model: str) -> bool:
        return any(moved_module(self, c) == model for c in find_nodes(stmt, cst.Call, enter_root=False))

    def _on_device(self, stmts, model: str) -> bool:
        """Do `stmts` move `model`, or make it on the device (`model = Net().to(device)`)?"""
        for stmt in stmts:
            if self._moves(stmt, model):
                return True
            for assign in find_nodes(stmt, cst.Assign, enter_root=False):
                value = assign.value
                made_on_device = (
                    isinstance(value, cst.Call)
                    and isinstance(value.func, cst.Attribute)
                    and value.func.attr.value in {"to", "cuda"}
                    and dotted(value.func.value) is None
                )
                if made_on_device and model in bound_names(assign):
                    return True
        return False

    def _blocker(self, mover: Mover, model: str, between) -> str | None:
        if not mover.certain:
            return f"the move in `{mover.name}` is not a plain statement to the XLA device"
        for stmt in between:
            if model in used_names(stmt) or model in bound_names(stmt):
                return f"`{model}` is used at line {self.position(stmt).start.line}, before the move"
        return None

    def _used_after(self, helper: cst.FunctionDef, optimizer: cst.Call, model: str) -> str | None:
        """A use of the model in `helper` after the optimizer, other than handing its parameters to an
        optimizer or returning it: it would see the model on the XLA device instead of the CPU."""
        start = self.position(optimizer).end
        allowed = {id(n) for r in find_nodes(helper.body, cst.Return) for n in find_nodes(r, cst.Name)}
        for call in find_nodes(helper.body, cst.Call):
            if is_optimizer(self, call):
                allowed |= {id(n) for n in find_nodes(call, cst.Name)}
        for name in find_nodes(helper.body, cst.Name):
            if name.value != model.split(".")[0] or id(name) in allowed:
                continue
            where = self.position(name).start
            if (where.line, where.column) > (start.line, start.column):
                return f"`{model}` is used at line {where.line} after the optimizer is built"
        return None

    # --- report ----------------------------------------------------------------------------------------
    def _report(self, site: Site, mover: Mover) -> None:
        line = self.position(mover.move).start.line
        message = f"optimizer built before the model moves to the device in `{mover.name}` (line {line}): it updates stale CPU parameters"
        stmt, block = site.anchor, site.block
        if site.blocker is not None:
            self.report(
                site.optimizer,
                f"{message}; move `{site.owner}` to `{XLA_DEVICE}` before building the optimizer "
                f"(not rewritten: {site.blocker})",
                fix="manual",
            )
            return
        (move,) = statements(f"{site.owner}.to({XLA_DEVICE})\n")
        # blank lines go above the new line, comments stay with the optimizer they describe
        lines = list(stmt.leading_lines)
        first_comment = next((k for k, line in enumerate(lines) if line.comment is not None), len(lines))
        move = move.with_changes(leading_lines=lines[:first_comment])
        body = list(block.body)
        at = next(k for k, s in enumerate(body) if s is stmt)
        body[at : at + 1] = [move, stmt.with_changes(leading_lines=lines[first_comment:])]
        self.report(
            site.optimizer,
            f"{message}; move `{site.owner}` to the device before building the optimizer",
            replacement=block.with_changes(body=body),
            target=block,
            imports=(IMPORT_TORCH_XLA,),
        )


# list(...) and tuple(...) of a module's parameters: a container of the Parameter objects of that moment
CAPTURING_CALLS = frozenset({"list", "tuple"})
PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})
MUTATING_METHODS = frozenset({"append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse"})


class CapturedParameterList(Rule):
    code = "XLA316"
    needs = ("parameters",)
    title = "A parameter list kept at construction goes stale when the model moves to the XLA device"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = (
        "`self.params1 = list(self.convs.parameters())` (also `tuple(...)`, `named_parameters()`, or a list "
        "comprehension over them) in a class's `__init__`: a container of the Parameter objects that exist when the "
        "model is built, typically handed to the optimizer as a parameter group (`Adam([{'params': "
        "model.params1, 'weight_decay': wd1}, ...])`) after `model.to(device)`."
    )
    why = (
        "Moving a CPU module to XLA creates new Parameter objects (CUDA swaps their data in place and keeps them). "
        "A list taken in `__init__` keeps the CPU ones, so an optimizer built from it after `model.to(device)` "
        "updates tensors the model no longer uses: the loss stays flat, exit code 0 (measured: GCNII's param "
        "groups, 8 of 8 and 4 of 4 parameters stale). The fix makes the attribute a property that lists the "
        "parameters when it is read: the same parameters, those the model has then. Only rewritten when nothing "
        "in the class assigns or mutates the attribute again and nothing later in `__init__` touches the module it "
        "lists; otherwise reported."
    )
    before = (
        "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.convs = nn.ModuleList([nn.Linear(4, 4)])\n        self.conv_params = list(self.convs.parameters())\n"
    )
    after = (
        "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.convs = nn.ModuleList([nn.Linear(4, 4)])\n\n    @property\n    def conv_params(self):\n"
        "        return list(self.convs.parameters())\n"
    )
    message = (
        "a list of the parameters taken at construction: after `model.to(device)` on XLA it holds stale CPU copies"
    )
    symptoms = ("loss does not decrease on TPU", "stale optimizer params")
    references = ("xla-device-facts: model.to('xla') replaces the Parameter objects",)
    valid = (
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.n_params = sum(p.numel() for p in self.parameters())\n",
        "import torch\nmodel = Net()\nparams = list(model.parameters())\n",
    )

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        init = next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if init is None or not isinstance(init.body, cst.IndentedBlock):
            return
        body = list(init.body.body)
        for i, stmt in enumerate(body):
            found = _captured_parameters(stmt)
            if found is None:
                continue
            name, value, source = found
            blocker = self._why_kept(node, body[i + 1 :], name, source)
            if blocker is not None:
                self.report(
                    stmt, f"{self.message}; read `{code_of(value)}` where the list is used ({blocker})", fix="manual"
                )
                continue
            self.report(
                stmt,
                f"{self.message}; `{name}` becomes a property that lists them when read",
                replacement=_as_property(node, init, stmt, name, value),
                target=node,
            )

    def _why_kept(self, cls: cst.ClassDef, later: list[cst.BaseStatement], name: str, source: str) -> str | None:
        """Why the attribute cannot become a property: assigned or changed again, or what it lists changes later
        in `__init__`."""
        attribute = f"self.{name}"
        assigned = [t for t in _assign_targets(cls) if dotted(t.target) == attribute]
        if len(assigned) != 1 or any(dotted(a.target) == attribute for a in _every(cls, cst.AugAssign)):
            return f"`{attribute}` is assigned again"
        if any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in cls.body.body):
            return f"`{name}` is also a method"
        for node in _every(cls, cst.Attribute):
            if dotted(node) != attribute:
                continue
            parent = self.parent(node)
            if isinstance(parent, cst.Attribute) and parent.attr.value in MUTATING_METHODS:
                return f"`{attribute}` is changed in place"
            if isinstance(parent, cst.Subscript) and isinstance(self.parent(parent), cst.AssignTarget):
                return f"`{attribute}` is changed in place"
        for stmt in later:
            mentioned = {dotted(n) for n in find_nodes(stmt, cst.Attribute, cst.Name)} - {None}
            if source != "self" and any(m == source or m.startswith(source + ".") for m in mentioned):
                return f"`{source}` changes later in `__init__`"
            if source == "self" and any(isinstance(t.target, cst.Attribute) for t in _assign_targets(stmt)):
                return "the module gains attributes later in `__init__`"
        return None


def _every(node: cst.CSTNode, kind: type) -> list:
    """Every node of `kind` under `node`, methods' bodies included (find_nodes stops at nested defs)."""
    return [n for n in walk(node) if type(n) is kind]


def _assign_targets(node: cst.CSTNode) -> list[cst.AssignTarget]:
    return [t for a in _every(node, cst.Assign) for t in a.targets]


def _captured_parameters(stmt: cst.BaseStatement) -> tuple[str, cst.BaseExpression, str] | None:
    """(attribute, value, the module it lists) for `self.NAME = list(SOURCE.parameters())` and its forms."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    if len(assign.targets) != 1:
        return None
    target = dotted(assign.targets[0].target)
    if target is None or not target.startswith("self.") or target.count(".") != 1:
        return None
    value = assign.value
    if isinstance(value, cst.Call) and dotted(value.func) in CAPTURING_CALLS and len(value.args) == 1:
        listed = value.args[0].value
    elif isinstance(value, cst.ListComp) and len(find_nodes(value, cst.CompFor)) == 1:
        listed = value.for_in.iter
    else:
        return None
    if not (isinstance(listed, cst.Call) and isinstance(listed.func, cst.Attribute)):
        return None
    if listed.func.attr.value not in PARAMETER_METHODS:
        return None
    source = dotted(listed.func.value)
    if source is None or not (source == "self" or source.startswith("self.")):
        return None
    return target.removeprefix("self."), value, source


def _as_property(
    cls: cst.ClassDef, init: cst.FunctionDef, stmt: cst.BaseStatement, name: str, value: cst.BaseExpression
) -> cst.ClassDef:
    """`cls` without the assignment in `__init__`, with `name` as a property right after `__init__`."""
    body = [s for s in init.body.body if s is not stmt]
    new_init = init.with_changes(body=init.body.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])]))
    prop = cst.parse_statement(f"@property\ndef {name}(self):\n    return {code_of(value)}\n")
    prop = prop.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    members = [new_init if member is init else member for member in cls.body.body]
    at = members.index(new_init) + 1
    while at < len(members) and _is_property(members[at]):  # after the properties made before, in their order
        at += 1
    return cls.with_changes(body=cls.body.with_changes(body=[*members[:at], prop, *members[at:]]))


def _is_property(member: cst.BaseStatement) -> bool:
    return isinstance(member, cst.FunctionDef) and any(dotted(d.decorator) == "property" for d in member.decorators)
