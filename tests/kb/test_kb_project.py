"""Step barriers across the modules of a tree (issue 9, item 3): a training loop whose optimizer step runs in
another module (a loss-scaler object's `__call__`, a trainer member's method, an imported step function)
gets exactly one barrier, in the loop that iterates the batches; where the tree does not say what a callable
given the optimizer does, a manual finding on that line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource
from xlaport.kb import fix_source, lint_source
from xlaport.kb.analysis.project import _absolute, absolute_names, star_exports
from xlaport.kb.analysis.project_steps import ProjectSteps, module_name
from xlaport.kb.batch import fix_file, lint_file, summarize_project
from xlaport.kb.cst_helpers import code_of
from xlaport.kb.engine import run_rules
from xlaport.kb.parsing import parse_both
from xlaport.kb.step_rule import StepContextRule

PROJECTS = Path(__file__).parent.parent / "fixtures" / "project"
CASES = sorted(p for p in PROJECTS.iterdir() if p.is_dir())


def python_files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*.py"))


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_default_tree_fix_places_one_barrier_per_step(case: Path):
    src, expected = case / "input", case / "expected"
    rels = python_files(src)
    assert rels == python_files(expected)
    project = summarize_project(src, rels)
    for rel in rels:
        fixed = fix_file(src / rel, display=str(rel), project=project).fixed  # default: safe fixes only
        assert fixed == (expected / rel).read_text(), rel
        ast.parse(fixed)
    again = summarize_project(expected, rels)
    for rel in rels:
        assert fix_file(expected / rel, display=str(rel), project=again).fixed == (expected / rel).read_text()
        assert "XLA406" not in {f.code for f in lint_file(expected / rel, display=str(rel), project=again).findings}


def barriers(case: str) -> dict[str, int]:
    root = PROJECTS / case / "expected"
    return {str(rel): (root / rel).read_text().count("torch_xla.sync()") for rel in python_files(root)}


def test_the_barrier_goes_in_the_batch_loop_not_in_the_helper_nor_the_epoch_loop():
    assert barriers("callable_scaler") == {
        "epoch_loop.py": 1,
        "run.py": 0,
        "tools/__init__.py": 0,
        "tools/amp_helpers.py": 0,
    }
    assert barriers("trainer_member") == {
        "diffusion/__init__.py": 0,
        "diffusion/half.py": 0,
        "diffusion/train_loop.py": 1,
    }
    # the step function's own loop and the other script's loop: one each
    assert barriers("imported_step") == {"pretrain.py": 1, "steplib.py": 1}
    assert barriers("helper_syncs") == {"helpers.py": 1, "main.py": 0}  # the helper's own, no second one


def test_a_method_that_is_the_step_gets_one_barrier_where_one_step_ends():
    """An agent's `train()` method runs the optimizer step; the loop that calls it is elsewhere (issue 24)."""
    # the caller's loop in another file: there, after the call (run.py names no device: still the device's step)
    assert barriers("agent_across_files") == {"learner.py": 0, "run.py": 1}
    # in one file: after the call; `self.net.train()` in `pick()` is the network's mode switch, not a step
    expected = (PROJECTS / "agent_same_file" / "expected" / "dqn.py").read_text()
    assert expected.count("torch_xla.sync()") == 1
    assert "learner.train()\n            torch_xla.sync()" in expected
    # no caller the tree can resolve (the agent comes from a factory): at the end of the method
    assert barriers("agent_unresolved") == {"learner.py": 1, "run.py": 0}
    learner = (PROJECTS / "agent_unresolved" / "expected" / "learner.py").read_text()
    assert "self.opt.step()\n        torch_xla.sync()" in learner
    # called from several places: each loop that calls it, never also in the method; a single call needs none
    assert barriers("agent_several_callers") == {"learner.py": 0, "run.py": 2, "tune.py": 1}


