"""A regression trained on the device named by `--device` (default: the CPU; the GPU run passes `--device cuda`).
The program of the verify test for arguments given to the migrated run only (kb XLA233)."""

import argparse

import torch
import torch.nn as nn
import torch_xla


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch_xla.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randn(64, 8, generator=gen)
    targets = inputs @ torch.randn(8, 1, generator=gen)
    model = nn.Linear(8, 1).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs, targets = inputs.to(args.device), targets.to(args.device)
    losses = []  # kept on the device and printed at the end: no host read per step
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        losses.append(loss.detach())
    for step, loss in enumerate(losses):
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
