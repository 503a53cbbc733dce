"""The shared per-module analysis: one definition of a training step / step loop, used by every rule."""

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider
from xlaport.kb import lint_source
from xlaport.kb.analysis import steps
from xlaport.kb.cst_walk import LAYOUT, parent_map
from xlaport.kb.engine import run_rules
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
    rule = _Probe()
    run_rules(module, [rule])
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


def test_parent_map_is_libcsts_parent_provider_in_the_same_order():
    source = (
        "@torch.no_grad()\n"
        "async def f(a: int = (1), *b, c=lambda x: x if x else -x, **d) -> 'T':\n"
        "    x = [i for i in range(3) if i]; y = {k: v for k, v in d.items()}\n"
        "    with open('f') as h, g() as (p, q):\n"
        "        async for z in h:\n"
        "            print(f'{z!r:>{a}}', *b, sep=(''), **d)  # comment\n"
        "    match x:\n"
        "        case [1, *rest] | {'k': _} if rest:\n"
        "            pass\n"
        "    return (yield from x[1:2, ...])\n"
    )
    module = cst.parse_module(source)
    libcsts = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    expected = [(child, parent) for child, parent in libcsts.items() if not isinstance(child, LAYOUT)]
    assert list(parent_map(module).items()) == expected
    assert len(expected) < len(libcsts) / 2  # whitespace, commas, brackets and operators are not walked
