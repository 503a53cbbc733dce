"""A typical mixed-precision GPU training script: float16 autocast, loss scaling with gradient clipping,
a step every batch and a log line every few batches."""

import torch
import torch.nn as nn
from torch.cuda.amp import GradScaler, autocast
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)

device = "cuda"
features = torch.randn(256, 20)
targets = (features[:, :5].sum(dim=1) > 0).long()
loader = DataLoader(TensorDataset(features, targets), batch_size=16, shuffle=True, drop_last=True)

model = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 2)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scaler = GradScaler()

for epoch in range(2):
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        if step % 8 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
