"""C3 — weight tying: parameters shared by assignment come apart when the model moves to the XLA device."""

from __future__ import annotations

import libcst as cst

from ..analysis.optimizers import moved_module
from ..cst_helpers import SCOPES, code_of, dotted, find_nodes, method_name, statements
from ..rule import Rule

WEIGHT_NAMES = ("weight", "bias")
HF_MODEL_ROOTS = ("transformers.",)


def is_parameter_path(path: str | None, root: str) -> bool:
    """`self.lm_head.weight` (rooted at `root`, at least one module in between, a weight-like last name)."""
    if path is None:
        return False
    parts = path.split(".")
    return len(parts) >= 3 and parts[0] == root and parts[-1].endswith(WEIGHT_NAMES)


def tie_of(statement: cst.CSTNode, root: str) -> tuple[str, str] | None:
    """(tied, source) for `root.a.weight = root.b.weight`, the source being the parameter kept: a statement line,
    or the assignment itself (the body of a one-line `if config.tie_word_embeddings: ...`)."""
    assign = _one_assignment(statement)
    if assign is None or len(assign.targets) != 1:
        return None
    tied, source = dotted(assign.targets[0].target), dotted(assign.value)
    if is_parameter_path(tied, root) and is_parameter_path(source, root) and tied != source:
        return tied, source
    return None


