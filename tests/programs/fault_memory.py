"""Planted fault: keeps every batch it makes, so its memory grows until the check's memory limit kills it."""

import torch
import torch_xla

device = torch_xla.device()
kept = []
for _step in range(100_000):
    kept.append(torch.ones(64, 1024, 1024))  # 256 MB a step, held on the host
    torch_xla.sync()
