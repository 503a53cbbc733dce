"""Planted fault: the optimizer step goes through `GradScaler.step`, so no step barrier was placed.

Nothing calls torch_xla.sync(): GradScaler reads `found_inf` with .item() every step, which runs a graph
holding every step so far; the graph (and its compile time) grows each iteration.
"""

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("xla")

for _step in range(100_000):
    x, y = torch.randn(16, 32).to(device), torch.randn(16, 1).to(device)
    with torch.autocast("xla", dtype=torch.bfloat16):
        loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
