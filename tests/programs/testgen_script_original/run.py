"""A training script whose model and step function live in the script itself (run as __main__)."""

import argparse

import torch
import torch.nn as nn

SCALE = float(open("scale.txt").read())  # relative to the working directory: the project root


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 2)

    def forward(self, x):
        return self.fc(x) * SCALE


def train_step(model, optimizer, batch, device):
    model.train()
    optimizer.zero_grad()
    loss = model(batch.to(device)).square().mean()
    loss.backward()
    optimizer.step()
    return loss.detach()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    device = torch.device("cuda")
    model = Net(4).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        train_step(model, optimizer, torch.randn(8, 4), device)


if __name__ == "__main__":
    main()
