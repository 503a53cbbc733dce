"""C2 — moving data and models to the device: pinned memory, the optimizer built before the move, host work on device tensors in the training loop."""

from __future__ import annotations

import libcst as cst

from ..analysis.optimizers import DTYPE_NAMES, is_optimizer, moved_module, moved_modules, parameter_owners, related
from ..analysis.steps import step_loop, training_loop
from ..cst_helpers import (
    DATALOADERS,
    SCOPES,
    add_kwarg,
    bound_names,
    code_of,
    dotted,
    drop_args,
    expr,
    find_nodes,
    has_star_args,
    is_literal,
    keyword_arg,
    positional_args,
    string_value,
    used_names,
)
from ..rule import IMPORT_TORCH_XLA, XLA_DEVICE, Rule
from ..scoped_rule import ScopedRule


class PinMemory(Rule):
    code = "XLA214"
    needs = ("pin_memory",)
    title = "`DataLoader(pin_memory=True)` pins for a GPU that is not there"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = "`DataLoader(..., pin_memory=<anything but False>)` and `pin_memory_device=...`."
    why = (
        "Pinned host memory speeds up CUDA copies only. On a TPU host torch warns `UserWarning: 'pin_memory' "
        "argument is set as true but no accelerator is found, then device pinned memory won't be used` and "
        "pins nothing. Host-to-device prefetch on XLA is done by `pl.MpDeviceLoader(loader, device)`. "
        "Dropping the keyword keeps the behaviour and removes the warning."
    )
    before = "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=32, pin_memory=True)\n"
    after = "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=32)\n"
    message = "`pin_memory` has no effect on TPU; drop it (MpDeviceLoader prefetches to the device)"
    symptoms = ("UserWarning: 'pin_memory' argument is set as true but no accelerator is found",)
    references = ("torch_xla/distributed/parallel_loader.py",)
    valid = ("from torch.utils.data import DataLoader\nloader = DataLoader(ds, pin_memory=False)\n",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.qualified_names(node.func) & DATALOADERS:
            return
        drop = [a for a in (keyword_arg(node, "pin_memory"), keyword_arg(node, "pin_memory_device")) if a is not None]
        drop = [a for a in drop if not is_literal(a.value, "False") and string_value(a.value) != ""]
        if drop:
            self.report(node, replacement=drop_args(node, drop))


class OptimizerBeforeMove(Rule):
    code = "XLA215"
    needs = ("optim", "syncfree", "adamw", "adafactor")
    title = "Optimizer built before the model moves to the XLA device trains nothing"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`opt = torch.optim.X(model.parameters(), ...)` followed, later in the same function or module, by "
        "`model.to(device)` / `model = model.to(device)` / `model.cuda()` of that model (or of a module that "
        "contains the optimized one), with no move before the optimizer; also when the optimizer takes a list "
        "built from the parameters first (`params = [p for p in model.parameters() if p.requires_grad]`), or "
        "is built by a helper of the module (`opt = make_optimizer(model, cfg)`)."
    )
    why = (
        "On CUDA `.to()` keeps the Parameter objects and swaps their data, so the order does not matter there. "
        "Moving a CPU module to XLA creates NEW Parameter objects: the optimizer keeps the old CPU tensors, "
        "`optimizer.step()` updates tensors the model no longer uses, and the model never learns — the loss stays "
        "flat, exit code 0, no error (accelerate and the HF Trainer raise `ValueError: The model and the optimizer "
        "parameters are not on the same device` for this). The fix moves the model first. Safe: the optimizer then "
        "holds the parameters that train, as it does on CUDA, so the numbers are the program's; xlaport only "
        "rewrites when the move is a plain statement of the same block and nothing it uses is assigned in "
        "between. Otherwise (the device is assigned in between, the move sits in an `if`) the optimizer statement, "
        "with the statements that use it (`sched = StepLR(opt)`), goes after the move instead, when nothing it "
        "passes reads or rebinds what they use and nothing there touches the model. Other layouts are reported "
        "with the reason."
    )
    before = (
        "import torch\n\nmodel = Net()\noptimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\nmodel.to(device)\n"
    )
    after = (
        "import torch\n\nmodel = Net()\nmodel.to(device)\noptimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    )
    message = "optimizer built before the model moves to the device: it updates stale CPU parameters"
    symptoms = (
        "loss does not decrease on TPU",
        "ValueError: The model and the optimizer parameters are not on the same device",
    )
    references = ("pytorch/xla #1623", "pytorch/xla #3675", "accelerate accelerator.py _get_devices check")
    valid = (
        "import torch\nmodel = Net()\nmodel.to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "import torch\ndef f(model, device):\n    model = model.to(device)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    model.to(device)\n    return opt\n",
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.to(torch.bfloat16)\n"
        "model.to('cpu')\nx.to(device)\n",
        "import torch\nmodel = Net().to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.to(device)\n",
        "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nsched = torch.optim.lr_scheduler.StepLR(opt, 1)\n",
        "import torch\nmake = lambda *a, **k: torch.optim.SGD(*a, **k, lr=0.1)\nmodel.to(device)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if is_optimizer(self, node):
            owners = parameter_owners(node)
        else:
            owners = self._built_by_helper(node)
            if not owners:
                return
        levels = self._levels(node)
        if not levels:
            return  # not in a block (a default value, a one-line suite)
        if not owners:
            # `params = [p for p in model.parameters() if p.requires_grad]` then `AdamW(params)`: the list holds
            # the parameters of its statement's time, so that statement is where the model must be on the device
            owners, source = self._owners_by_name(node, *levels[0])
            if not owners:
                return
            levels[0] = (levels[0][0], source)
        if any(self._moved_before(stmt, owners) for block, i in levels for stmt in block.body[:i]):
            return
        for block, i in levels:
            for j in range(i + 1, len(block.body)):
                moves = [c for c, moved in self._moves_in(block.body[j]) if any(related(moved, o) for o in owners)]
                if moves:
                    self._report(node, block, i, j, moves[0], owners)
                    return

    def _built_by_helper(self, call: cst.Call) -> list[str]:
        """`opt = make_optimizer(model, cfg)` where `make_optimizer` is a top-level function of this module that
        builds an optimizer from its parameter's parameters (and does not move it): the model passed there."""
        if not isinstance(call.func, cst.Name) or "optim" not in call.func.value.lower():
            return []
        helper = next(
            (
                s
                for s in self.analysis.module.body
                if isinstance(s, cst.FunctionDef) and s.name.value == call.func.value
            ),
            None,
        )
        if helper is None:
            return []
        params = [p.name.value for p in helper.params.params]
        calls = find_nodes(helper.body, cst.Call)
        if not any(is_optimizer(self, c) for c in calls):
            return []
        roots = {o.split(".")[0] for c in calls for o in parameter_owners(c)}  # `decay = [p for p in net...]`
        moved = {moved_module(self, c) for c in calls}
        found = []
        for k, param in enumerate(params):
            if param not in roots or any(m and related(m, param) for m in moved):
                continue
            given = keyword_arg(call, param)
            args = positional_args(call)
            value = given.value if given is not None else args[k].value if k < len(args) else None
            if value is not None and dotted(value) is not None:
                found.append(dotted(value))
        return found

    def _owners_by_name(self, opt: cst.Call, block, i: int) -> tuple[list[str], int]:
        """The modules whose parameters a name given to the optimizer holds (`AdamW(params)` after `params =
        [p for p in model.parameters() ...]` or `params = model.parameters()` in the same block), and the index of
        that assignment; ([], i) when there is none."""
        args = positional_args(opt)
        given = args[0].value if args else getattr(keyword_arg(opt, "params"), "value", None)
        if not isinstance(given, cst.Name):
            return [], i
        for k in range(i - 1, -1, -1):
            stmt = block.body[k]
            if given.value not in bound_names(stmt):
                continue
            assign = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
            if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
                return [], i
            if dotted(assign.targets[0].target) != given.value:
                return [], i
            owners = parameter_owners(assign.value) if isinstance(assign.value, cst.Call) else []
            owners = owners or [
                o for c in find_nodes(assign.value, cst.Call) if c is not assign.value for o in parameter_owners(c)
            ]
            return (owners, k) if owners else ([], i)
        return [], i

    def _levels(self, node: cst.CSTNode) -> list[tuple[cst.IndentedBlock | cst.Module, int]]:
        """(block, index of the statement holding `node`) from the innermost block out to the function/module."""
        levels, child = [], node
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.IndentedBlock, cst.Module)):
                levels.append((anc, next(k for k, s in enumerate(anc.body) if s is child)))
            if isinstance(anc, (*SCOPES, cst.Module)):
                break
            child = anc
        return levels

    def _moves_in(self, stmt: cst.CSTNode) -> list[tuple[cst.Call, str]]:
        """(call, the module it moves) for each move in `stmt`; walked once per statement, not once per
        optimizer (a module of many scripts has many optimizers at its top level: that was quadratic)."""
        return self._per_statement(stmt)[0]

    def _per_statement(self, stmt: cst.CSTNode) -> tuple[list[tuple[cst.Call, str]], list[str]]:
        """The moves in `stmt`, and the names it assigns a module created on the device (`model = Net().to(d)`)."""
        cache = self.__dict__.setdefault("_statements", {})  # id -> (stmt, facts): the statement is kept alive
        if id(stmt) not in cache:
            calls = find_nodes(stmt, cst.Call, enter_root=False)
            moves = [(c, moved) for c in calls for moved in moved_modules(self, c)]
            created = [
                n
                for assign in find_nodes(stmt, cst.Assign, enter_root=False)
                if self._creates_on_device(assign.value)
                for n in (dotted(t.target) for t in assign.targets)
                if n
            ]
            cache[id(stmt)] = (stmt, (moves, created))
        return cache[id(stmt)][1]

    def _moved_before(self, stmt: cst.CSTNode, owners: list[str]) -> bool:
        moves, created = self._per_statement(stmt)
        # `model = Net().to(device)`: the module is created on the device
        moved = [m for _, m in moves] + created
        return any(related(m, o) for m in moved for o in owners)

    def _creates_on_device(self, value: cst.BaseExpression) -> bool:
        func = value.func if isinstance(value, cst.Call) else None
        return isinstance(func, cst.Attribute) and func.attr.value in {"to", "cuda"} and dotted(func.value) is None

    def _report(self, opt: cst.Call, block, i: int, j: int, move: cst.Call, owners: list[str]) -> None:
        move_line = self.position(move).start.line
        where = f"`{code_of(move.func.value)}` moves at line {move_line}"
        stmt = block.body[j]
        blocker = self._why_not_movable(block, i, j, move)
        if blocker and block.body[i] is self.statement_of_in(opt, block):
            sunk = self._sink(block, i, j, owners)
            if sunk is not None:
                self.report(
                    opt,
                    f"{self.message} ({where}); the optimizer is built after the move",
                    replacement=block.with_changes(body=sunk),
                    target=block,
                )
                return
        copied = self._move_copied_before(opt, block, i, j, move) if blocker else None
        if copied is not None:
            inner, body = copied
            self.report(
                opt,
                f"{self.message} ({where}); the model is moved where it is built, before the optimizer (the "
                f"move at line {move_line} stays: moving it again to the same device changes nothing)",
                replacement=inner.with_changes(body=body),
                target=inner,
            )
            return
        if blocker:
            self.report(
                opt,
                f"{self.message} ({where}); build the optimizer after the move, or move the model first "
                f"(not rewritten: {blocker}, and the optimizer cannot go after the move: "
                f"{self._why_not_sinkable(block, i, j, owners)})",
            )
            return
        body = list(block.body)
        comments = [line for line in stmt.leading_lines if line.comment is not None]
        blanks = [line for line in stmt.leading_lines if line.comment is None]
        new_body = [*body[:i], stmt.with_changes(leading_lines=comments), *body[i:j], *body[j + 1 :]]
        if j + 1 < len(body) and blanks:
            after = body[j + 1]
            new_body[j + 1] = after.with_changes(leading_lines=[*blanks, *after.leading_lines])
        self.report(
            opt,
            f"{self.message} ({where}); move the model before building the optimizer",
            replacement=block.with_changes(body=new_body),
            target=block,
        )

    def _move_copied_before(self, opt: cst.Call, block, i: int, j: int, move: cst.Call):
        """(the inner block, its new statements) when the optimizer is built in a block nested in statement `i`
        (an `if` that builds the model, or loads model and optimizer from a checkpoint) right after the model is
        made there, and statement `j` is a plain move of that model (`model = model.to(device)`) whose other names
        nothing from `i` to `j` rebinds: a copy of the move goes before the optimizer's statement; else None."""
        stmt = block.body[j]
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        small, model = stmt.body[0], dotted(move.func.value)
        plain = isinstance(small, cst.Expr) and small.value is move
        reassigned = (
            isinstance(small, cst.Assign)
            and small.value is move
            and len(small.targets) == 1
            and dotted(small.targets[0].target) == model
        )
        inner_stmt = self.statement_of(opt)
        inner = self.parent(inner_stmt) if inner_stmt is not None else None
        if not (plain or reassigned) or model is None or not isinstance(inner, cst.IndentedBlock):
            return None
        if inner_stmt is block.body[i] or self.statement_of_in(opt, block) is not block.body[i]:
            return None  # the optimizer is a statement of the move's own block: the other rewrites' case
        k = list(inner.body).index(inner_stmt)
        if model not in set().union(*(bound_names(s) for s in inner.body[:k])):
            return None  # the model this optimizer reads is not made here
        changed = set().union(*(bound_names(s) for s in block.body[i:j]))
        if (used_names(stmt) - {model.split(".")[0]}) & changed:
            return None  # the device (or what the move reads) is assigned in between
        return inner, [*inner.body[:k], stmt.with_changes(leading_lines=()), *inner.body[k:]]

    def statement_of_in(self, node: cst.CSTNode, block) -> cst.CSTNode | None:
        """The statement of `block` that holds `node`."""
        child = node
        for anc in self.ancestors(node):
            if anc is block:
                return child
            child = anc
        return None

    def _sink(self, block, i: int, j: int, owners: list[str]) -> list[cst.BaseStatement] | None:
        """The block's statements with the optimizer's statement `i` (and the statements before `j` that use what
        it builds: `sched = StepLR(opt)`) moved right after statement `j`, which moves the model (a plain move, or
        a move inside an `if`): when the statements they pass neither read nor rebind what they read or bind, and
        nothing from `i` to `j` touches the model except the move itself. Then the optimizer is built from the
        moved parameters, as on CUDA, and every other statement sees what it saw before."""
        group = self._sunk_group(block, i, j)
        if self._why_not_sinkable(block, i, j, owners) is not None:
            return None
        body = list(block.body)
        kept = [body[k] for k in range(i + 1, j + 1) if k not in group]
        first = body[i]
        blanks = [line for line in first.leading_lines if line.comment is None]
        kept[0] = kept[0].with_changes(leading_lines=[*blanks, *kept[0].leading_lines])
        sunk = [body[k] for k in sorted(group)]
        sunk[0] = first.with_changes(leading_lines=[line for line in first.leading_lines if line.comment is not None])
        return [*body[:i], *kept, *sunk, *body[j + 1 :]]

    def _sunk_group(self, block, i: int, j: int) -> set[int]:
        """Statement `i` and those between it and `j` that read what the group binds (transitively)."""
        group, binds = {i}, set(bound_names(block.body[i]))
        for k in range(i + 1, j):
            if used_names(block.body[k]) & binds:
                group.add(k)
                binds |= bound_names(block.body[k])
        return group

    def _why_not_sinkable(self, block, i: int, j: int, owners: list[str]) -> str | None:
        group = self._sunk_group(block, i, j)
        if not all(isinstance(block.body[k], cst.SimpleStatementLine) for k in group):
            return "it is not a plain statement"
        reads = set().union(*(used_names(block.body[k]) for k in group))
        binds = set().union(*(bound_names(block.body[k]) for k in group))
        roots = {o.split(".")[0] for o in owners}
        for k in range(i + 1, j + 1):
            later = block.body[k]
            line = self.position(later).start.line
            moves = [c for c, moved in self._moves_in(later) if any(related(moved, o) for o in owners)]
            if k in group:
                if self._touches_model(later, owners, []):
                    return f"line {line} uses the model"
                continue
            if bound_names(later) & (reads | binds) - (roots if k == j else set()):
                return f"line {line} assigns what it uses"
            if used_names(later) & binds:
                return f"line {line} uses `{'`, `'.join(sorted(used_names(later) & binds))}`"
            if self._touches_model(later, owners, moves):
                return f"line {line} uses the model"
            if isinstance(block, cst.Module) and self._calls_unknown(later, moves):
                # a module-level optimizer is a global: a function called in between may read it
                return f"line {line} calls a function that may use the optimizer"
        return None

    def _calls_unknown(self, stmt: cst.CSTNode, moves: list[cst.Call]) -> bool:
        """A call in `stmt` other than the moves and torch / torch_xla functions."""
        for call in find_nodes(stmt, cst.Call):
            if any(call is m for m in moves):
                continue
            if not any(n.split(".")[0] in ("torch", "torch_xla") for n in self.qualified_names(call.func)):
                return True
        return False

    def _touches_model(self, stmt: cst.CSTNode, owners: list[str], moves: list[cst.Call]) -> bool:
        """Does `stmt` name the model (or a part of it) other than in one of `moves` or as the name a move's
        result is assigned to?"""
        allowed = {id(n) for move in moves for n in find_nodes(move, cst.Name, cst.Attribute)}
        for assign in find_nodes(stmt, cst.Assign):
            if any(assign.value is move for move in moves):
                allowed |= {id(n) for t in assign.targets for n in find_nodes(t, cst.Name, cst.Attribute)}
        for node in find_nodes(stmt, cst.Name, cst.Attribute):
            parent = self.parent(node)
            if isinstance(parent, cst.Attribute) and parent.value is node:
                continue  # only outermost names: `self` in `self.device` is not the model `self.model`
            name = dotted(node)
            if name is not None and id(node) not in allowed and any(related(name, o) for o in owners):
                return True
        return False

    def _why_not_movable(self, block, i: int, j: int, move: cst.Call) -> str | None:
        stmt = block.body[j]
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return "the move is not a plain statement of the same block"
        small = stmt.body[0]
        plain = isinstance(small, cst.Expr) and small.value is move
        reassigned = (
            isinstance(small, cst.Assign)
            and small.value is move
            and len(small.targets) == 1
            and dotted(small.targets[0].target) == dotted(move.func.value)
        )
        if not (plain or reassigned):
            return "the move is part of a larger statement"
        changed = set().union(*(bound_names(s) for s in block.body[i:j]))
        clash = sorted(used_names(stmt) & changed)
        if clash:
            return f"`{'`, `'.join(clash)}` is assigned between the optimizer and the move"
        return None


