"""Data-parallel fine-tuning of a small MLP classifier head (written for NVIDIA GPUs with NCCL).

Launch with `torchrun --nproc_per_node=N train.py`; without torchrun it runs as a single process.
A "pretrained" encoder is built from a fixed seed and frozen; only the head is trained.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_dataset(n, dim, classes, seed):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=torch.Generator().manual_seed(99)) * 0.45
    labels = torch.randint(0, classes, (n,), generator=gen)
    features = centers[labels] + torch.randn(n, dim, generator=gen)
    return TensorDataset(features, labels)


class Classifier(nn.Module):
    def __init__(self, dim=32, hidden=64, classes=5):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--metrics-out", default="metrics.json")
    args = parser.parse_args()

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29513")
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    torch.manual_seed(0)
    model = Classifier()
    for p in model.encoder.parameters():
        p.requires_grad_(False)
    model = model.cuda()
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=args.lr, momentum=0.9)

    train_set = make_dataset(2048, 32, 5, seed=1)
    sampler = DistributedSampler(train_set, num_replicas=dist.get_world_size(), rank=dist.get_rank(), seed=0)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler, drop_last=True)

    losses, step, epoch = [], 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for features, labels in loader:
            features, labels = features.cuda(), labels.cuda()
            loss = F.cross_entropy(model(features), labels)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            losses.append(loss.detach())
            step += 1
            if step >= args.steps:
                break
        epoch += 1

    val_set = make_dataset(512, 32, 5, seed=2)
    features, labels = (t.cuda() for t in val_set.tensors)
    with torch.no_grad():
        accuracy = (model(features).argmax(-1) == labels).float().mean().item()
    if dist.get_rank() == 0:
        history = [float(v) for v in torch.stack(losses).cpu()]
        print(f"final loss {history[-1]:.4f} accuracy {accuracy:.4f}")
        with open(args.metrics_out, "w") as f:
            json.dump({"loss": history, "accuracy": accuracy}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