def test_summary_names_the_stepping_callables_and_binds_the_parameter():
    src = PROJECTS / "callable_scaler" / "input"
    project = summarize_project(src, python_files(src))
    assert project.steppers == {"tools.amp_helpers.ScaledUpdate.__call__"}
    assert project.class_of_param("epoch_loop.one_epoch", "updater") == "tools.amp_helpers.ScaledUpdate"
    src = PROJECTS / "trainer_member" / "input"
    steppers = summarize_project(src, python_files(src)).steppers
    assert "diffusion.half.HalfPrecisionStepper.apply" in steppers
    assert "diffusion.train_loop.Loop.run_step" in steppers  # steps through the other module's object
    assert "diffusion.train_loop.Loop.run" not in steppers  # has its own loop (and barrier)


def manual_barriers(source: str, path: str = "x.py", project: ProjectSteps | None = None) -> list[int]:
    return [f.line for f in lint_source(source, path, project=project) if f.code == "XLA406" and f.fix == "manual"]


def test_a_module_alone_gets_a_manual_finding_where_the_step_may_hide():
    loop = (PROJECTS / "callable_scaler" / "input" / "epoch_loop.py").read_text()
    assert manual_barriers(loop) == [13]  # updater(loss, optim, ...): a parameter, its code out of sight
    assert "torch_xla.sync()" not in fix_source(loop).fixed  # a guess is never applied
    trainer = (PROJECTS / "trainer_member" / "input" / "diffusion" / "train_loop.py").read_text()
    assert manual_barriers(trainer) == [27]  # self.half.apply(self.opt): an object of unknown class


def test_callers_that_pass_different_objects_leave_it_uncertain():
    src = PROJECTS / "callable_scaler" / "input"
    rels = python_files(src)
    other = "from epoch_loop import one_epoch\n\none_epoch(net, data, opt, dev, print)\n"
    summaries = summarize_project(src, rels)
    assert summaries.class_of_param("epoch_loop.one_epoch", "updater") is not None
    # a second caller passing something else: the parameter's class is no longer known
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rel in rels:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text((src / rel).read_text())
        (root / "other.py").write_text(
            other.replace("print", "CountingUpdate()").replace(
                "from epoch_loop", "from other_helpers import CountingUpdate\nfrom epoch_loop"
            )
        )
        (root / "other_helpers.py").write_text(
            "class CountingUpdate:\n    def __call__(self, *a, **k):\n        pass\n"
        )
        project = summarize_project(root, python_files(root))
        assert project.class_of_param("epoch_loop.one_epoch", "updater") is None
        assert manual_barriers((root / "epoch_loop.py").read_text(), "epoch_loop.py", project) == [13]


def test_no_finding_for_calls_the_tree_knows_do_not_step():
    source = (
        "import torch\n"
        "from lr import adjust\n\n"
        "def train(net, batches, optimizer, log):\n"
        "    for x in batches:\n"
        "        adjust(optimizer, 0.1)\n"
        "        loss = net(x).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        log.write(optimizer)\n"
    )
    project = ProjectSteps(modules=frozenset({"lr", "train"}))
    assert manual_barriers(source, "train.py", project) == []  # the loop steps itself: its barrier is safe


@pytest.mark.parametrize(
    ("name", "module", "absolute"),
    [
        (".half.Stepper", "diffusion.train_loop", "diffusion.half.Stepper"),
        ("..util.f", "pkg.sub.mod", "pkg.util.f"),
        ("util.misc.X", "engine", "util.misc.X"),
    ],
)
def test_relative_imports_resolve_against_the_module(name, module, absolute):
    assert _absolute(name, module) == absolute


def test_module_names_and_resolution_from_a_folder_above_the_root():
    assert module_name("util/misc.py") == "util.misc"
    assert module_name("pkg/__init__.py") == "pkg"
    project = ProjectSteps(modules=frozenset({"util.misc", "engine"}))
    assert project.resolve("util.misc.NativeScaler") == "util.misc.NativeScaler"
    assert project.resolve("mae.util.misc.NativeScaler") is None  # a folder above the root is not the tree
    assert project.resolve("torch.optim.SGD") is None


