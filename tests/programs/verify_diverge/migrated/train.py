"""Planted regression for the verify fail-fast test: the migrated learning rate is 100x too large.

The loss grows by about 80x per step and overflows to inf: the smoke test diverges, and verify must stop
there, saying why, without spending a reference run.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=5.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch_xla.device()
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(256, 8, generator=gen)
    targets = features @ torch.randn(8, 1, generator=gen)
    features, targets = features.to(device), targets.to(device)
    model = nn.Linear(8, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    history = []
    for step in range(args.steps):
        loss = F.mse_loss(model(features), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.detach())
        torch_xla.sync()
    for step, value in enumerate(torch.stack(history).cpu().tolist()):
        print(f"step {step} loss {value:.5f}")


if __name__ == "__main__":
    main()
