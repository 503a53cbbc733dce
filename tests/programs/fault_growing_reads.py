"""Planted fault: no optimizer and no step barrier; a host read each iteration runs a graph that holds every
iteration so far (the state `w` is never materialized), so each read compiles a bigger graph."""

import torch
import torch_xla

torch.manual_seed(0)
device = torch_xla.device()
w = torch.zeros(16, device=device)
for step in range(100_000):
    w = 0.9 * w + 0.1 * torch.randn(16, device=device)
    print(f"step {step} norm {w.norm().item():.4f}")
