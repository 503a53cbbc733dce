"""Correct, with host reads of three rhythms: a data-dependent `if` inside a module's forward (every step), a
loss printed every 5th step, and a checkpoint written once after the loop. The report locates each one and
does not spread the checkpoint's copies over the steps.

Usage: perf_reads.py [CHECKPOINT_PATH] (default: weights.pt in the working directory)
"""

import sys

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)


class Shift(torch.nn.Module):
    """Learns a bias that starts at the first batch's negative mean (a data-dependent initialization)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(width))
        self.register_buffer("ready", torch.zeros(1))

    def forward(self, x):
        if self.ready[0] == 0:  # compares a device value on the host, every call
            with torch.no_grad():
                self.bias.copy_(-x.mean(0))
                self.ready.fill_(1)
        return x + self.bias


device = torch_xla.device()
model = torch.nn.Sequential(Shift(6), torch.nn.Linear(6, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(12):
    x, y = torch.randn(5, 6).to(device), torch.randn(5, 1).to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
torch.save(model.state_dict(), sys.argv[1] if len(sys.argv) > 1 else "weights.pt")
