"""A chaotic but correct CUDA training run (the reference program of verify's relative smoke gates).

A short burst of a much larger learning rate at steps 3-4 (an aggressive warm restart) throws the loss far
above its first value; it recovers within a few steps and ends well below it. A smoke gate that judges the
migrated curve alone ("loss rose to more than 3x its first value") stops every migration of it.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    device = torch.device("cuda")
    features, labels = make_data(4096, seed=1)
    val_features, val_labels = (t.cuda() for t in make_data(1024, seed=2))
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4)).cuda()
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
        print(f"step {step} loss {loss.item():.5f}")
    with torch.no_grad():
        accuracy = (model(val_features).argmax(-1) == val_labels).float().mean().item()
    print(f"final eval_accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
