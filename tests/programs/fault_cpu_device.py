"""Planted fault: migrated, yet the model trains on the CPU (its device comes from torch.accelerator, which
knows nothing of XLA), while the loop still calls torch_xla.sync() each step. Exit code 0 either way.

Usage: fault_cpu_device.py [STEPS] (default 2000: long enough that only a fail-fast check ends early)
"""

import sys

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
use_accel = torch.accelerator.is_available()
device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)

for step in range(steps):
    x, y = torch.randn(16, 32).to(device), torch.randn(16, 1).to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.4f}")
