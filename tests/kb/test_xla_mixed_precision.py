"""XLA524's claim, run on torch_xla (PJRT_DEVICE=CPU): the fixture's float16 network with its BatchNorm kept in
float32 trains a step on the CPU; on XLA the BatchNorm's float32 output fails the next float16 convolution, and a
single block (conv, max-pool, BatchNorm) fails in backward at XLA's HLO verifier (max-pool's select-and-scatter);
the entry's advice (normalise a float32 copy, cast back) makes the network run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kb" / "XLA524" / "input.py"
STEP = """
import runpy, sys
import torch
import torch_xla

space = runpy.run_path(sys.argv[1])
if sys.argv[3] == "advice":
    space["Norm"].forward = lambda self, x: torch.nn.BatchNorm2d.forward(self, x.float()).to(x.dtype)
device = torch_xla.device() if sys.argv[2] == "xla" else "cpu"
torch.manual_seed(0)
if sys.argv[4] == "net":
    net = space["Net"]().to(device)
else:  # one block, cast as Net casts its layers
    net = space["Block"](3, 16)
    for layer in net.modules():
        layer.float() if isinstance(layer, space["Norm"]) else layer.half()
    net = net.to(device)
x = torch.randn(4, 3, 8, 8).half().to(device)
loss = net(x).float().flatten(1).logsumexp(dim=1).mean()
loss.backward()
if sys.argv[2] == "xla":
    torch_xla.sync()
print("loss", float(loss))
"""


def step(device: str, variant: str, model: str = "net") -> subprocess.CompletedProcess:
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    command = [sys.executable, "-c", STEP, str(FIXTURE), device, variant, model]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_batchnorm_kept_in_float32_fails_on_xla_and_the_advice_fixes_it():
    for model in ("net", "block"):
        on_cpu = step("cpu", "as written", model)
        assert on_cpu.returncode == 0, on_cpu.stderr[-2000:]
    on_xla = step("xla", "as written", "net")
    assert "Input type (float) and bias type (c10::Half) should be the same" in on_xla.stderr
    on_xla = step("xla", "as written", "block")
    assert "mixed precision is disallowed" in on_xla.stderr and "select-and-scatter" in on_xla.stderr
    advised = step("xla", "advice", "net")
    assert advised.returncode == 0, advised.stderr[-2000:]
