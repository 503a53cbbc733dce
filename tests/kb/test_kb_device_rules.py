"""C2/C3 rules beyond their own examples: layouts of the optimizer-before-move bug, files that launch
processes, and rewrites executed for real on torch_xla (PJRT_DEVICE=CPU)."""

from __future__ import annotations

import textwrap

import pytest
from xlaport.kb import fix_source, lint_source
from xlaport.kb.registry import get_rule


def lines(source: str, code: str) -> list[int]:
    return [f.line for f in lint_source(source, rules=[get_rule(code)])]


def fixed(source: str, *codes: str) -> str:
    return fix_source(source, rules=[get_rule(c) for c in codes], unsafe=True).fixed


# --- XLA215: optimizer built before the model moves ---------------------------------------
def test_optimizer_before_move_in_a_loop_body_is_reordered():
    src = textwrap.dedent(
        """\
        import torch
        for cfg in configs:
            model = Net(cfg)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model.to(dev)
            run(model, opt)
        """
    )
    assert lines(src, "XLA215") == [4]
    out = fixed(src, "XLA215")
    assert out.index("model.to(dev)") < out.index("opt = torch.optim.SGD")
    assert lines(out, "XLA215") == []


def test_optimizer_chosen_in_if_else_moves_the_model_before_the_whole_if():
    src = textwrap.dedent(
        """\
        import torch
        def main(cfg):
            model = Net()
            if cfg.sgd:
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
            else:
                opt = torch.optim.Adam(model.parameters())
            model = model.to(cfg.device)
            return opt
        """
    )
    assert lines(src, "XLA215") == [5, 7]
    out = fixed(src, "XLA215")
    assert out.index("model = model.to(cfg.device)") < out.index("if cfg.sgd:")
    assert lines(out, "XLA215") == []


def test_model_built_with_its_optimizer_in_an_if_is_moved_where_it_is_built():
    # a fresh model and its optimizer, or both from a checkpoint; the move comes after the whole if
    src = textwrap.dedent(
        """\
        import torch
        device = torch.device("cuda")
        def main(checkpoint=None):
            if checkpoint is None:
                model = Net(blocks=2)
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
            else:
                state = torch.load(checkpoint)
                model, optimizer = state["model"], state["optimizer"]
            model = model.to(device)
            return model, optimizer
        """
    )
    assert lines(src, "XLA215") == [6]
    out = fixed(src, "XLA215")
    branch = out[out.index("model = Net(blocks=2)") : out.index("else:")]
    assert branch.index("model = model.to(device)") < branch.index("optimizer = torch.optim.Adam")
    assert out.count("model = model.to(device)") == 2 and lines(out, "XLA215") == []
    # the device assigned between the if and the move: the copy would move it elsewhere, so it is reported only
    rebound = src.replace("    model = model.to(device)", "    device = pick()\n    model = model.to(device)")
    assert lines(rebound, "XLA215") == [6] and fixed(rebound, "XLA215") == rebound


def test_two_optimizers_for_two_models_are_both_fixed():
    src = "import torch\nG, D = Gen(), Disc()\nog = torch.optim.Adam(G.parameters())\nod = torch.optim.Adam(D.parameters())\nG.to(dev)\nD.to(dev)\n"
    out = fixed(src, "XLA215")
    assert out.index("G.to(dev)") < out.index("og =") and out.index("D.to(dev)") < out.index("od =")


@pytest.mark.parametrize(
    "src",
    [
        # the move reads a name defined after the optimizer
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\ndevice = get()\nmodel.to(device)\n",
        # the model object is replaced in between
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel = wrap(model)\nmodel.to(dev)\n",
        # the move is conditional, and the model is used in between
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.freeze()\n"
        "if gpu:\n    model.to(dev)\n",
        # the optimizer is a global that a function called in between may read
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nlog_setup()\n"
        "if gpu:\n    model.to(dev)\n",
        # what the optimizer uses is rebound before the move
        "import torch\ndef f(model, lr, dev):\n    opt = torch.optim.SGD(model.parameters(), lr=lr)\n"
        "    lr = 0\n    if dev:\n        model.to(dev)\n    return opt\n",
    ],
)
def test_optimizer_before_move_is_reported_but_not_rewritten_when_unclear(src):
    assert len(lines(src, "XLA215")) == 1
    assert fixed(src, "XLA215") == src


