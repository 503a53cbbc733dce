"""Linear regression on a CUDA GPU: the reference of the verify fail-fast test."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(256, 8, generator=gen)
    targets = features @ torch.randn(8, 1, generator=gen)
    features, targets = features.cuda(), targets.cuda()
    model = nn.Linear(8, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        loss = F.mse_loss(model(features), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.5f}")


if __name__ == "__main__":
    main()
