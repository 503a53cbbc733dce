"""A device flip carries what it makes live (issue #24): code that a TPU host never ran because the device fell
back to the CPU (`device_type == "cpu"` branches, what a CUDA guard protects) runs once the device is XLA, so each
flip is kept only when nothing CUDA-only becomes reachable; and every expression form of the cuda-if-available
guard flips where the plain form does."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from xlaport.kb import fix_source, lint_source

# The repro in our own words: a CPU fallback, a device type derived from it, and a CUDA autocast behind a CPU test.
AUTOCAST_BEHIND_CPU_TEST = """\
from contextlib import nullcontext

import torch
import torch.nn as nn

device = "cuda:0" if torch.cuda.is_available() else "cpu"
device_type = "cuda" if "cuda" in device else "cpu"
ctx = nullcontext() if device_type == "cpu" else torch.cuda.amp.autocast(dtype=torch.bfloat16)

model = nn.Linear(8, 8).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x = torch.randn(4, 8, device=device)
    with ctx:
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("ran on", x.device, "in", loss.dtype)
"""

# A CUDA-only call without a safe rewrite behind the same test (it raises without CUDA, measured): the flip of
# `device_type` is withheld.
QUERY_BEHIND_CPU_TEST = AUTOCAST_BEHIND_CPU_TEST.replace(
    "model = nn.Linear(8, 8).to(device)\n",
    'gpu = "cpu" if device_type == "cpu" else torch.cuda.get_device_name()\nmodel = nn.Linear(8, 8).to(device)\n',
)


def cuda_calls(tree: ast.Module) -> list[str]:
    """`torch.cuda.*` references in a program (what needs a CUDA driver)."""
    return [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n) == "torch.cuda"]


def assigned_string(tree: ast.Module, name: str) -> ast.expr:
    return next(n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == name)


def test_the_flip_migrates_the_bfloat16_autocast_it_makes_live():
    fixed = fix_source(AUTOCAST_BEHIND_CPU_TEST).fixed
    tree = ast.parse(fixed)
    assert ast.unparse(assigned_string(tree, "device")) == "'xla'"
    assert cuda_calls(tree) == []  # nothing that needs CUDA is left anywhere, reachable or not
    assert 'torch.autocast("xla", dtype=torch.bfloat16)' in fixed


def test_a_flip_that_would_make_a_device_query_run_is_withheld_and_says_why():
    result = fix_source(QUERY_BEHIND_CPU_TEST)
    tree = ast.parse(result.fixed)
    # the device moves to XLA, but `device_type` keeps its CUDA test, so the CPU branch is still the one taken
    assert ast.unparse(assigned_string(tree, "device")) == "'xla'"
    assert ast.unparse(assigned_string(tree, "device_type")) == "'cuda' if 'cuda' in device else 'cpu'"
    withheld = [f for f in result.remaining if f.code in ("XLA226", "XLA230")]
    assert withheld and all(not f.fixable and "`torch.cuda.get_device_name` at line 11" in f.message for f in withheld)


def test_a_flipped_guard_whose_branch_needs_cuda_is_withheld():
    source = (
        "import torch\n\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "if 'cuda' in device:\n"
        "    model = model.cuda()\n"
        "    print(torch.cuda.get_device_name(0))\n"
    )
    findings = [f for f in lint_source(source) if f.code == "XLA230"]
    assert findings and not findings[0].fixable and "torch.cuda.get_device_name" in findings[0].message
    assert "if 'cuda' in device:" in fix_source(source).fixed


def test_a_device_test_on_a_parametrized_cuda_value_keeps_its_cuda():
    """skorch's suite: `@pytest.mark.parametrize('device', ['cpu', 'cuda'])`, then a test of `device` against 'cuda'.
    The test literal became 'xla' while the parametrized value stayed 'cuda': the case no longer took its branch
    (skorch's `if device.startswith('cuda') and not torch.cuda.is_available(): pytest.skip()` was skipped before
    and failed after the default migration; that form is not flipped at all now, see the test below)."""
    source = (
        "import pytest\nimport torch\n\n\n"
        "@pytest.mark.parametrize('device', ['cpu', 'cuda'])\n"
        "def test_forward(device):\n"
        "    x = torch.zeros(2)\n"
        "    if device.startswith('cuda'):\n"
        "        x = x.cuda()\n"
        "    assert x.sum() == 0\n"
    )
    assert "device.startswith('cuda')" in fix_source(source).fixed
    withheld = [f for f in lint_source(source) if f.code == "XLA230"]
    assert withheld and not withheld[0].fixable and "`'cuda'` at line 5" in withheld[0].message
    skip = source.replace(
        "    if device.startswith('cuda'):\n        x = x.cuda()\n",
        "    if device.startswith('cuda') and not torch.cuda.is_available():\n        pytest.skip()\n",
    )
    assert "device.startswith('cuda') and not torch.cuda.is_available()" in fix_source(skip).fixed


def test_a_cuda_value_fallback_for_hosts_without_cuda_is_not_flipped():
    """skorch's `get_map_location`: `if map_location.type == 'cuda' and not torch.cuda.is_available():` falls back
    to the CPU for a CUDA device the program was handed (a pickled net's). Flipped to `== 'xla'`, a CUDA pickle
    was loaded onto CUDA again (its test broke) and every XLA request went to the CPU."""
    source = (
        "import warnings\n\nimport torch\n\n\n"
        "def get_map_location(target_device, fallback_device='cpu'):\n"
        "    map_location = torch.device(target_device)\n"
        "    if map_location.type == 'cuda' and not torch.cuda.is_available():\n"
        "        warnings.warn('no CUDA here: loading on the CPU')\n"
        "        map_location = torch.device(fallback_device)\n"
        "    return map_location\n"
    )
    assert "map_location.type == 'cuda' and not torch.cuda.is_available()" in fix_source(source).fixed
    assert not [f for f in lint_source(source) if f.code == "XLA230"]


def test_a_guard_whose_branch_is_all_rewritten_still_flips():
    source = (
        "import torch\n\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "if 'cuda' in device:\n"
        "    model = model.cuda()\n"
        "    torch.backends.cudnn.benchmark = True\n"
    )
    fixed = fix_source(source).fixed
    assert "torch.cuda" not in fixed and "cudnn" not in fixed and ".cuda()" not in fixed


def test_bfloat16_cuda_autocast_is_a_safe_fix_and_says_it_raises():
    source = "import torch\n\nwith torch.cuda.amp.autocast(dtype=torch.bfloat16):\n    y = model(x)\n"
    (finding,) = [f for f in lint_source(source) if f.code == "XLA501"]
    assert finding.fix == "safe" and finding.fixable and "raises" in finding.message
    half = source.replace("bfloat16", "float16")
    (finding,) = [f for f in lint_source(half) if f.code == "XLA501"]
    assert finding.fix == "unsafe" and "no-op" not in finding.message


GUARD_FORMS = {
    "dev = torch.device(args.device if torch.cuda.is_available() else 'cpu')": "dev = torch.device(args.device)",
    "dev = 'cpu' if args.no_cuda or not torch.cuda.is_available() else 'cuda'": "dev = 'cpu' if args.no_cuda else 'xla'",
    "dev = 'cuda' if (torch.cuda.is_available() and not args.no_cuda) else 'cpu'": "dev = 'xla' if (not args.no_cuda) else 'cpu'",
    "dev = torch.device('cuda:%d' % args.gpu if torch.cuda.is_available() else 'cpu')": "dev = torch_xla.device()",
    "dev = f'cuda:{args.gpu}' if torch.cuda.is_available() else 'cpu'": 'dev = "xla"',
}


@pytest.mark.parametrize("line", list(GUARD_FORMS), ids=range(len(GUARD_FORMS)))
def test_every_guard_form_flips(line: str):
    source = (
        "import argparse\nimport torch\n\n"
        "parser = argparse.ArgumentParser()\nparser.add_argument('--device', default='cuda')\n"
        "args = parser.parse_args()\n"
        f"{line}\n"
        "model = torch.nn.Linear(2, 2).to(dev)\n"
    )
    fixed = fix_source(source).fixed
    assert GUARD_FORMS[line] in fixed.splitlines()
    assert "torch.cuda" not in fixed


@pytest.mark.slow
def test_migrated_programs_run_where_the_originals_ran(tmp_path: Path):
    """The proof by running: on this host without CUDA each original takes its CPU path and finishes; each
    migrated program, through torch_xla on the CPU, must finish too (before: `Current CUDA Device does not support
    bfloat16` at start-up)."""
    runner = tmp_path / "run_all.py"
    runner.write_text(
        "import runpy, sys\n"
        "for path in sys.argv[1:]:\n"
        "    runpy.run_path(path, run_name='__main__')\n"
        "    print('finished', path, flush=True)\n"
    )
    outputs = []
    for kind in ("original", "migrated"):  # one process each: a CPU backward before an XLA one trips autograd
        programs = []
        for name, source in (("autocast", AUTOCAST_BEHIND_CPU_TEST), ("query", QUERY_BEHIND_CPU_TEST)):
            path = tmp_path / f"{name}_{kind}.py"
            path.write_text(source if kind == "original" else fix_source(source).fixed)
            programs.append(str(path))
        env = {**os.environ, "PJRT_DEVICE": "CPU"}
        done = subprocess.run(
            [sys.executable, str(runner), *programs], capture_output=True, text=True, env=env, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.count("finished") == 2
        outputs.append(done.stdout)
    assert "ran on cpu" in outputs[0]
    assert "ran on xla:0" in outputs[1]  # the migrated programs train on the XLA device


CONVERSION_SCRIPT = '''\
"""Turns a training checkpoint into a Hugging Face folder."""
import argparse

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def convert(src, base, dst):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    state = torch.load(src, map_location=device)
    state = {k.replace("module.", "", 1): v for k, v in state["model"].items()}
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base))
    model.load_state_dict(state)
    model.to(device)
    model.save_pretrained(dst)
    torch.save(model.state_dict(), dst + "/weights.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("src")
    parser.add_argument("dst")
    args = parser.parse_args()
    convert(args.src, "base", args.dst)
'''


def test_a_conversion_script_stays_on_the_cpu():
    result = fix_source(CONVERSION_SCRIPT, unsafe=True)
    assert result.fixed == CONVERSION_SCRIPT  # nothing moves onto XLA, and the saves stay as they were
    (kept,) = [f for f in result.remaining if f.code == "XLA203"]
    assert not kept.fixable and "kept on the CPU" in kept.message
    assert not [f for f in result.remaining if f.code in ("XLA308", "XLA701")]


def test_the_same_device_line_in_a_training_script_still_flips():
    training = CONVERSION_SCRIPT.replace(
        "    model.save_pretrained(dst)\n",
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for batch in range(3):\n"
        "        model(torch.ones(1, 4, dtype=torch.long, device=device)).logits.sum().backward()\n"
        "        opt.step()\n"
        "    model.save_pretrained(dst)\n",
    )
    assert "device = torch_xla.device()" in fix_source(training).fixed


def test_a_statement_guard_that_would_make_a_device_query_run_is_withheld():
    source = (
        "import torch\n\n"
        "device = 'cpu'\n"
        "if torch.cuda.is_available():\n"
        "    device = 'cuda'\n"
        "model = torch.nn.Linear(2, 2).to(device)\n"
        "if device != 'cpu':\n"
        "    print(torch.cuda.get_device_name())\n"
    )
    fixed = fix_source(source).fixed
    assert "if torch.cuda.is_available():\n    device = 'cuda'" in fixed  # still the CPU on a TPU host
    (finding,) = [f for f in lint_source(source) if f.code == "XLA230"]
    assert not finding.fixable and "get_device_name" in finding.message


FLAT_CONVERSION_SCRIPT = """import sys
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
state = torch.load(sys.argv[1], map_location=device)
net = nn.Linear(4, 4)
net.load_state_dict(state)
net.to(device)
torch.save({k: v.half() for k, v in net.state_dict().items()}, sys.argv[2])
"""


def test_a_flat_conversion_script_with_no_main_block_stays_on_the_cpu():
    # its module-level statements load and save: it is a script even with no loop and no __main__ block
    result = fix_source(FLAT_CONVERSION_SCRIPT, unsafe=True)
    assert result.fixed == FLAT_CONVERSION_SCRIPT
    assert [f for f in result.remaining if f.code == "XLA203"]


def test_a_module_whose_only_checkpoint_calls_are_in_functions_still_flips():
    library = (
        "import torch\n\n"
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n\n\n'
        "def save(model, path):\n"
        "    torch.save(model.state_dict(), path)\n"
    )
    assert "device = torch_xla.device()" in fix_source(library).fixed


def test_a_guard_whose_block_adds_a_cuda_device_no_rule_rewrites_is_withheld():
    # a test suite's device list: the flip would make `devices.append('cuda')` run, and no rule rewrites that string
    source = (
        "import torch\n\n\n"
        "def test_fill():\n"
        "    devices = ['cpu']\n"
        "    if torch.cuda.is_available():\n"
        "        devices.append('cuda')\n"
        "    for device in devices:\n"
        "        assert torch.zeros(3, device=device).sum() == 0\n"
    )
    assert fix_source(source).fixed == source
    (finding,) = [f for f in lint_source(source) if f.code == "XLA230"]
    assert not finding.fixable and "`'cuda'` at line 7" in finding.message


# A sampling script in our own words: it loads a checkpoint, generates, and saves what it made; it trains nowhere, so
# the migration keeps it on the CPU (its fallback stays). Its other device lines must agree with that decision.
SAMPLING_SCRIPT = '''\
"""Draws a few samples from a trained checkpoint and stores them."""
import sys

import torch
from net import TinyLM

device = "cuda" if torch.cuda.is_available() else "cpu"
device_type = "cuda" if "cuda" in device else "cpu"
torch.manual_seed(7)
torch.cuda.manual_seed(7)
state = torch.load(sys.argv[1], map_location=device)
model = TinyLM(**state["config"])
model.load_state_dict(state["weights"])
model.to(device).eval()
if len(sys.argv) > 3:
    model = torch.compile(model)
prompt = torch.zeros((1, 1), dtype=torch.long, device=device)
with torch.no_grad(), torch.autocast(device_type=device_type, dtype=torch.bfloat16):
    tokens = prompt
    for _ in range(16):
        nxt = model(tokens)[:, -1, :].argmax(-1, keepdim=True)
        tokens = torch.cat((tokens, nxt), dim=1)
torch.save(tokens.cpu(), sys.argv[2])
'''


@pytest.mark.parametrize("target", ["torch_xla", "torch_tpu"])
def test_a_script_kept_on_the_cpu_gets_no_device_rewrite(target):
    from xlaport.kb.registry import all_rules

    result = fix_source(SAMPLING_SCRIPT, rules=all_rules(target), unsafe=True)
    assert (
        result.fixed == SAMPLING_SCRIPT
    )  # `device_type` stays 'cuda' (dead on a TPU host), seed and compile as they were
    kept = [f for f in result.remaining if "kept on the CPU" in f.message]
    assert kept and not any(f.fixable for f in kept)
    # still reported: the fallback, device_type, the seed, and on XLA the compile backend and the sampling barrier
    assert {f.line for f in kept} >= ({7, 8, 10, 16, 22} if target == "torch_xla" else {7, 8, 10})


def test_a_model_library_with_a_smoke_test_is_not_a_cpu_script():
    # its only checkpoint call is in a method (an EMA copy), its __main__ block a smoke test: the training script
    # that imports it builds `UNet()` with the CUDA default, which must become XLA
    library = (
        "import torch\nfrom torch import nn\n\n\n"
        "class Ema:\n"
        "    def reset(self, ema, model):\n"
        "        ema.load_state_dict(model.state_dict())\n\n\n"
        "class UNet(nn.Module):\n"
        '    def __init__(self, device="cuda"):\n'
        "        super().__init__()\n"
        "        self.device = device\n\n"
        "    def forward(self, t):\n"
        "        return torch.arange(4, device=self.device) * t\n\n\n"
        'if __name__ == "__main__":\n'
        '    print(UNet(device="cpu")(torch.ones(1)))\n'
    )
    assert 'def __init__(self, device="xla")' in fix_source(library).fixed


def test_a_conversion_script_that_needs_cuda_anyway_is_migrated_whole():
    # `model.cuda()` outside any test: on a TPU host this script failed, it never ran on the CPU; half a migration
    # (the fallback kept, the model moved to XLA) would put the state and the model on different devices
    needs_gpu = CONVERSION_SCRIPT.replace("    model.to(device)\n", "    model.cuda()\n")
    result = fix_source(needs_gpu, unsafe=True)
    assert ".cuda()" not in result.fixed and "torch.cuda.is_available()" not in result.fixed
    assert "xm.save(model.state_dict()" in result.fixed  # its saves too: the model is on XLA now (XLA701)
    assert not [f for f in result.remaining if "kept on the CPU" in f.message]