@pytest.mark.parametrize(
    ("src", "want"),
    [
        (  # the move is conditional: the optimizer and what uses it go after the `if`
            "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "sched = torch.optim.lr_scheduler.StepLR(opt, 1)\nif gpu:\n    model.to(dev)\n",
            "import torch\nmodel = Net()\nif gpu:\n    model.to(dev)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "sched = torch.optim.lr_scheduler.StepLR(opt, 1)\n",
        ),
        (  # the device is made in between, in a function
            "import torch\ndef f(model):\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    device = pick_device()\n    model.to(device)\n    return opt\n",
            "import torch\ndef f(model):\n    device = pick_device()\n    model.to(device)\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    return opt\n",
        ),
    ],
)
def test_optimizer_goes_after_a_move_that_cannot_go_up(src, want):
    assert fixed(src, "XLA215") == want
    assert lines(want, "XLA215") == []


@pytest.mark.parametrize(
    "src",
    [
        "import torch\nmodel = Net()\nmodel.to(dev)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.to(torch.float16)\n",
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.to('cpu')\n",
        "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\ndef later():\n    model.to(dev)\n",
        "import torch\ndef build(model):\n    return torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.to(dev)\n",
    ],
)
def test_optimizer_rule_ignores_safe_orders(src):
    assert lines(src, "XLA215") == []


# --- XLA211: device count next to a launcher -----------------------------------------------
def test_device_count_is_only_reported_in_files_that_launch_processes():
    src = "import torch\nimport torch.multiprocessing as mp\nws = torch.cuda.device_count()\nmp.spawn(f, nprocs=ws)\n"
    found = lint_source(src, rules=[get_rule("XLA211")])
    assert [(f.line, f.fixable) for f in found] == [(3, False)]
    assert "xr.world_size()" in found[0].message


# --- XLA206/XLA207/XLA306: one XLA seed per block ------------------------------------------
def test_cpu_and_cuda_seeds_in_one_block_give_a_single_xla_seed():
    src = "import torch\nfrom transformers import set_seed\ndef s(x):\n    set_seed(x)\n    torch.manual_seed(x)\n    torch.cuda.manual_seed(x)\n    torch.cuda.manual_seed_all(x)\n"
    out = fix_source(src, unsafe=True).fixed
    assert out.count("torch_xla.manual_seed(x)") == 1
    assert "torch.cuda" not in out