def _one_assignment(statement: cst.CSTNode) -> cst.Assign | None:
    """The assignment a statement line holds alone, or `statement` itself when it is one."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        statement = statement.body[0]
    return statement if isinstance(statement, cst.Assign) else None


def shared_parameter_ties(body: list[cst.CSTNode], root: str) -> list[tuple[str, str]]:
    """Ties by a shared object: `root.a.weight = p` and `root.b.weight = p` give (root.b.weight, root.a.weight)."""
    first_target: dict[str, str] = {}
    ties = []
    for statement in body:
        assign = _one_assignment(statement)
        if assign is None or len(assign.targets) != 1 or not isinstance(assign.value, cst.Name):
            continue
        target = dotted(assign.targets[0].target)
        if not is_parameter_path(target, root):
            continue
        shared = assign.value.value
        if shared in first_target:
            ties.append((target, first_target[shared]))
        else:
            first_target[shared] = target
    return ties


def class_ties(node: cst.ClassDef) -> list[tuple[str, str]]:
    """Every tie that the methods of `node` make on `self` (nested blocks included)."""
    ties: list[tuple[str, str]] = []
    for method in node.body.body:
        if not isinstance(method, cst.FunctionDef):
            continue
        blocks = [method.body, *(b.body for b in find_nodes(method.body, cst.If, cst.For, cst.With, cst.Else))]
        for block in blocks:
            body = list(getattr(block, "body", []))
            for statement in body:
                tie = tie_of(statement, "self")
                if tie and tie not in ties:
                    ties.append(tie)
            ties += [t for t in shared_parameter_ties(body, "self") if t not in ties]
    return ties


def reapply_method(ties: list[tuple[str, str]]) -> cst.FunctionDef:
    """`_apply` that ties the parameters again after every move (`to`, `cuda`, `half`, ...) that untied them."""
    before = "".join(f"    tied_{i} = {source} is {tied}\n" for i, (tied, source) in enumerate(ties))
    after = "".join(f"    if tied_{i}:\n        {tied} = {source}\n" for i, (tied, source) in enumerate(ties))
    code = (
        "def _apply(self, fn, *args, **kwargs):\n"
        "    # a move to the XLA device copies each parameter on its own: tie them again (xlaport XLA314)\n"
        f"{before}"
        "    module = super()._apply(fn, *args, **kwargs)\n"
        f"{after}"
        "    return module\n"
    )
    return statements(code)[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])


class WeightTyingLostOnMove(Rule):
    code = "XLA314"
    needs = ("weight", "bias", "transformers")
    title = "Tied weights come apart when the model moves to the XLA device"
    category = "C3"
    fix = "safe"
    autofix = True
    detects = (
        "Parameters shared by assignment — `self.a.weight = self.b.weight` in a module, the same `nn.Parameter` "
        "assigned to two modules, `model.a.weight = model.b.weight` before `model.to(device)`, or a Hugging Face "
        "`from_pretrained` model (tied input/output embeddings) moved with `.to(device)`."
    )
    why = (
        "`Module.to(xla_device)` cannot swap an XLA tensor into an existing CPU parameter, so it creates a new "
        "`nn.Parameter` for every module separately: the two modules that shared one parameter now hold two "
        "(measured with torch_xla 2.9: `m.a.weight is m.b.weight` becomes False and the parameter count grows). "
        "Training then updates the two copies apart: a different, untied model, with no error. The fix ties them "
        "again after the move (an `_apply` override in the module, a re-assignment after `.to(...)`, or "
        "`model.tie_weights()` for Hugging Face models), which restores the original program's meaning."
    )
    before = (
        "import torch.nn as nn\n\n\n"
        "class LM(nn.Module):\n"
        "    def __init__(self, vocab, dim):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Embedding(vocab, dim)\n"
        "        self.head = nn.Linear(dim, vocab, bias=False)\n"
        "        self.embed.weight = self.head.weight\n"
    )
    after = (
        "import torch.nn as nn\n\n\n"
        "class LM(nn.Module):\n"
        "    def __init__(self, vocab, dim):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Embedding(vocab, dim)\n"
        "        self.head = nn.Linear(dim, vocab, bias=False)\n"
        "        self.embed.weight = self.head.weight\n"
        "\n"
        "    def _apply(self, fn, *args, **kwargs):\n"
        "        # a move to the XLA device copies each parameter on its own: tie them again (xlaport XLA314)\n"
        "        tied_0 = self.head.weight is self.embed.weight\n"
        "        module = super()._apply(fn, *args, **kwargs)\n"
        "        if tied_0:\n"
        "            self.embed.weight = self.head.weight\n"
        "        return module\n"
    )
    message = (
        "parameters tied by assignment come apart when the model moves to the XLA device (each gets its own copy); "
        "tie them again after the move"
    )
    symptoms = (
        "`len(list(model.parameters()))` grows after `model.to(xla_device)`",
        "the migrated model trains to a different loss than the original, no error",
    )
    references = (
        "pytorch/xla TROUBLESHOOTING.md (XLA tensor quirks: weight sharing)",
        "pytorch/xla #7042",
        "Lightning-AI/pytorch-lightning #2705",
        "huggingface/transformers #13030",
    )
    valid = (
        "import torch.nn as nn\nclass LM(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.head = nn.Linear(4, 4)\n        self.embed.weight = self.head.weight\n"
        "    def _apply(self, fn, *args, **kwargs):\n        module = super()._apply(fn, *args, **kwargs)\n"
        "        self.embed.weight = self.head.weight\n        return module\n",
        "import torch\nmodel.head.weight = model.embed.weight\nmodel.to(device)\nmodel.head.weight = model.embed.weight\n",
        "import torch\nself.weight = other.weight\n",
    )

    _self_parameters: bool | None = None  # see _assigns_self_parameters (answered once per lint)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if not self._assigns_self_parameters():
            return  # every tie of a class assigns `self.<module>.<weight>`: none in this module
        methods = {m.name.value for m in node.body.body if isinstance(m, cst.FunctionDef)}
        ties = class_ties(node)
        if not ties or "_apply" in methods:
            return
        body = node.body.with_changes(body=[*node.body.body, reapply_method(ties)])
        self.report(node, replacement=node.with_changes(body=body))

    def _assigns_self_parameters(self) -> bool:
        """Does some assignment of the module target a parameter path of `self` (`self.head.weight = ...`)?"""
        if self._self_parameters is None:
            self._self_parameters = any(
                is_parameter_path(dotted(target.target), "self")
                for assign in self.analysis.nodes.assigns
                if isinstance(assign, cst.Assign)
                for target in assign.targets
            )
        return self._self_parameters

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        if not isinstance(self.parent(node), cst.ClassDef):
            self._check_block(list(node.body))

    def visit_Module(self, node: cst.Module) -> None:
        self._check_block(list(node.body))

    def _check_block(self, body: list[cst.CSTNode]) -> None:
        """A tie (or a Hugging Face model) then a move of the same model, with no tie after the move."""
        for i, statement in enumerate(body):
            for root, retie in [*self._ties_made(statement), *self._conditional_ties(statement)]:
                moves = [j for j in range(i + 1, len(body)) if root in self._moved(body[j])]
                if not moves or _condition_changes(statement, body[i + 1 : moves[-1] + 1]):
                    continue
                if not self._module_trains() and not _returns(body, root):
                    continue  # used here for inference only: both copies of the split tie keep the same values
                last = moves[-1]
                if any(code_of(s).strip() == retie for s in body[last + 1 :]):
                    continue
                line = body[last]
                self.report(line, replacement=cst.FlattenSentinel([line, *statements(retie + "\n")]))

    def _module_trains(self) -> bool:
        """Does the module run a backward pass or build an optimizer (then the copies of a split tie drift)?"""
        return any(
            method_name(c) == "backward" or any(n.startswith("torch.optim.") for n in self.qualified_names(c.func))
            for c in self.analysis.nodes.calls
        )

    def _ties_made(self, statement: cst.CSTNode) -> list[tuple[str, str]]:
        """(model name, the statement that ties again) for a tie by assignment or a Hugging Face model."""
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return []
        assign = statement.body[0]
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return []
        target = dotted(assign.targets[0].target)
        if target is None:
            return []
        root = target.split(".")[0]
        if root != "self":
            tie = tie_of(statement, root)
            if tie:
                return [(root, f"{tie[0]} = {tie[1]}")]
        value = assign.value
        if (
            "." not in target
            and isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "from_pretrained"
            and any(n.startswith(HF_MODEL_ROOTS) for n in self.qualified_names(value.func.value))
        ):
            return [(target, f"{target}.tie_weights()")]
        return []

    def _conditional_ties(self, statement: cst.CSTNode) -> list[tuple[str, str]]:
        """(model name, the `if` that ties again) for ties under an `if` with no `else` whose condition reads no
        call (`if config.tie_word_embeddings: model.embed.weight = model.head.weight`): the copy after the move ties
        again under the same condition, so an untied configuration stays untied."""
        if not isinstance(statement, cst.If) or statement.orelse is not None or find_nodes(statement.test, cst.Call):
            return []
        ties: dict[str, list[str]] = {}
        for inner in statement.body.body:
            assign = _one_assignment(inner)
            target = dotted(assign.targets[0].target) if assign is not None and len(assign.targets) == 1 else None
            root = target.split(".")[0] if target else "self"
            tie = tie_of(inner, root) if root != "self" else None
            if tie:
                ties.setdefault(root, []).append(f"    {tie[0]} = {tie[1]}\n")
        condition = code_of(statement.test)
        return [(root, f"if {condition}:\n{''.join(lines)}".rstrip()) for root, lines in ties.items()]

    def _moved(self, statement: cst.CSTNode) -> set[str]:
        """Names of the models that `statement` moves (`m.to(d)`, `m = m.to(d)`, `m.cuda()`)."""
        if isinstance(statement, SCOPES) or not isinstance(statement, cst.SimpleStatementLine):
            return set()
        return {name for call in find_nodes(statement, cst.Call) if (name := moved_module(self, call))}


def _condition_changes(statement: cst.CSTNode, between: list[cst.CSTNode]) -> bool:
    """Is a name that the `if` of a conditional tie reads assigned again before the move (then the same condition
    after the move may not say what it said at the tie)?"""
    if not isinstance(statement, cst.If):
        return False
    read = {n.value for n in find_nodes(statement.test, cst.Name)}
    for later in between:
        for target in find_nodes(later, cst.AssignTarget, cst.AugAssign, cst.AnnAssign):
            if {n.value for n in find_nodes(target.target, cst.Name)} & read:
                return True
    return False


def _returns(body: list[cst.CSTNode], name: str) -> bool:
    """Does a `return` in `body` hand `name` to the caller (who may train it)?"""
    for statement in body:
        for ret in find_nodes(statement, cst.Return):
            value = ret.value
            parts = [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value]
            if any(isinstance(p, cst.Name) and p.value == name for p in parts):
                return True
    return False
