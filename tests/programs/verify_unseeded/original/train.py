"""A small CUDA training script that does not fix its seed (for the verify tests; written for them).

The data set is fixed (as if read from disk), but every run draws its own mini-batches from numpy's global
generator, which Python seeds from the operating system: two runs of this script log different losses from
the first step on, with nothing wrong. It logs the loss every step and the validation accuracy at the end.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


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
    device = torch.device("cuda")
    features, labels = make_data(2048, seed=1)
    val_features, val_labels = make_data(512, seed=2)
    model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 6)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        index = torch.from_numpy(np.random.randint(0, len(labels), size=args.batch))
        x, y = features[index].to(device), labels[index].to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} | loss {loss.item():.5f}")
    with torch.no_grad():
        predicted = model(val_features.to(device)).argmax(-1)
    accuracy = (predicted == val_labels.to(device)).float().mean().item()
    print(f"val_accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