# --- real torch_xla runs of the rewrites ------------------------------------------------------
def run(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<snippet>", "exec"), namespace)  # our own snippets, not user code
    return namespace


STALE_OPTIMIZER = textwrap.dedent(
    """\
    import torch
    import torch_xla


    def train(steps):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.to(torch_xla.device())
        x = torch.randn(16, 4).to(torch_xla.device())
        start = model.weight.detach().cpu().clone()
        for _ in range(steps):
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
            torch_xla.sync()
        return start, model.weight.detach().cpu()
    """
)


@pytest.mark.slow
def test_optimizer_before_move_trains_nothing_until_fixed():
    start, end = run(STALE_OPTIMIZER)["train"](3)
    assert start.equal(end), "the stale optimizer should leave the XLA weights untouched"
    start, end = run(fixed(STALE_OPTIMIZER, "XLA215"))["train"](3)
    assert not start.equal(end), "after the fix the model must learn"


WRAPPED_MOVE = textwrap.dedent(
    """\
    import copy

    import torch
    import torch_xla


    class Trainer(torch.nn.Module):
        def __init__(self, model, scale):
            super().__init__()
            self.model = model
            self.scale = scale

        def forward(self, x):
            return self.model(x).pow(2).mean() * self.scale


    def train(steps):
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        ema = copy.deepcopy(net)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: 1.0)
        trainer = Trainer(net, 2.0).to(torch_xla.device())
        x = torch.randn(16, 4).to(torch_xla.device())
        start = net.weight.detach().cpu().clone()
        for _ in range(steps):
            optimizer.zero_grad()
            trainer(x).backward()
            optimizer.step()
            sched.step()
            torch_xla.sync()
        return start, net.weight.detach().cpu()
    """
)


def test_optimizer_before_a_wrapper_that_moves_the_model_is_reordered():
    """pytorch-ddpm's layout: the optimizer is built on `net_model.parameters()`, then `trainer =
    GaussianDiffusionTrainer(net_model, ...).to(device)` moves the model as the wrapper's submodule. On XLA that
    makes new Parameters: the optimizer kept the CPU ones (check: 145 of 145 parameters not the model's), and no
    finding said so."""
    assert lines(WRAPPED_MOVE, "XLA215") == [21]
    out = fixed(WRAPPED_MOVE, "XLA215")
    order = [line.strip().split(" =")[0] for line in out.splitlines() if " = " in line and line.startswith("    ")]
    assert order.index("trainer") < order.index("optimizer") < order.index("sched"), out
    assert (
        lines(
            "import torch\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\nx = Batch(net).to(torch.float16)\n",
            "XLA215",
        )
        == []
    )


@pytest.mark.slow
def test_optimizer_before_a_wrapper_that_moves_the_model_trains_once_fixed():
    start, end = run(WRAPPED_MOVE)["train"](3)
    assert start.equal(end), "the stale optimizer leaves the XLA weights untouched"
    start, end = run(fixed(WRAPPED_MOVE, "XLA215"))["train"](3)
    assert not start.equal(end), "after the fix the model learns"


CAPTURED_PARAMETERS = textwrap.dedent(
    """\
    import torch
    import torch_xla


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 1)
            self.body_params = list(self.body.parameters())
            self.head_params = list(self.head.parameters())

        def forward(self, x):
            return self.head(torch.relu(self.body(x)))


    def train(steps):
        torch.manual_seed(0)
        model = Net().to(torch_xla.device())
        groups = [{"params": model.body_params, "weight_decay": 0.01}, {"params": model.head_params}]
        optimizer = torch.optim.SGD(groups, lr=0.1)
        x = torch.randn(16, 4).to(torch_xla.device())
        start = model.head.weight.detach().cpu().clone()
        for _ in range(steps):
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
            torch_xla.sync()
        return start, model.head.weight.detach().cpu()
    """
)


@pytest.mark.slow
def test_a_parameter_list_kept_at_construction_trains_once_it_is_a_property():
    """GCNII's param groups (`self.params1 = list(self.convs.parameters())`, then `Adam([{'params':
    model.params1, ...}])` after `.to(device)`): on XLA the lists held the CPU parameters the move replaced."""
    start, end = run(CAPTURED_PARAMETERS)["train"](3)
    assert start.equal(end), "the kept list leaves the XLA weights untouched"
    start, end = run(fixed(CAPTURED_PARAMETERS, "XLA316"))["train"](3)
    assert not start.equal(end), "after the fix the model learns"


SEEDED_RANDOM = textwrap.dedent(
    """\
    import torch
    import torch_xla


    def draw():
        torch.manual_seed(7)
        return torch.rand(4, device=torch_xla.device()).cpu()
    """
)


@pytest.mark.slow
def test_xla_seed_added_after_torch_manual_seed_makes_device_rng_reproducible():
    draw = run(fixed(SEEDED_RANDOM, "XLA206"))["draw"]
    assert draw().equal(draw())
    plain = run(SEEDED_RANDOM)["draw"]
    assert not plain().equal(plain()), "torch.manual_seed alone does not seed the XLA generator"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("code", "snippet", "error"),
    [
        (
            "XLA217",
            "opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)\nopt.step()\ntorch_xla.sync()\n",
            "fused=True",
        ),
        (
            "XLA218",
            "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)\ntorch_xla.sync()\n",
            "foreach",
        ),
    ],
)
def test_rewrite_turns_an_xla_error_into_a_working_call(code, snippet, error):
    prelude = (
        "import torch\nimport torch_xla\n"
        "model = torch.nn.Linear(3, 2).to(torch_xla.device())\n"
        "model(torch.ones(1, 3, device=torch_xla.device())).sum().backward()\n"
    )
    with pytest.raises(RuntimeError, match=error):
        run(prelude + snippet)
    run(fixed(prelude + snippet, code))


@pytest.mark.slow
def test_save_pretrained_rewrite_saves_an_xla_model(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    src = textwrap.dedent(
        """\
        import torch_xla
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(config).to(torch_xla.device())
        model.save_pretrained(OUT)
        """
    ).replace("OUT", repr(str(tmp_path / "plain")))
    with pytest.raises(RuntimeError, match="invalid python storage"):
        run(src)
    out = fixed(src, "XLA308").replace(repr(str(tmp_path / "plain")), repr(str(tmp_path / "fixed")))
    model = run(out)["model"]
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "fixed")
    assert isinstance(reloaded.config, GPT2Config)
    for name, tensor in reloaded.state_dict().items():
        assert tensor.equal(model.state_dict()[name].cpu()), name


