"""`check` names the dependency a run died in and the kb entry whose symptom the error is (eval/check/crash.py,
kb/symptoms.py): torch_xla 2.9's unreduced `amax()` raised from a library's code is XLA522's, with the package,
its file:line and the workaround."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner
from xlaport.eval.check.crash import crash_reason, dependency_frame, error_line, missing_xla_api
from xlaport.kb.symptoms import entries_for_error, explain_error

from xlaport.cli import app

SITE = "/opt/env/lib/python3.11/site-packages"
TRACEBACK = f"""Traceback (most recent call last):
  File "/work/proj/train.py", line 40, in <module>
    batch = pad_batch(seqs)
  File "{SITE}/padtools/ops.py", line 12, in pad_batch
    longest = lengths.amax().item()
  File "{SITE}/torch/_tensor.py", line 1000, in __int__
    return self.item()
RuntimeError: a Tensor with 7 elements cannot be converted to Scalar"""


def test_the_innermost_frame_outside_torch_is_the_dependency():
    frame = dependency_frame(TRACEBACK)
    assert (frame.package, frame.line, frame.function) == ("padtools", 12, "pad_batch")
    assert frame.path == f"{SITE}/padtools/ops.py"
    assert error_line(TRACEBACK) == "RuntimeError: a Tensor with 7 elements cannot be converted to Scalar"


def test_a_crash_in_the_programs_own_file_names_no_dependency():
    own = TRACEBACK.replace(f"{SITE}/padtools/ops.py", "/work/proj/padtools.py")
    assert dependency_frame(own) is None
    assert dependency_frame("ValueError: no traceback") is None


def test_the_amax_defect_is_xla522_whatever_the_element_count():
    assert entries_for_error("RuntimeError: a Tensor with 7 elements cannot be converted to Scalar") == ["XLA522"]
    assert entries_for_error("RuntimeError: shape mismatch") == []
    # a symptom many entries share names none of them
    assert entries_for_error("RuntimeError: Found no NVIDIA driver on your system") == []


def test_the_reason_names_package_file_line_entry_and_workaround():
    reason = crash_reason(TRACEBACK, explain_error)
    assert f"`padtools` ({SITE}/padtools/ops.py:12, in pad_batch)" in reason
    assert "kb XLA522" in reason and "`max()`/`min()` does" in reason
    assert "apply the workaround in `padtools`" in reason
    assert crash_reason(TRACEBACK, None).startswith("raised inside the dependency `padtools`")


DEPENDENCY = """import torch


def pad_to_longest(seqs):
    lengths = torch.tensor([len(s) for s in seqs], device=seqs[0].device)
    longest = lengths.amax().item()
    return torch.stack([torch.nn.functional.pad(s, (0, longest - len(s))) for s in seqs])
"""

PROGRAM = """import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "env", "site-packages"))
import torch
import torch_xla
from padtools import pad_to_longest

device = torch_xla.device()
model = torch.nn.Linear(4, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    seqs = [torch.ones(n, device=device) for n in (2, 3, 4, 1)]
    batch = pad_to_longest(seqs)
    loss = model(batch).sum()
    loss.backward()
    opt.step()
    torch_xla.sync()
"""


@pytest.mark.slow
def test_check_attributes_a_dependencys_amax_crash_to_xla522(tmp_path):
    (tmp_path / "env" / "site-packages" / "padtools").mkdir(parents=True)
    (tmp_path / "env" / "site-packages" / "padtools" / "__init__.py").write_text(DEPENDENCY)
    (tmp_path / "train.py").write_text(PROGRAM)
    result = CliRunner().invoke(app, ["check", "train.py", "--format", "json", "--workdir", str(tmp_path)])
    report = json.loads(result.output)
    assert report["level"] == "none"
    reason = report["reasons"][0]
    assert "a Tensor with 4 elements cannot be converted to Scalar" in reason
    assert "raised inside the dependency `padtools`" in reason and "padtools/__init__.py:6, in pad_to_longest" in reason
    assert "kb XLA522" in reason


REMOVED_GETTER = f"""Traceback (most recent call last):
  File "/work/proj/train.py", line 23, in <module>
    print(evaluator.run(data).metrics)
  File "{SITE}/ignite/metrics/metric.py", line 300, in compute
    ws = idist.get_world_size()
  File "{SITE}/ignite/distributed/comp_models/xla.py", line 80, in get_world_size
    return xm.xrt_world_size()
AttributeError: module 'torch_xla.core.xla_model' has no attribute 'xrt_world_size'"""


def test_a_dependency_calling_a_removed_torch_xla_api_is_named_with_the_api_and_the_shim():
    reason = crash_reason(REMOVED_GETTER, explain_error)
    assert f"`ignite` ({SITE}/ignite/distributed/comp_models/xla.py:80, in get_world_size)" in reason
    assert "`ignite` uses `torch_xla.core.xla_model.xrt_world_size`, which the installed torch_xla no longer" in reason
    # the own-code entry (the rewrite) and the dependency's entry (the shim the migration adds)
    assert "kb XLA103" in reason and "kb XLA117" in reason
    assert missing_xla_api("ImportError: cannot import name 'get_ordinal' from 'torch_xla.core.xla_model'") == (
        "torch_xla.core.xla_model.get_ordinal"
    )
    assert missing_xla_api("ModuleNotFoundError: No module named 'torch_xla.experimental.pjrt'") == (
        "torch_xla.experimental.pjrt"
    )
    assert missing_xla_api("AttributeError: 'Tensor' object has no attribute 'foo'") is None
    # the program's own call: the rule rewrites it, no dependency sentence
    own = REMOVED_GETTER.replace(f"{SITE}/ignite/distributed/comp_models/xla.py", "/work/proj/dist.py")
    assert "uses `torch_xla" not in crash_reason(own, explain_error)


def test_the_error_line_is_the_exception_not_what_torch_xla_prints_after_it():
    text = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 432, in main\n'
        "    torch_xla.sync()\n"
        "ValueError: during context [hlo verifier]: Seen floating point types of different precisions\n"
        "Failed after pipeline-start\n"
    )
    assert error_line(text).startswith("ValueError: during context [hlo verifier]")
    # a message that goes on over several lines is named by its first line
    assert error_line("Traceback (most recent call last):\nRuntimeError: first\nsecond line\n") == "RuntimeError: first"
