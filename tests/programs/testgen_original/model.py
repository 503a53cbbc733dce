"""Fixture: a small CUDA model file (ORIGINAL side of the testgen tests)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class MLP(nn.Module):
    def __init__(self, d_in: int = 16, d_hidden: int = 32, n_classes: int = 5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, n_classes)

    def forward(self, x):
        x = x.cuda()
        with torch.autocast("cuda", dtype=torch.float16):
            h = F.gelu(self.fc1(x))
        return self.fc2(h.float())


def loss_fn(logits, targets):
    smooth = torch.full_like(logits, 0.1 / logits.shape[-1]).cuda()
    return F.cross_entropy(logits, targets) + 0.5 * (logits.softmax(-1) - smooth).pow(2).mean()


def scale_(x):
    x.mul_(torch.tensor(2.0, device="cuda"))


def load_shard(path: str, rank: int):
    return torch.load(path, map_location=f"cuda:{rank}")


class Config:
    lr = 0.1
    device = "cuda"
