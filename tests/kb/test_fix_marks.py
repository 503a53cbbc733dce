"""Fixes that finish their job and leave no marks (issue #24): a location only used to load checkpoints loads on
the CPU, removed statements leave no extra blank lines and no half-emptied call layouts, and an `import torch_xla`
kept for its side effect survives `ruff --fix`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from xlaport.kb import fix_source, lint_source

RESUME = """\
import torch


def resume(model, path, gpu):
    location = "cuda:{}".format(gpu)
    checkpoint = torch.load(path, map_location=location)
    model.load_state_dict(checkpoint["model"])
"""


def test_a_location_used_only_to_load_becomes_the_cpu_and_nothing_is_left_to_fix():
    result = fix_source(RESUME)
    assert 'location = "cpu"' in result.fixed
    assert not [f for f in lint_source(result.fixed) if f.code in ("XLA711", "XLA226", "XLA307")]


def test_a_location_that_is_also_the_training_device_stays_the_device():
    source = RESUME.replace("    model.load_state_dict", "    model.to(location)\n    model.load_state_dict")
    assert 'location = "xla"' in fix_source(source).fixed


SEEDING = """\
import torch


def setup(seed):
    torch.manual_seed(seed)

    torch.backends.cudnn.benchmark = True

    return torch.nn.Linear(2, 2)


def tail(x):
    y = x + 1

    torch.backends.cudnn.benchmark = True


def head():

    torch.backends.cudnn.benchmark = True

    # why the model is small
    return torch.nn.Linear(2, 2)
"""


def test_removed_statements_leave_one_blank_line_at_most_inside_functions():
    fixed = fix_source(SEEDING).fixed
    ast.parse(fixed)
    body_lines = [line for line in fixed.splitlines()]
    for first, second, third in zip(body_lines, body_lines[1:], body_lines[2:], strict=False):
        if first.startswith("    ") and third.startswith("    "):
            assert (second, third) != ("", ""), fixed
    assert "def head():\n    # why the model is small\n" in fixed
    assert "y = x + 1\n\n\ndef head" in fixed  # no `pass`, no blank line left at the end of `tail`


def test_a_dropped_argument_joins_what_is_left_onto_the_call_line():
    source = (
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel\n\n"
        "def wrap(model, gpu):\n"
        "    return DistributedDataParallel(\n        model, device_ids=[gpu])\n"
    )
    fixed = fix_source(source).fixed
    assert "return DistributedDataParallel(model)\n" in fixed


def test_an_added_device_import_survives_ruff_fix(tmp_path: Path):
    source = 'import torch\n\ndevice = "cuda"\nx = torch.zeros(2).to(device)\n'
    fixed = fix_source(source).fixed
    assert "import torch_xla  # noqa: F401\n" in fixed
    target = tmp_path / "train.py"
    target.write_text(fixed)
    subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F401", "--fix", str(target)],
        capture_output=True,
        check=False,
    )
    assert target.read_text() == fixed
    assert fix_source(fixed).fixed == fixed  # a second pass adds nothing


def test_an_import_the_fix_uses_gets_no_noqa():
    source = "import torch\n\nx = torch.zeros(2).cuda()\n"
    fixed = fix_source(source).fixed
    assert "torch_xla.device()" in fixed and "noqa" not in fixed
