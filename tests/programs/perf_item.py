"""Correct, but slow on XLA: `loss.item()` logged every step waits for the device (and runs the forward as its
own graph before the sync). The numbers are unchanged: L2 with a performance finding at the print line."""

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)

for step in range(8):
    x, y = torch.randn(4, 8).to(device), torch.randn(4, 1).to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    print(f"step {step} loss {loss.item():.4f}")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
