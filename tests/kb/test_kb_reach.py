"""Host reads reached from the training step across functions and files (issue 24, item 4): a helper another
module's loop calls every step, a model method that `forward` calls, a buffer read in `forward`."""

from __future__ import annotations

from pathlib import Path

from xlaport.kb.batch import lint_file, summarize_project

MODEL = """\
import torch
import torch.nn as nn


class KeyQueue(nn.Module):
    def __init__(self, dim, size):
        super().__init__()
        self.size = size
        self.register_buffer("slots", torch.zeros(dim, size))
        self.register_buffer("cursor", torch.zeros(1, dtype=torch.long))

    def _enqueue(self, keys):
        n = keys.shape[0]
        at = int(self.cursor)
        self.slots[:, at : at + n] = keys.T
        self.cursor[0] = (at + n) % self.size

    def forward(self, keys):
        self._enqueue(keys)
        return self.slots
"""

METRICS = """\
def clipped_peak(out, limit):
    peak = out.abs().max()
    if peak > limit:
        peak = peak * 0 + limit
    return float(peak)


def summary(out):
    return float(out.mean())
"""

TRAIN = """\
import torch

from metrics import clipped_peak, summary
from model import KeyQueue


def divisible_by(n, d):
    return n % d == 0


def fit(loader, dim):
    device = torch.device("cuda")
    net = KeyQueue(dim, 64).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step, x in enumerate(loader):
        out = net(x.to(device))
        loss = out.sum()
        clipped_peak(out, 10.0)
        loss.backward()
        opt.step()
        if divisible_by(step, 100):
            print(summary(out))
"""


def lint_tree(root: Path, files: dict[str, str]) -> dict[str, set[tuple[int, str]]]:
    for name, text in files.items():
        (root / name).write_text(text)
    rels = sorted(Path(name) for name in files)
    project = summarize_project(root, rels)
    found = {}
    for rel in rels:
        result = lint_file(root / rel, display=str(rel), project=project)
        found[str(rel)] = {(f.line, f.code) for f in result.findings if f.code in ("XLA402", "XLA405")}
    return found


def test_host_reads_reached_from_the_loop_in_other_files(tmp_path):
    found = lint_tree(tmp_path, {"model.py": MODEL, "metrics.py": METRICS, "train.py": TRAIN})
    assert found["model.py"] == {(14, "XLA402")}  # `int(self.cursor)` in a method `forward` calls
    # the helper the loop calls every step; `summary` runs every 100 steps only (a modulo helper)
    assert found["metrics.py"] == {(3, "XLA405"), (5, "XLA402")}
    assert found["train.py"] == set()


def test_a_helper_no_loop_calls_is_not_reached(tmp_path):
    train = TRAIN.replace("        clipped_peak(out, 10.0)\n", "")
    found = lint_tree(tmp_path, {"model.py": MODEL, "metrics.py": METRICS, "train.py": train})
    assert found["metrics.py"] == set()


def test_the_index_use_is_named_in_the_message(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    result = lint_file(tmp_path / "model.py", display="model.py")
    (finding,) = [f for f in result.findings if f.code == "XLA402"]
    assert "`_enqueue`, which runs every training step" in finding.message
    assert "each new value compiles a new graph" in finding.message


HOST_READS = """\
import torch


def report_step(loss, logits):
    value = loss.item()
    spread = torch.std(logits)
    print("spread", spread)
    kept = logits.detach().cpu()
    return value, kept


def rare_report(loss):
    return loss.item()
"""

RANKER = """\
import torch.nn as nn


class Ranker(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.score = nn.Linear(dim, 1)

    def _order(self, scores):
        return scores.argsort(dim=0).tolist()

    def forward(self, x):
        scores = self.score(x)
        self._order(scores)
        return scores
"""

HOST_READ_TRAIN = """\
import torch

from helpers import rare_report, report_step
from ranker import Ranker


def fit(loader):
    device = torch.device("cuda")
    net = Ranker(8).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step, x in enumerate(loader):
        logits = net(x.to(device))
        loss = logits.pow(2).mean()
        loss.backward()
        opt.step()
        report_step(loss, logits)
        if step % 100 == 0:
            rare_report(loss)
"""


def host_reads_of(root: Path, files: dict[str, str]) -> dict[str, set[tuple[int, str]]]:
    for name, text in files.items():
        (root / name).write_text(text)
    rels = sorted(Path(name) for name in files)
    project = summarize_project(root, rels)
    codes = ("XLA401", "XLA403", "XLA404")
    return {
        str(rel): {(f.line, f.code) for f in lint_file(root / rel, display=str(rel), project=project).findings}
        & {(line, code) for line in range(1, 100) for code in codes}
        for rel in rels
    }


def test_item_logging_and_host_copies_in_functions_the_loop_reaches(tmp_path):
    found = host_reads_of(tmp_path, {"helpers.py": HOST_READS, "ranker.py": RANKER, "train.py": HOST_READ_TRAIN})
    # the helper the loop calls every step; `rare_report` runs every 100 steps only
    assert found["helpers.py"] == {(5, "XLA401"), (7, "XLA403"), (8, "XLA404")}
    assert found["ranker.py"] == {(10, "XLA404")}  # `.tolist()` in a method that `forward` calls
    assert found["train.py"] == set()


def test_the_reached_function_is_named_in_host_read_messages(tmp_path):
    (tmp_path / "ranker.py").write_text(RANKER)
    result = lint_file(tmp_path / "ranker.py", display="ranker.py")
    (finding,) = [f for f in result.findings if f.code == "XLA404"]
    assert "`_order`, which runs every training step" in finding.message