# --- XLA211: the world size counted before a launch moves into the launched function -------------
LAUNCHED_WITH_COUNT = textwrap.dedent(
    '''\
    import torch
    import torch_xla


    def worker(index, n_procs, steps):
        """One replica."""
        # set up
        print(index, n_procs, steps)


    if __name__ == "__main__":
        n_procs = torch.cuda.device_count()
        torch_xla.launch(worker, args=(n_procs, 5))
    '''
)


def test_world_size_counted_before_the_launch_is_read_inside_the_launched_function():
    out = fixed(LAUNCHED_WITH_COUNT, "XLA211")
    assert "def worker(index, steps):" in out
    assert '"""One replica."""\n    n_procs = xr.world_size()\n    # set up\n' in out
    assert "torch_xla.launch(worker, args=(5,))" in out
    assert "device_count" not in out and "import torch_xla.runtime as xr" in out
    assert lines(out, "XLA211") == []


@pytest.mark.parametrize(
    "change",
    [
        ("print(index, n_procs, steps)", "print(index, n_procs, steps)\n\n\nworker(0, 1, 1)"),  # called elsewhere
        ("    torch_xla.launch", "    print(n_procs)\n    torch_xla.launch"),  # the parent uses the count too
        ("def worker(index, n_procs, steps)", "def worker(index, world, steps)"),  # another name inside
    ],
)
def test_world_size_count_is_only_reported_when_the_move_is_unclear(change):
    src = LAUNCHED_WITH_COUNT.replace(*change)
    assert len(lines(src, "XLA211")) == 1
    assert fixed(src, "XLA211") == src


# --- XLA315: the optimizer built before a called function moves the model -------------------------
def test_model_built_with_its_optimizer_in_a_helper_is_moved_before_the_optimizer():
    src = textwrap.dedent(
        """\
        import torch
        import torch_xla

        class Fit:
            def __init__(self, net, opt):
                self.net = net.to(torch_xla.device())
                self.opt = opt

        def parts():
            net = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            return net, opt

        def go():
            net, opt = parts()
            Fit(net, opt)
        """
    )
    assert lines(src, "XLA315") == [11]
    out = fixed(src, "XLA315")
    assert "net = torch.nn.Linear(2, 2)\n    net.to(torch_xla.device())\n    opt = torch.optim.SGD" in out
    assert lines(out, "XLA315") == []


VIN_LIKE = textwrap.dedent(
    """\
    import torch
    import torch_xla


    def train(net, loader, optimizer):
        device = torch_xla.device()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            net = net.to(device)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()


    net = torch.nn.Linear(4, 3)
    optimizer = torch.optim.RMSprop(net.parameters(), lr=0.005)
    train(net, [], optimizer)
    """
)


def test_a_model_moved_in_the_training_loop_of_the_called_function_is_moved_before_the_optimizer():
    # the move sits in the loop, to a device the function assigns once from torch_xla.device() (the migration's
    # rewrite of `torch.device("cuda:0" if torch.cuda.is_available() else "cpu")`): it runs whenever train runs
    assert lines(VIN_LIKE, "XLA315") == [16]
    out = fixed(VIN_LIKE, "XLA315")
    assert "net = torch.nn.Linear(4, 3)\nnet.to(torch_xla.device())\noptimizer = torch.optim.RMSprop" in out
    assert lines(out, "XLA315") == []
    # a device the function takes from its caller, or a move under an `if`: reported, not rewritten
    for change in [
        (
            "def train(net, loader, optimizer):\n    device = torch_xla.device()",
            "def train(net, loader, optimizer, device):",
        ),
        ("        net = net.to(device)", "        if x.shape[0] > 1:\n            net = net.to(device)"),
    ]:
        unclear = VIN_LIKE.replace(*change)
        assert [f.fix for f in lint_source(unclear, rules=[get_rule("XLA315")])] == ["manual"], change
        assert fixed(unclear, "XLA315") == unclear


