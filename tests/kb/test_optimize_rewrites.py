"""The optimization families (kb/optimize/): what each rewrites, what it leaves alone, and that the rewritten
program prints and returns the same as the original. Execution here uses a stand-in for torch_xla whose step
closures run at the barrier, as torch_xla's do (the programs' real XLA runs are in tests/test_optimize.py)."""

from __future__ import annotations

import contextlib
import io
import sys
import types

import pytest
from xlaport.kb.optimize import families, fixed_generation, logging_reads


class Scalar:
    """A tensor stand-in: `.item()` and `.detach()` as torch's, and every read is counted."""

    reads = 0

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        Scalar.reads += 1
        return self.value

    def detach(self):
        return self

    def __radd__(self, other):
        return Scalar((other.value if isinstance(other, Scalar) else other) + self.value)

    __add__ = __radd__

    def __truediv__(self, n):
        return Scalar(self.value / n)

    def __format__(self, spec):
        return format(self.item(), spec)


@pytest.fixture
def fake_xla(monkeypatch):
    """torch_xla with a barrier that runs the step closures queued since the last one."""
    queued = []
    xla = types.ModuleType("torch_xla")
    core = types.ModuleType("torch_xla.core")
    xm = types.ModuleType("torch_xla.core.xla_model")
    xm.add_step_closure = queued.append

    def barrier():
        while queued:
            queued.pop(0)()

    xm.mark_step = xla.sync = barrier
    xla.core, core.xla_model = core, xm
    for name, module in (("torch_xla", xla), ("torch_xla.core", core), ("torch_xla.core.xla_model", xm)):
        monkeypatch.setitem(sys.modules, name, module)
    return queued


def run(source: str) -> tuple[str, dict]:
    out = io.StringIO()
    namespace = {"Scalar": Scalar}
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<program>", "exec"), namespace)
    return out.getvalue(), namespace


SCRIPT_LOOP = """
import torch_xla
running = -1.0
for step in range(6):
    loss = Scalar(step * 0.5)
    torch_xla.sync()
    if step % 2 == 0:
        lossf = loss.item() * 2
        running = lossf if running == -1.0 else 0.5 * running + 0.5 * lossf
        print(f"step {step}: loss {lossf:.3f} running {running:.3f}")
print("done", running)
"""


def test_logging_block_after_the_barrier_becomes_a_closure_with_the_same_output(fake_xla) -> None:
    rewrite = logging_reads.rewrite(SCRIPT_LOOP, "train.py", [8])
    assert rewrite is not None and rewrite.lines == [8]
    assert "xm.add_step_closure(_log_step_8)" in rewrite.text
    assert "global running" in rewrite.text  # assigned in the block, used after the loop
    assert "step=step" in rewrite.text and "loss=loss" in rewrite.text  # bound when the step registers it
    assert "xm.mark_step()" in rewrite.text  # the barrier came first: the last step's closure runs after the loop
    before, _ = run(SCRIPT_LOOP)
    after, _ = run(rewrite.text)
    assert after == before
    assert "done 8.500" not in before and before.splitlines()[-1] == after.splitlines()[-1]


FUNCTION_LOOP = """
import torch_xla

def train(steps):
    total = 0
    seen = []
    for step in range(steps):
        loss = Scalar(float(step))
        total += loss.item()
        seen.append(loss.item())
        print("loss", loss.item())
        torch_xla.sync()
    return total, seen

result = train(4)
"""


def test_accumulators_stay_on_the_device_and_calls_run_in_closures(fake_xla) -> None:
    rewrite = logging_reads.rewrite(FUNCTION_LOOP, "train.py")
    assert rewrite is not None and rewrite.lines == [9, 10, 11]
    assert "total += loss.detach()" in rewrite.text
    assert "xm.mark_step()" not in rewrite.text  # the barrier comes after the logging: same step
    before, ns_before = run(FUNCTION_LOOP)
    Scalar.reads = 0
    after, ns_after = run(rewrite.text)
    assert after == before
    total, seen = ns_after["result"]
    assert float(total.value) == ns_before["result"][0] and seen == ns_before["result"][1]


def test_a_windowed_sum_reset_by_deferred_logging_is_left_alone() -> None:
    source = """
import torch_xla
total = 0
for step in range(10):
    loss = Scalar(1.0)
    total = total + loss.item()
    torch_xla.sync()
    if step % 5 == 4:
        print(total / 5, loss.item())
        total = 0
"""
    rewrite, notes = logging_reads.plan(source, "train.py", [9])
    assert rewrite is None
    assert "one step later" in notes[0] and "total" in notes[0]


def test_logging_that_leaves_the_loop_or_steps_is_left_alone() -> None:
    source = """
for step in range(10):
    loss = model(x)
    if loss.item() > 5:
        break
    loss.backward()
    optimizer.step()
    print(optimizer.step(), loss.item())
"""
    rewrite, notes = logging_reads.plan(source, "train.py", [4, 8])
    assert rewrite is None
    assert len(notes) == 2


GENERATION = """
import torch
from torch import nn


class CausalMean(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 20)

    def forward(self, idx):
        h = self.embed(idx)
        counts = torch.arange(1, idx.size(1) + 1, dtype=h.dtype)[None, :, None]
        return self.head(torch.tanh(torch.cumsum(h, dim=1) / counts))


model = CausalMean()
idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
with torch.no_grad():
    for _ in range(7):
        logits = model(idx)
        logits = logits[:, -1, :]
        nxt = torch.argmax(logits, dim=-1, keepdim=True)
        idx = torch.cat((idx, nxt), dim=1)
print(idx.tolist())
"""


def test_growing_generation_becomes_a_fixed_buffer_with_the_same_greedy_tokens() -> None:
    rewrite, notes = fixed_generation.plan(GENERATION, "gen.py")
    assert rewrite is not None, notes
    assert "torch.nn.functional.pad(idx, (0, 7))" in rewrite.text
    assert "idx.index_copy(1, _pos, nxt)" in rewrite.text
    assert "logits.index_select(1, _pos - 1).squeeze(1)" in rewrite.text
    before, _ = run(GENERATION)
    after, _ = run(rewrite.text)
    assert after == before and len(eval(after)[0]) == 10


def test_cropped_or_measured_sequences_are_left_alone() -> None:
    cropped = GENERATION.replace("logits = model(idx)", "logits = model(idx[:, -4:])")
    measured = GENERATION.replace("nxt = torch.argmax", "print(idx.size(1))\n        nxt = torch.argmax")
    early = GENERATION.replace(
        "idx = torch.cat((idx, nxt), dim=1)",
        "idx = torch.cat((idx, nxt), dim=1)\n        if nxt.sum() == 0:\n            break",
    )
    for source in (cropped, measured, early):
        rewrite, notes = fixed_generation.plan(source, "gen.py")
        assert rewrite is None and notes and "left alone" in notes[0]


def test_bf16_family_is_the_kb_unsafe_fixes() -> None:
    source = (
        "import torch\nimport torch_xla\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "for x in data:\n"
        "    with torch.autocast('cuda', dtype=torch.float16):\n"
        "        loss = model(x)\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
        "    torch_xla.sync()\n"
    )
    rewrite, _ = families.plan("bf16_no_scaler", source, "train.py")
    assert rewrite is not None
    assert "GradScaler" not in rewrite.text and "bfloat16" in rewrite.text and "torch.float16" not in rewrite.text
    assert families.static_sites(source, "train.py")["bf16_no_scaler"]