def test_a_caller_that_cannot_be_read_leaves_the_parameter_unknown(tmp_path):
    src = PROJECTS / "callable_scaler" / "input"
    for rel in python_files(src):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((src / rel).read_text())
    (tmp_path / "broken.py").write_text("from epoch_loop import one_epoch\none_epoch(net, data, opt, dev, upd\n")
    project = summarize_project(tmp_path, python_files(tmp_path))  # a syntax error stops nothing
    assert project.steppers == {"tools.amp_helpers.ScaledUpdate.__call__"}
    assert project.class_of_param("epoch_loop.one_epoch", "updater") is None


# Names bound every way the fast path of `absolute_names` must tell apart: module-level definitions and
# assignments, parameters and locals that shadow them, class bodies, comprehensions, lambdas, `global`,
# decorators and defaults, names imported and also assigned.
SCOPES = """\
import os
from .util import helper as step_fn
import torch.nn as nn

def train_step(model, batch):
    return model(batch)

class Trainer:
    make = train_step
    def run(self, batch, train_step=None):
        train_step(batch)
        self.make(batch)
        Trainer(batch)
        return [train_step(b) for b in batch]

@train_step
def wrapped(x=train_step(1), *rest, **named):
    local = lambda train_step: train_step(x)
    nn.Linear(2, 2)
    step_fn(x)
    return local(rest)

def rebinds():
    global counter
    counter = train_step(0)
    os = None
    os.path.join("a")
    counter(1)

def late():
    step_fn = train_step
    step_fn(0)
    [Trainer() for Trainer in range(2)]

def comprehends(total):
    pairs = [model(k) for model in range(2)]
    model.run(pairs)
    total += counter(1)
    del Trainer
    Trainer(total)

class Limits:
    max = 3
    def top(self, xs):
        return max(xs) + sorted(squares)

scale: float
def scaled(x):
    return scale(x) + gone(x)
gone = train_step
del gone

counter = train_step(1)
model = Trainer()
model.run(1)
train_step(model, None)
squares = {k: train_step(k) for k in range(3)}
max(1, 2)
os = os.getcwd()
os.path.join("b")
blocks = [Trainer(i) for i in range(2)]
made = lambda n: Trainer(n)
walrus = [(Trainer := x) for x in range(2)]


def inside(n):
    return [train_step(Trainer(i)) for i in range(n)], (lambda: train_step(n))(), {Trainer: 1 for Trainer in "ab"}


class Counter:
    def bump(self, counter):
        self.total += 1
        self.seen[counter] += 1
        self.run(counter)

def annotated():
    model: Trainer
    model = Trainer()
    model.run(1)

def reads_global():
    global squares, model
    squares(1)
    model.run(2)

def outer():
    state = train_step(0)
    def inner():
        nonlocal state
        state = state(1)
    return inner

def encloses(batch):
    seen = [s.keys() for s in batch]
    def hook():
        nonlocal seen
        seen.append(train_step(0))
    return {k.values() for k in seen}

keys = [s.keys() for s in range(2)]

try:
    from .fast import compiled, tools
except ImportError:
    def compiled():
        return False
    tools = None

def uses_compiled(batch):
    tools.run(batch)
    return compiled(batch)

@train_step(6)
class Wrapped(Trainer):
    @train_step(7)
    def go(self, n=train_step(4)) -> train_step(5):
        return max(n)
"""