@pytest.mark.parametrize(
    "change",
    [
        # the helper looks at the model after building the optimizer
        ("    return net, opt", "    print(net.weight.sum())\n    return net, opt"),
        # the callee moves to a device it was given: any device the user configures
        ("net.to(torch_xla.device())", "net.to(self.where)"),
        # the move is conditional
        ("        self.net = net.to(torch_xla.device())", "        if opt:\n            net.to(torch_xla.device())"),
    ],
)
def test_callee_move_is_reported_manual_when_unclear(change):
    src = textwrap.dedent(
        """\
        import torch
        import torch_xla

        class Fit:
            def __init__(self, net, opt):
                self.net = net.to(torch_xla.device())
                self.opt = opt

        def parts():
            net = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            return net, opt

        def go():
            net, opt = parts()
            Fit(net, opt)
        """
    ).replace(*change)
    found = lint_source(src, rules=[get_rule("XLA315")])
    assert [f.fixable for f in found] == [False] and found[0].fix == "manual"
    assert fixed(src, "XLA315") == src


STALE_ACROSS_FUNCTIONS = textwrap.dedent(
    """\
    import torch
    import torch_xla


    class Loop:
        def __init__(self, net, opt, rank: int):
            self.net = net.to(rank)
            self.opt = opt

        def run(self, steps):
            x = torch.randn(8, 4).to(torch_xla.device())
            for _ in range(steps):
                self.opt.zero_grad()
                self.net(x).pow(2).mean().backward()
                self.opt.step()
                torch_xla.sync()


    def parts():
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        return net, opt


    def train(steps):
        net, opt = parts()
        loop = Loop(net, opt, 0)
        start = loop.net.weight.detach().cpu().clone()
        loop.run(steps)
        return start, loop.net.weight.detach().cpu()
    """
)


@pytest.mark.slow
def test_optimizer_built_by_the_caller_trains_once_fixed():
    migrated = fix_source(STALE_ACROSS_FUNCTIONS).fixed  # default fixes only
    assert "net.to(torch_xla.device())\n    opt = torch.optim.SGD" in migrated
    start, end = run(migrated.replace("net.to(torch_xla.device())\n    opt", "opt"))["train"](3)
    assert start.equal(end), "without the early move the optimizer holds stale CPU parameters"
    start, end = run(migrated)["train"](3)
    assert not start.equal(end), "after the fix the model must learn"


# --- XLA202: a device string handed to the program's own code stays a string -------------------------------
def test_cuda_string_given_to_own_function_becomes_the_xla_string_and_torch_calls_get_the_device():
    src = "import torch\ndef run(device):\n    return 'cuda' in device\nrun(device='cuda')\nx = torch.zeros(2, device='cuda')\n"
    out = fixed(src, "XLA202")
    assert "run(device='xla')" in out  # `'cuda' in device` would raise on a torch.device object
    assert "torch.zeros(2, device=torch_xla.device())" in out


def test_optimizer_chosen_in_a_branch_of_the_helper_gets_one_move_above_the_branch():
    src = textwrap.dedent(
        """\
        import torch
        import torch_xla

        class Fit:
            def __init__(self, net, opt):
                self.net = net.to(torch_xla.device())

        def parts(sgd):
            net = torch.nn.Linear(2, 2)
            if sgd:
                opt = torch.optim.SGD(net.parameters(), lr=0.1)
            else:
                opt = torch.optim.Adam(net.parameters())
            return net, opt

        def go():
            net, opt = parts(True)
            Fit(net, opt)
        """
    )
    out = fixed(src, "XLA315")
    assert "net = torch.nn.Linear(2, 2)\n    net.to(torch_xla.device())\n    if sgd:" in out
    assert out.count("\n    net.to(torch_xla.device())\n") == 1 and lines(out, "XLA315") == []


def test_a_legacy_type_alias_bound_twice_is_reported_not_silent():
    # `Tensor` is also imported: the alias is not rewritten, and XLA220 leaves alias values to XLA232,
    # so XLA232 must report the binding for a human (before: no finding at all)
    source = "import torch\nfrom torch import Tensor\nTensor = torch.cuda.FloatTensor\nx = Tensor(3)\n"
    findings = [(f.line, f.code, f.fix) for f in lint_source(source)]
    assert (3, "XLA232", "manual") in findings


