"""Fixture: a FAULTY migration of testgen_original/model.py (MIGRATED side of the testgen tests)."""

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla

device = torch_xla.device()


class MLP(nn.Module):
    def __init__(self, d_in: int = 16, d_hidden: int = 32, n_classes: int = 5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, n_classes)

    def forward(self, x):
        x = x.to(torch_xla.device())
        with torch.autocast("xla", dtype=torch.bfloat16):
            h = F.gelu(self.fc1(x))
        return self.fc2(h.int().float())  # planted fault: a cast to int


def loss_fn(logits, targets):
    smooth = torch.full_like(logits, 0.1 / logits.shape[-1]).to(torch_xla.device())
    return F.cross_entropy(logits, targets)  # planted fault: a dropped term


def scale_(x):
    x.mul_(torch.tensor(2.5, device=torch_xla.device()))  # planted fault: a changed constant


def load_shard(path: str, rank: int):
    return torch.load(path, map_location="cpu")


class Config:
    lr = 0.1
    device = "xla"