# What needs no scope analysis of the whole module (it costs about three parses of it): attributes of a method's
# parameters that the method also updates (`self.total += 1`), locals annotated before their assignment, names a
# function declares `global`.
PLAIN_SCOPES = """def train_step(model, batch):
    return model(batch)

counter = train_step(0)

class Loop:
    def run(self, batch):
        self.steps += 1
        self.losses[batch] += 1
        self.log(batch)
        train_step(self, batch)

def annotated(batch):
    total: int
    total = train_step(None, batch)
    total.backward()

def reset():
    global counter
    counter = train_step(1)
    counter.step()

@train_step
def decorated(batch=train_step(2)) -> train_step(3):
    counts = {n for state in batch for n in state.tensors.keys()}
    def inner():
        nonlocal counts
        counts.append(1)
    return batch

try:
    from .fast import compiled
except ImportError:
    def compiled():
        return False

def uses_compiled(batch):
    return compiled(batch)

@train_step
class Decorated(Loop):
    @train_step
    def method(self):
        return counter
"""


class _Names(StepContextRule):
    code = "names"


def _disagreements(source: str, module_name: str) -> tuple[int, list[str]]:
    """(calls' callees and arguments checked, those whose `absolute_names` differ from what libcst's own scope
    analysis of the whole module gives)."""
    module, tree = parse_both(source)
    rule = _Names()
    run_rules(module, [rule], None, None, tree, source)
    rule.analysis.module_name = module_name
    nodes = [n for call in rule.analysis.nodes.calls for n in (call.func, *(a.value for a in call.args))]
    libcst_names = rule.analysis.wrapper.resolve(QualifiedNameProvider)
    wrong = []
    for node in nodes:
        expected = set()
        found = libcst_names.get(node, ())
        for q in found.callable() if hasattr(found, "callable") else found:  # libcst resolves them lazily
            if q.source is QualifiedNameSource.IMPORT:
                expected.add(_absolute(q.name, module_name))
            elif q.source is QualifiedNameSource.LOCAL and "<locals>" not in q.name:
                expected.add(f"{module_name}.{q.name}")
        if absolute_names(rule, node) != expected:
            wrong.append(code_of(node))
    return len(nodes), wrong


def test_absolute_names_agree_with_libcsts_scope_analysis():
    checked, wrong = _disagreements(SCOPES, "pkg.train")
    assert checked > 40
    assert not wrong


@pytest.mark.slow
def test_absolute_names_agree_with_libcsts_scope_analysis_on_torchs_own_modules():
    # real modules, with the idioms the tables answer without libcst (try/except imports with a fallback def,
    # decorators, nonlocal closures, comprehensions in functions): 72,187 of 72,187 agreed over 448 torch and
    # corpus files when these answers were added
    import torch

    root = Path(torch.__file__).parent
    paths = sorted((root / "distributed").rglob("*.py"))[::12] + sorted((root / "nn").rglob("*.py"))[::12]
    checked = 0
    for path in paths:
        count, wrong = _disagreements(path.read_text(encoding="utf-8"), "pkg.mod")
        assert not wrong, f"{path}: {wrong[:5]}"
        checked += count
    assert checked > 3000


def test_methods_updating_attributes_annotations_and_globals_need_no_scope_analysis():
    from libcst.metadata import ScopeProvider

    module, tree = parse_both(PLAIN_SCOPES)
    rule = _Names()
    run_rules(module, [rule], None, None, tree, PLAIN_SCOPES)  # with its text, as a lint has it
    rule.analysis.module_name = "pkg.loop"
    found = {code_of(call.func): absolute_names(rule, call.func) for call in rule.analysis.nodes.calls}
    assert ScopeProvider not in rule.analysis.wrapper._metadata  # answered by the module's own tables
    assert found["self.log"] == found["total.backward"] == set()
    assert found["counter.step"] == {"pkg.loop.counter.step"}
    assert found["train_step"] == {"pkg.loop.train_step"}
    assert found["compiled"] == {"pkg.fast.compiled", "pkg.loop.compiled"}


def test_star_imports_export_what_python_binds():
    sources = {
        "train": "from utils import *\nfrom .helpers import *\n",
        "utils": "__all__ = ['step']\ndef step(opt): opt.step()\ndef hidden(): pass\n",
        "helpers": "def log(x): pass\ndef _private(): pass\nclass Meter: pass\nRATE = 3\n",
        "unused": "def never(): pass\n",
    }
    assert star_exports(sources) == {
        ("utils", "step"),
        ("helpers", "log"),
        ("helpers", "Meter"),
        ("helpers", "RATE"),
    }


