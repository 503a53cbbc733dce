"""Weight tying on the XLA device: kb XLA314's rewrite keeps the tie; the check and the tests see a lost one."""

import pytest
import torch
from xlaport.eval.check import run_check
from xlaport.eval.testgen import DifferentialResult
from xlaport.eval.tied_weights import lost_groups, shared_groups
from xlaport.kb import all_rules, fix_source

TIED_MODEL = """
import torch
import torch.nn as nn
import torch_xla


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))


model = LM().to(torch_xla.device())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    loss = model(torch.arange(8, device=torch_xla.device())).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()
print("parameters", len(list(model.parameters())))
"""

XLA314 = [r for r in all_rules() if r.code == "XLA314"]


def test_shared_groups_and_what_a_move_loses():
    model = torch.nn.Module()
    model.a, model.b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    model.a.weight = model.b.weight
    groups = shared_groups(model)
    assert groups == [["a.weight", "b.weight"]]
    assert lost_groups(groups, model) == []
    model.a.weight = torch.nn.Parameter(model.b.weight.detach().clone())
    assert lost_groups(groups, model) == [["a.weight", "b.weight"]]


def test_rewritten_module_keeps_its_tie_on_the_xla_device():
    import torch_xla

    fixed = fix_source(XLA314[0].before, rules=XLA314).fixed
    namespace: dict = {}
    exec(compile(fixed, "<fixed>", "exec"), namespace)
    model = namespace["LM"](16, 8).to(torch_xla.device())
    assert model.embed.weight is model.head.weight
    assert len(list(model.parameters())) == 1
    untied: dict = {}
    exec(compile(XLA314[0].before, "<before>", "exec"), untied)
    moved = untied["LM"](16, 8).to(torch_xla.device())
    assert moved.embed.weight is not moved.head.weight  # the torch_xla behaviour the rule exists for


@pytest.mark.slow
def test_check_reports_the_lost_tie_and_not_after_the_fix(tmp_path):
    script = tmp_path / "tied.py"
    script.write_text(TIED_MODEL)
    report = run_check(script, timeout_s=300, reveal=True)
    assert report.level == "L0"
    assert any("tied weights lost" in r and "embed.weight = head.weight" in r for r in report.reasons), report.reasons
    script.write_text(fix_source(TIED_MODEL, rules=XLA314).fixed)
    fixed = run_check(script, timeout_s=300, reveal=True)
    assert fixed.lost_ties == [] and "parameters 1" in fixed.stdout_tail


def test_differential_result_says_parameter_sharing_differs():
    grad = torch.ones(2)
    result = DifferentialResult(
        "LM",
        {"outputs": {}, "grads": {"grad[embed.weight]": grad}, "sharing": [["embed.weight", "head.weight"]]},
        {"outputs": {}, "grads": {"grad[embed.weight]": grad, "grad[head.weight]": grad}, "sharing": []},
    )
    problems = result.mismatches()
    assert problems[0].startswith("parameter sharing differs (tied weights?)")
    assert "embed.weight = head.weight" in problems[0]
    assert any("grad[head.weight]: only the migrated code produced it" in p and "tied weights?" in p for p in problems)


@pytest.mark.slow
def test_check_accepts_a_tie_the_program_restores_right_after_the_move(tmp_path):
    """The tie is judged at the next placement check (optimizer, first step, exit), not inside `.to()`:
    `model.to(device); model.head.weight = model.embed.weight` is the manual form of XLA314's fix."""
    script = tmp_path / "retied.py"
    script.write_text(
        TIED_MODEL.replace(
            "model = LM().to(torch_xla.device())\n",
            "model = LM()\nmodel.to(torch_xla.device())\nmodel.head.weight = model.embed.weight\n",
        )
    )
    report = run_check(script, timeout_s=300, reveal=True)
    assert report.lost_ties == [] and report.level == "L2", report.reasons
    assert "parameters 1" in report.stdout_tail


CONDITIONAL_TIE = """
import torch
import torch.nn as nn
import torch_xla


class Settings:
    share_embeddings = SHARE


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(12, 6)
        self.out = nn.Linear(6, 12, bias=False)


def build(settings):
    net = Decoder()
    if settings.share_embeddings: net.out.weight = net.tokens.weight
    net = net.to(torch_xla.device())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    return net, optimizer


net, optimizer = build(Settings())
"""


@pytest.mark.parametrize("share", [True, False])
def test_a_conditional_tie_outside_a_class_is_made_again_under_its_condition(share):
    """`if cfg.flag: net.a.weight = net.b.weight` then `net.to(device)` in a function: the fix ties again after
    the move under the same condition (an untied configuration stays untied), and a second pass adds nothing."""
    source = CONDITIONAL_TIE.replace("SHARE", str(share))
    fixed = fix_source(source, rules=XLA314).fixed
    assert fix_source(fixed, rules=XLA314).fixed == fixed
    namespace: dict = {}
    exec(compile(fixed, "<fixed>", "exec"), namespace)
    net = namespace["net"]
    assert (net.out.weight is net.tokens.weight) is share
    assert len(list(net.parameters())) == (1 if share else 2)
    untouched: dict = {}
    exec(compile(source, "<before>", "exec"), untouched)
    assert untouched["net"].out.weight is not untouched["net"].tokens.weight  # what the move did before the fix
