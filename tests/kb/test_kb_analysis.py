"""The shared per-module analysis: one definition of a training step / step loop, used by every rule."""

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider
from xlaport.kb import lint_source
from xlaport.kb.analysis import steps
from xlaport.kb.analysis.module import ModuleAnalysis
from xlaport.kb.rule import Rule


def codes(source: str) -> set[str]:
    return {f.code for f in lint_source(source)}


LOOP = "for x, y in loader:\n    out = model(x)\n    preds = out.detach().numpy()\n    print(loss.item())\n    {step}\n"


def test_scheduler_step_alone_is_no_training_step_for_any_rule():
    # was: XLA221 (own loop definition, any `.step()`) fired here while XLA401 did not
    found = codes(LOOP.format(step="scheduler.step()"))
    assert not found & {"XLA221", "XLA401"}


@pytest.mark.parametrize("step", ["optimizer.step()", "loss.backward()", "xm.optimizer_step(opt)", "torch_xla.sync()"])
def test_a_training_step_makes_both_rules_fire(step):
    assert {"XLA221", "XLA401"} <= codes(LOOP.format(step=step))


class _Probe(Rule):
    """Records what the step analysis says about each `probe()` call."""

    code, title, category, fix, detects, why, before = "XLA000", "probe", "C4", "manual", "", "", ""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bool, bool]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "probe":
            self.seen.append((steps.step_loop(self, node) is not None, steps.training_loop(self, node) is not None))


def probe(source: str) -> list[tuple[bool, bool]]:
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    rule = _Probe()
    rule.analysis = ModuleAnalysis.of(module, wrapper.resolve(ParentNodeProvider))
    wrapper.visit_batched([rule])
    return rule.seen


def test_step_loop_and_training_loop():
    source = (
        "for epoch in range(3):\n"
        "    probe()\n"  # epoch loop: a training loop, not a step loop
        "    for x in loader:\n"
        "        probe()\n"  # the step loop
        "        loss.backward()\n"
        "        def log():\n"
        "            probe()\n"  # a function defined in the loop runs elsewhere
        "for x in loader:\n"
        "    probe()\n"
        "    scheduler.step()\n"  # not a training step
    )
    assert probe(source) == [(False, True), (True, True), (False, False), (False, False)]
