"""Small image classifier trained with CUDA mixed precision (written for an NVIDIA GPU).

The data is synthetic and made on the CPU with a fixed seed, so every run sees the same images:
each class is a different oriented stripe pattern plus noise.
"""

import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_dataset(n, num_classes, size, seed):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (n,), generator=gen)
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    images = torch.empty(n, 3, size, size)
    for c in range(num_classes):
        angle = torch.tensor(c * 3.14159 / num_classes)
        stripes = torch.sin((xs * torch.cos(angle) + ys * torch.sin(angle)) * 0.8)
        images[labels == c] = stripes
    images += 1.5 * torch.randn(images.shape, generator=gen)
    return TensorDataset(images, labels)


class SmallConvNet(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        x = x.mean(dim=(2, 3))
        return self.head(x)


def evaluate(model, loader):
    model.eval()
    correct = torch.zeros((), device="cuda")
    total = 0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.cuda(), labels.cuda()
            with torch.cuda.amp.autocast():
                logits = model(images)
            correct += (logits.argmax(-1) == labels).sum()
            total += labels.numel()
    model.train()
    return correct.item() / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--metrics-out", default="metrics.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True

    train_set = make_dataset(1024, 4, 16, seed=1)
    val_set = make_dataset(256, 4, 16, seed=2)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                              pin_memory=True, generator=torch.Generator().manual_seed(3))
    val_loader = DataLoader(val_set, batch_size=64, drop_last=True, pin_memory=True)

    model = SmallConvNet().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.cuda.amp.GradScaler()

    losses = []
    step = 0
    start = time.time()
    while step < args.steps:
        for images, labels in train_loader:
            images = images.cuda(non_blocking=True)
            labels = labels.cuda(non_blocking=True)
            optimizer.zero_grad()
            with torch.cuda.amp.autocast():
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.detach())
            if step % args.log_every == 0:
                print(f"step {step} loss {loss.item():.4f}")
            step += 1
            if step >= args.steps:
                break
    torch.cuda.synchronize()
    elapsed = time.time() - start

    accuracy = evaluate(model, val_loader)
    history = [float(v) for v in torch.stack(losses).float().cpu()]
    print(f"accuracy {accuracy:.4f}")
    with open(args.metrics_out, "w") as f:
        json.dump({"loss": history, "accuracy": accuracy, "train_seconds": elapsed}, f)


if __name__ == "__main__":
    main()
