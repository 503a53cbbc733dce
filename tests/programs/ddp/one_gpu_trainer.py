"""A class-based trainer for one GPU, laid out the way tutorials lay it out: `build_parts()` makes the data,
the network and its optimizer together; `Fitter.__init__` receives them and moves the network to the GPU
named by an int index; the optimizer step sits in a helper method. Prints the first and last loss."""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset


class Fitter:
    def __init__(self, net: torch.nn.Module, batches: DataLoader, opt: torch.optim.Optimizer, gpu: int) -> None:
        self.gpu = gpu
        self.net = net.to(gpu)
        self.batches = batches
        self.opt = opt
        self.losses = []

    def _one_step(self, inputs, wanted):
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.net(inputs), wanted)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def _one_pass(self, epoch):
        for inputs, wanted in self.batches:
            inputs = inputs.to(self.gpu)
            wanted = wanted.to(self.gpu)
            self.losses.append(self._one_step(inputs, wanted))

    def fit(self, epochs: int):
        for epoch in range(epochs):
            self._one_pass(epoch)


def build_parts(rows: int):
    torch.manual_seed(0)
    features = torch.randn(rows, 12)
    targets = features @ torch.linspace(-1.0, 1.0, 12).unsqueeze(1)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    return TensorDataset(features, targets), net, opt


def run(gpu: int, epochs: int, batch: int) -> None:
    data, net, opt = build_parts(256)
    batches = DataLoader(data, batch_size=batch, pin_memory=True, shuffle=True, drop_last=True)
    fitter = Fitter(net, batches, opt, gpu)
    fitter.fit(epochs)
    print("device", next(fitter.net.parameters()).device)
    print("first_loss", float(fitter.losses[0]))
    print("last_loss", float(fitter.losses[-1]))


if __name__ == "__main__":
    cli = argparse.ArgumentParser()
    cli.add_argument("epochs", type=int)
    cli.add_argument("--batch", type=int, default=16)
    opts = cli.parse_args()
    run(0, opts.epochs, opts.batch)
