"""The correct migration of ../original/train.py to torch_xla (hand-written): same spike, same recovery.

`torch_xla.device()` instead of CUDA, one `torch_xla.sync()` per step, the loss printed by a step closure
(after the step's graph ran, so no per-step host sync).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm


def make_data(n, seed):
    centers = 0.5 * torch.randn(4, 16, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=gen)
    return centers[labels] + torch.randn(n, 16, generator=gen), labels


def learning_rate(step, base, burst):
    return base * burst if step in (3, 4) else base


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--burst", type=float, default=30.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch_xla.device()
    features, labels = make_data(4096, seed=1)
    val_features, val_labels = (t.to(device) for t in make_data(1024, seed=2))
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    batches = torch.Generator().manual_seed(3)
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.lr, args.burst)
        index = torch.randint(0, len(labels), (128,), generator=batches)
        x, y = features[index].to(device), labels[index].to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        xm.add_step_closure(lambda step, loss: print(f"step {step} loss {loss.item():.5f}"), (step, loss))
        torch_xla.sync()
    with torch.no_grad():
        accuracy = (model(val_features).argmax(-1) == val_labels).float().mean().item()
    print(f"final eval_accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
