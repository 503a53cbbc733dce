"""One process per GPU: started with mp.spawn over the GPU count, NCCL process group set up in a helper,
the rank used as the device."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank: int, world_size: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(rank)
    dist.init_process_group(backend="nccl", rank=rank, world_size=world_size)


def worker(rank: int, world_size: int) -> None:
    setup(rank, world_size)
    model = torch.nn.Linear(5, 1).to(rank)
    ddp = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(4, 5).to(rank)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print("device", next(ddp.parameters()).device)
        print("world", dist.get_world_size())
        print("loss", float(loss))
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(worker, args=(world_size,), nprocs=world_size, join=True)