def test_torch_reached_only_through_a_star_import_is_still_torch():
    """lstm-crf's utils.py: `from parameters import *` (where parameters.py does `import torch`) is its only
    source of `torch`; every rule that resolves names saw no torch there, so its legacy CUDA type aliases and
    `.cuda()`-free CUDA calls had no finding at all, and the migrated program died with `Found no NVIDIA driver`."""
    source = (
        "from parameters import *\n\nTensor = torch.cuda.FloatTensor if CUDA else torch.FloatTensor\nx = Tensor(3)\n"
    )
    found = [(f.line, f.code) for f in lint_source(source)]
    assert (4, "XLA232") in found, found
    seeded = "from common import *\ntorch.cuda.manual_seed(0)\n"
    assert lines(seeded, "XLA207") == [2]
    # a module that binds `torch` itself is read as it is
    own = "from common import *\ntorch = None\nTensor = torch.cuda.FloatTensor\n"
    assert not [f for f in lint_source(own) if f.code == "XLA232"]


def test_a_legacy_type_alias_no_code_of_its_module_uses_is_left_for_a_human():
    """A module-level alias with no use in its own module is there for other modules (`from utils import *`, then
    `LongTensor(rows)` elsewhere): binding the CPU type there, with no `.to(device)` at the uses it cannot see,
    would build those tensors on the host while the model is on XLA."""
    source = "import torch\nCUDA = torch.cuda.is_available()\nLongTensor = torch.cuda.LongTensor if CUDA else torch.LongTensor\n"
    assert [(f.line, f.fix) for f in lint_source(source) if f.code == "XLA232"] == [(3, "manual")]
    assert "torch.cuda.LongTensor" in fix_source(source).fixed


# --- XLA203: a "needs a GPU" stop (issue #24: a --cuda flag's check raised on every TPU host) ------------------
def test_a_stop_for_hosts_without_cuda_goes_like_the_assert():
    src = textwrap.dedent(
        """\
        import sys
        import torch
        if flags.gpu and not torch.cuda.is_available():
            raise RuntimeError("asked for --gpu but there is none")
        if not torch.cuda.is_available():
            print("this trainer needs an accelerator")
            sys.exit(2)
        torch.manual_seed(0)
        """
    )
    assert lines(src, "XLA203") == [3, 5]
    out = fixed(src, "XLA203")
    assert "is_available" not in out and "raise" not in out and "exit" not in out
    assert out.rstrip().endswith("torch.manual_seed(0)")


def test_a_cuda_check_that_does_more_than_stop_stays_for_a_human():
    src = textwrap.dedent(
        """\
        import torch
        if not torch.cuda.is_available() or flags.strict:
            raise RuntimeError("no GPU")
        if not torch.cuda.is_available():
            batch = 8
            raise RuntimeError("no GPU")
        if not torch.cuda.is_available():
            raise RuntimeError("no GPU")
        else:
            batch = 64
        """
    )
    assert lines(src, "XLA203") == [2, 4, 7]
    assert fixed(src, "XLA203") == src


# --- XLA713: TensorBoard's add_graph on an XLA model (issue #24: a CIFAR trainer died before its first step) ---
GRAPH_LOGGING = textwrap.dedent(
    """\
    import torch
    from torch.utils.tensorboard import SummaryWriter

    def log_graph(writer, net, x):
        # once, before training
        writer.add_graph(net, x)
    """
)


def test_add_graph_is_called_without_autograd():
    assert lines(GRAPH_LOGGING, "XLA713") == [6]
    out = fixed(GRAPH_LOGGING, "XLA713")
    assert "    # once, before training\n    with torch.no_grad():\n        writer.add_graph(net, x)\n" in out
    assert lines(out, "XLA713") == []
    without_tensorboard = GRAPH_LOGGING.replace("from torch.utils.tensorboard import SummaryWriter\n", "")
    assert lines(without_tensorboard, "XLA713") == []  # someone else's add_graph: no evidence it traces


@pytest.mark.slow
def test_tracing_a_batch_norm_model_on_xla_needs_no_grad():
    """What add_graph does inside (torch.jit.trace of one forward pass), on real torch_xla."""
    import torch
    import torch_xla

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).to(torch_xla.device())
    x = torch.randn(1, 3, 8, 8).to(torch_xla.device())
    with pytest.raises(RuntimeError, match="requires grad as a constant"):
        torch.jit.trace(net, x)
    with torch.no_grad():
        traced = torch.jit.trace(net, x)
    assert "batch_norm" in str(traced.inlined_graph)
