"""Fixture driver (migrated copy): a few CUDA training steps (recorded by `xlaport testgen --record`)."""

import argparse

import torch

from model import MLP, loss_fn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()
torch.manual_seed(1)
model = MLP(d_in=16, d_hidden=24).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    x = torch.randn(6, 16, device="cuda")
    y = torch.randint(0, 5, (6,), device="cuda")
    loss = loss_fn(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
with open("last_loss.txt", "w") as handle:  # a file the run leaves in its working directory
    handle.write(f"{loss.item():.6f}\n")
