"""The correct torch_xla migration of ../original/train.py (hand-written for the verify tests).

The XLA device instead of CUDA, one `torch_xla.sync()` per step, and the per-step losses kept on the device
and printed after training (one host transfer instead of one per step). Mini-batches still come from numpy's
unseeded global generator, so every run differs from every other, as the original's do.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla


def make_data(n, seed):
    gen = torch.Generator().manual_seed(seed)
    centers = 1.2 * torch.randn(6, 12, generator=torch.Generator().manual_seed(11))
    labels = torch.randint(0, 6, (n,), generator=gen)
    return centers[labels] + torch.randn(n, 12, generator=gen), labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.2)
    args = parser.parse_args()

    torch.set_num_threads(1)
    device = torch_xla.device()
    features, labels = make_data(2048, seed=1)
    val_features, val_labels = make_data(512, seed=2)
    model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 6)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        index = torch.from_numpy(np.random.randint(0, len(labels), size=args.batch))
        x, y = features[index].to(device), labels[index].to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        torch_xla.sync()
    for step, value in enumerate(torch.stack(losses).cpu().tolist()):
        print(f"step {step} | loss {value:.5f}")
    with torch.no_grad():
        predicted = model(val_features.to(device)).argmax(-1)
    accuracy = (predicted == val_labels.to(device)).float().mean().item()
    print(f"val_accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
