"""A migrated script whose device is an argparse flag (default: the XLA device). Run with `--device cpu`, as
a user without a GPU ran the original, it trains on the CPU: the check must name the flag, not the default."""

import argparse

import torch
import torch_xla  # noqa: F401  (registers the "xla" device)

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="xla")
parser.add_argument("--steps", type=int, default=40)
options = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Linear(4, 1).to(options.device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(options.steps):
    x = torch.randn(8, 4).to(options.device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