# --- host work in the step loop -----------------------------------------------------------
class NumpyOfDeviceTensor(ScopedRule):
    code = "XLA221"
    needs = ("numpy",)
    title = "`.numpy()` on a tensor of the training loop fails once it lives on XLA"
    category = "C2"
    fix = "safe"
    autofix = True
    detects = (
        "`t.numpy()` / `t.detach().numpy()` without `.cpu()` / `.to(...)` in the chain, inside a training-step loop "
        "(where MpDeviceLoader batches and model outputs are XLA tensors after the migration)."
    )
    why = (
        "Converting an XLA tensor raises `TypeError: can't convert xla:0 device type tensor to numpy. Use "
        "Tensor.cpu() to copy the tensor to host memory first.` On GPU such code worked because the tensors were "
        "still CPU tensors (e.g. labels straight from a DataLoader); once MpDeviceLoader puts batches on the device "
        "it breaks. Inserting `.cpu()` is a no-op for CPU tensors. Each such copy is a host sync: move per-step "
        "metrics into `xm.add_step_closure` when speed matters."
    )
    before = (
        "for x, y in loader:\n    loss = step(x, y)\n    loss.backward()\n    opt.step()\n"
        "    preds = out.detach().numpy()\n"
    )
    after = (
        "for x, y in loader:\n    loss = step(x, y)\n    loss.backward()\n    opt.step()\n"
        "    preds = out.detach().cpu().numpy()\n"
    )
    message = "`.numpy()` raises for XLA tensors; copy to the host with `.cpu()` first"
    symptoms = (
        "TypeError: can't convert xla:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.",
    )
    references = ("xla_migration_facts C2 .numpy() on device tensors",)
    valid = (
        "for x, y in loader:\n    loss.backward()\n    opt.step()\n    a = loss.detach().cpu().numpy()\n",
        "preds = out.detach().numpy()\n",
        "for x, y in loader:\n    loss.backward()\n    opt.step()\n    a = loss.numpy(force=True)\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "numpy") or node.args:
            return
        receiver: cst.CSTNode = func.value
        while True:
            if isinstance(receiver, cst.Call):
                inner = receiver.func
                if isinstance(inner, cst.Attribute) and inner.attr.value in {"cpu", "to"}:
                    return  # already copied to the host
                receiver = inner
            elif isinstance(receiver, (cst.Attribute, cst.Subscript)):
                receiver = receiver.value
            else:
                break
        if self.qualified_names(receiver) or training_loop(self, node) is None or self.facts().cpu_script:
            return  # `np...`, `torch.from_numpy(...)...`: not a device tensor; outside the loop: unknown
        to_host = cst.Call(cst.Attribute(func.value, cst.Name("cpu")))
        self.report(node, replacement=node.with_changes(func=func.with_changes(value=to_host)))


FACTORIES = frozenset(
    f"torch.{n}" for n in "randn rand randint randperm normal zeros ones empty full arange linspace eye".split()
)


class HostTensorMovedInLoop(Rule):
    code = "XLA222"
    needs = ("rand", "normal", "zeros", "ones", "empty", "full", "arange", "linspace", "eye")
    title = "Tensor built on the host then moved, every step"
    category = "C2"
    fix = "unsafe"
    autofix = True
    detects = (
        "`torch.randn(...).to(device)` / `torch.zeros(...).cuda()` (tensor factories) inside a training-step loop."
    )
    why = (
        "The factory runs on the CPU and each step pays an extra host-to-device transfer (`TransferToDeviceTime` "
        "grows with steps); the constant also becomes a graph input instead of being generated inside the XLA "
        "graph. Build it on the device: `torch.randn(shape, device=device)`. Unsafe: random factories then draw "
        "from the XLA generator, so the numbers differ from the CPU-generated ones (seed with `torch_xla.manual_seed`)."
    )
    before = (
        "import torch\n\nfor x, y in loader:\n    noise = torch.randn(x.shape).to(device)\n"
        "    loss = model(x + noise, y)\n    loss.backward()\n    opt.step()\n"
    )
    after = (
        "import torch\n\nfor x, y in loader:\n    noise = torch.randn(x.shape, device=device)\n"
        "    loss = model(x + noise, y)\n    loss.backward()\n    opt.step()\n"
    )
    message = "tensor created on the CPU and copied each step; create it on the device (`device=`)"
    symptoms = ("TransferToDeviceTime grows every step",)
    references = ("pytorch/xla #8861",)
    valid = (
        "import torch\nfor x in loader:\n    n = torch.randn(3, device=device)\n    loss.backward()\n",
        "import torch\nnoise = torch.randn(3).to(device)\n",
        "import torch\nfor x in loader:\n    m = torch.ones(3).to(torch.bfloat16)\n    loss.backward()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in {"to", "cuda"}):
            return
        factory = func.value
        if not (isinstance(factory, cst.Call) and self.qualified_names(factory.func) & FACTORIES):
            return
        if keyword_arg(factory, "device") is not None or step_loop(self, node) is None:
            return  # once per epoch (an initial state, a sample grid) is one small copy, not one per step
        device = self._device(node)
        if device is False:
            return
        if device is None or has_star_args(factory):
            self.report(node)
            return
        imports = (IMPORT_TORCH_XLA,) if code_of(device) == XLA_DEVICE else ()
        self.report(node, replacement=add_kwarg(factory, "device", device), imports=imports)

    def _device(self, call: cst.Call) -> cst.BaseExpression | None | bool:
        """The device expression of `.to(...)`/`.cuda()`; False when it is not a device move; None if unclear."""
        if call.func.attr.value == "cuda":
            return None if call.args and any(a.keyword is None for a in call.args) else expr(XLA_DEVICE)
        args = positional_args(call)
        extra = [a for a in call.args if a.keyword is not None and a.keyword.value != "non_blocking"]
        if len(args) != 1 or extra:
            return None if args else False
        target = args[0].value
        if self.qualified_names(target) & DTYPE_NAMES or string_value(target) == "cpu":
            return False
        return target
