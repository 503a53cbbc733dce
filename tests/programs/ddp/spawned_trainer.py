"""The same trainer on every GPU of the host: one process per GPU through `mp.spawn` with the GPU count as
the world size, an NCCL group set up in a helper, DDP with `device_ids`, a DistributedSampler, and a
checkpoint written by rank 0. Prints the first and last loss of rank 0."""

import argparse
import os

import torch
import torch.multiprocessing as mp
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def join_group(rank: int, world: int) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "29541"
    torch.cuda.set_device(rank)
    init_process_group(backend="nccl", rank=rank, world_size=world)


class Fitter:
    def __init__(self, net: torch.nn.Module, batches: DataLoader, opt: torch.optim.Optimizer, gpu: int) -> None:
        self.gpu = gpu
        self.net = net.to(gpu)
        self.net = DistributedDataParallel(net, device_ids=[gpu])
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
        self.batches.sampler.set_epoch(epoch)
        for inputs, wanted in self.batches:
            inputs = inputs.to(self.gpu)
            wanted = wanted.to(self.gpu)
            self.losses.append(self._one_step(inputs, wanted))

    def fit(self, epochs: int, folder: str):
        for epoch in range(epochs):
            self._one_pass(epoch)
            if self.gpu == 0:
                torch.save(self.net.module.state_dict(), os.path.join(folder, "weights.pt"))


def build_parts(rows: int):
    torch.manual_seed(0)
    features = torch.randn(rows, 12)
    targets = features @ torch.linspace(-1.0, 1.0, 12).unsqueeze(1)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    return TensorDataset(features, targets), net, opt


def worker(rank: int, world: int, epochs: int, batch: int, folder: str) -> None:
    join_group(rank, world)
    data, net, opt = build_parts(256)
    batches = DataLoader(data, batch_size=batch, pin_memory=True, sampler=DistributedSampler(data), drop_last=True)
    fitter = Fitter(net, batches, opt, rank)
    fitter.fit(epochs, folder)
    if rank == 0:
        print("device", next(fitter.net.parameters()).device)
        print("world", world)
        print("first_loss", float(fitter.losses[0]))
        print("last_loss", float(fitter.losses[-1]))
    destroy_process_group()


if __name__ == "__main__":
    cli = argparse.ArgumentParser()
    cli.add_argument("epochs", type=int)
    cli.add_argument("--batch", type=int, default=16)
    opts = cli.parse_args()
    world = torch.cuda.device_count()
    mp.spawn(worker, args=(world, opts.epochs, opts.batch, os.getcwd()), nprocs=world)
