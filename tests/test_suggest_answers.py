"""A suggestion's answer stays what it was while the suggest path is made faster (issue #27): the patch, the fixes
applied, what is left and the kb entries retrieved for it, on three CUDA scripts written for this test, each asked
twice in one process (the second answer comes from the caches a service keeps warm) and with a new comment line
(a new text: no cache answers).

The recorded answers are in tests/fixtures/suggest_answers/answers.json. A change that means to alter them (a rule,
the retrieval) rewrites them and shows the difference in review:

    .venv/bin/python tests/test_suggest_answers.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = ROOT / "tests" / "fixtures" / "suggest_answers" / "answers.json"

AMP_LOOP = '''"""Trains a small classifier with mixed precision on the GPU."""
import torch
import torch.nn as nn
from torch.cuda.amp import GradScaler, autocast


def train(model, loader, epochs=2):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        running = 0.0
        for images, labels in loader:
            images, labels = images.to(device), labels.cuda(non_blocking=True)
            optimizer.zero_grad()
            with autocast():
                loss = criterion(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            running += loss.item()
        print(f"epoch {epoch}: {running / len(loader):.3f}")
        torch.cuda.empty_cache()
    torch.save(model.state_dict(), "classifier.pt")


if __name__ == "__main__":
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(4)]
    train(nn.Linear(16, 4), data)
'''

DISTRIBUTED = """import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def setup():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return local_rank


def run(model, batches):
    rank = setup()
    model = DDP(model.to(f"cuda:{rank}"), device_ids=[rank])
    optimizer = torch.optim.Adam(model.parameters())
    for step, (x, y) in enumerate(batches):
        x, y = x.cuda(), y.cuda()
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0 and rank == 0:
            print(step, loss.item(), torch.cuda.max_memory_allocated())
    torch.cuda.synchronize()
    dist.destroy_process_group()
"""

MODEL_FILE = """import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.register_buffer("mask", torch.ones(width).cuda())

    def forward(self, x):
        h = self.proj(x) * self.mask
        if h.sum() > 0:
            h = h.relu()
        return h.cpu().numpy()


def benchmark(model, x, repeats=10):
    torch.backends.cudnn.benchmark = True
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        model(x.cuda())
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats
"""

TEXTS = {"amp_loop.py": AMP_LOOP, "distributed.py": DISTRIBUTED, "model_file.py": MODEL_FILE}


def answer(patch) -> dict:
    """What a client reads of a suggestion (without scores, which follow the encoder's arithmetic)."""
    return {
        "changed": patch.changed,
        "diff": patch.diff,
        "applied": [[f.code, f.line, f.column] for f in patch.applied],
        "manual": [
            [
                m.finding.code,
                m.finding.line,
                m.migrated_line,
                m.finding.message,
                m.function,
                [h.code for h in m.retrieved],
            ]
            for m in patch.manual
        ],
        "notes": patch.notes,
        "reason": patch.evidence.reason,
    }


def answers() -> dict:
    from xlaport.serve.pipeline import Pipeline
    from xlaport.serve.results import SuggestOptions

    pipeline = Pipeline(proposer=None)
    found = {}
    for name, text in TEXTS.items():
        for unsafe in (False, True):
            options = SuggestOptions(unsafe_fixes=unsafe, k=3)
            found[f"{name} unsafe={unsafe}"] = answer(pipeline.suggest(text, name, options))
    return found


@pytest.mark.slow
def test_suggest_answers_stay_as_recorded():
    from xlaport.serve.pipeline import Pipeline
    from xlaport.serve.results import SuggestOptions

    recorded = json.loads(ANSWERS.read_text())
    assert answers() == recorded
    pipeline = Pipeline(proposer=None)
    for name, text in TEXTS.items():
        options = SuggestOptions(unsafe_fixes=True, k=3)
        expected = recorded[f"{name} unsafe=True"]
        assert answer(pipeline.suggest(text, name, options)) == expected
        assert answer(pipeline.suggest(text, name, options)) == expected  # the caches' answer
        new_text = answer(pipeline.suggest(text + "# a new comment\n", name, options))
        assert new_text["applied"] == expected["applied"] and new_text["manual"] == expected["manual"]


if __name__ == "__main__":
    ANSWERS.write_text(json.dumps(answers(), indent=1) + "\n")
    print(f"wrote {ANSWERS}", file=sys.stderr)