def test_a_sparse_adjacency_built_in_another_module_is_not_moved_as_it_is():
    """pygcn's layout (issue 24): the loader module returns a sparse adjacency among dense tensors; the training
    script unpacks it and moves it with `.cuda()`. XLA520 needs the tree summary to see it."""
    src = PROJECTS / "graph_sparse_adjacency" / "input"
    rels = python_files(src)
    project = summarize_project(src, rels)
    assert project.sparse_returns == {("graphs.scipy_to_torch", -1), ("graphs.make_graph", 0)}
    train = src / "train.py"
    found = lint_file(train, display="train.py", project=project).findings
    moves = [f.line for f in found if f.code == "XLA520" and "moving one to the device" in f.message]
    assert moves == [22]  # `adjacency = adjacency.cuda()`; x and y (positions 1, 2) are dense
    assert [f.line for f in found if f.code == "XLA201"] == [21, 23, 24]  # the sparse move is not made plain
    alone = lint_source(train.read_text(), "train.py")
    assert [
        f.line for f in alone if f.code == "XLA520" and "moving one to the device" in f.message
    ] == []  # one module shows nothing


def test_a_sparse_adjacency_from_a_star_imported_loader_is_not_moved_as_it_is(tmp_path):
    """GCNII's layout: `from utils import *`, then `adj, features = load_graph()` and `adj = adj.to(device)`. A
    star-imported name has no qualified name in libcst: the rule looked for a local `def` only and said nothing,
    and the migrated program died at the move (`SparseXLA` has no kernels)."""
    (tmp_path / "utils.py").write_text(
        "import numpy as np\nimport scipy.sparse as sp\nimport torch\n\n"
        "def as_torch(m):\n    m = m.tocoo()\n    index = torch.from_numpy(np.vstack((m.row, m.col)).astype(np.int64))\n"
        "    return torch.sparse.FloatTensor(index, torch.from_numpy(m.data), torch.Size(m.shape))\n\n"
        "def load_graph():\n    adj = sp.eye(4)\n    features = torch.ones(4, 3)\n    adj = as_torch(adj)\n"
        "    return adj, features\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nfrom utils import *\n\n"
        "adj, features = load_graph()\ndevice = torch.device('cuda:0')\n"
        "features = features.to(device)\nadj = adj.to(device)\n"
    )
    project = summarize_project(tmp_path, python_files(tmp_path))
    assert ("utils.load_graph", 0) in project.sparse_returns
    found = lint_file(tmp_path / "train.py", display="train.py", project=project).findings
    assert [f.line for f in found if f.code == "XLA520" and "moving one to the device" in f.message] == [7]


def test_a_cuda_flag_that_other_modules_star_import_is_not_an_unread_flag(tmp_path):
    """lstm-crf-pytorch's layout: parameters.py sets `CUDA = torch.cuda.is_available()` and never reads it; four
    modules read it through `from parameters import *`. The flag is not flipped (a legacy CUDA type depends on
    it), and it was taken for a flag nobody reads: no finding, and the migrated program silently took its CPU
    path."""
    (tmp_path / "parameters.py").write_text("import torch\n\nCUDA = torch.cuda.is_available()\nHIDDEN = 8\n")
    (tmp_path / "utils.py").write_text(
        "from parameters import *\n\nTensor = torch.cuda.FloatTensor if CUDA else torch.FloatTensor\n"
    )
    project = summarize_project(tmp_path, python_files(tmp_path))
    found = lint_file(tmp_path / "parameters.py", display="parameters.py", project=project).findings
    assert [f.line for f in found if f.code == "XLA203"] == [3], [(f.line, f.code) for f in found]
    alone = "import torch\n\nclass Run:\n    def __init__(self):\n        self.use_cuda = torch.cuda.is_available()\n"
    assert not [f for f in lint_source(alone) if f.code == "XLA203"]  # an attribute nobody reads stays quiet


