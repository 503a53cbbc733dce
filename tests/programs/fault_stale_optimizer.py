"""Planted fault: the optimizer is built before model.to(device), so it holds the old CPU parameters.
Nothing raises; the model simply never changes."""

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)  # built too early
model.to(device)

for _ in range(8):
    x, y = torch.randn(4, 8).to(device), torch.randn(4, 1).to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