def test_a_script_that_names_nothing_sparse_still_gets_the_sparse_rule(tmp_path):
    """pygcn's train.py never spells `sparse`: the rule runs there because it names the tree's sparse loader."""
    src = PROJECTS / "graph_sparse_adjacency" / "input"
    (tmp_path / "graphs.py").write_text((src / "graphs.py").read_text())
    plain = (
        (src / "train.py").read_text().replace("torch.spmm(adjacency, x @ self.weight)", "adjacency @ x @ self.weight")
    )
    assert "sparse" not in plain.lower() and "spmm" not in plain
    (tmp_path / "train.py").write_text(plain)
    project = summarize_project(tmp_path, python_files(tmp_path))
    found = lint_file(tmp_path / "train.py", display="train.py", project=project).findings
    assert [f.line for f in found if f.code == "XLA520"] == [22]


STAR_TRAIN = (
    "from common import *\n\n"
    "model = nn.Linear(HIDDEN, 2)\n"
    "opt = optim.AdamW(model.parameters(), lr=0.1, fused=True)\n"
    "loss = F.binary_cross_entropy(torch.sigmoid(model(x)), y)\n"
)


def star_findings(tmp_path: Path, files: dict[str, str]) -> set[tuple[int, str]]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    project = summarize_project(tmp_path, python_files(tmp_path))
    found = lint_file(tmp_path / "train.py", display="train.py", project=project).findings
    return {(f.line, f.code) for f in found if f.code in {"XLA217", "XLA505"}}


def test_torch_modules_that_a_star_import_gives_are_torch(tmp_path):
    """cbd830d made a star-imported `torch` torch; the idiom is wider: common.py does `import torch.nn as nn`,
    `import torch.nn.functional as F`, `from torch import optim`, and every script does `from common import *`.
    There `optim.AdamW(..., fused=True)` (XLA217) and `F.binary_cross_entropy(torch.sigmoid(...))` (XLA505) had
    no finding: `optim` and `F` resolved to nothing."""
    common = (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nfrom torch import optim\n\nHIDDEN = 8\n"
    )
    assert star_findings(tmp_path, {"common.py": common, "train.py": STAR_TRAIN}) == {(4, "XLA217"), (5, "XLA505")}


def test_torch_modules_reach_through_a_chain_of_star_imports(tmp_path):
    files = {
        "base.py": "import torch\nfrom torch.nn import functional as F\nimport torch.optim as optim\nimport torch.nn as nn\n",
        "common.py": "from base import *\n\nHIDDEN = 8\n",
        "train.py": STAR_TRAIN,
    }
    assert star_findings(tmp_path, files) == {(4, "XLA217"), (5, "XLA505")}


@pytest.mark.parametrize(
    ("common", "train"),
    [
        # the module binds the name itself
        (
            "import torch\nimport torch.nn.functional as F\nfrom torch import optim\n",
            "F = Functions()\noptim = Opt()\n",
        ),
        # the star-imported module binds it some other way too
        ("import torch\nimport torch.nn.functional as F\nfrom torch import optim\nF = Functions()\noptim = 1\n", ""),
        # ... or not by a torch import at all
        ("import torch\nimport mylib.functional as F\nfrom mylib import optim\n", ""),
        # its `__all__` does not give them
        ("import torch\nimport torch.nn.functional as F\nfrom torch import optim\n__all__ = ['torch']\n", ""),
        # another star import, from outside the tree, could bind them
        ("import torch\nimport torch.nn.functional as F\nfrom torch import optim\n", "from mylib import *\n"),
    ],
)
def test_a_star_imported_name_is_torch_only_where_nothing_else_can_bind_it(tmp_path, common, train):
    train = STAR_TRAIN.replace("from common import *\n", "from common import *\n" + train)
    assert star_findings(tmp_path, {"common.py": common + "nn = None\nHIDDEN = 8\n", "train.py": train}) == set()
