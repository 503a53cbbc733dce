"""Planted fault: a host read that changes the computation. `int()` of a device count sets the slice length,
so the graph's shapes follow the data and every step compiles a new graph: repeated compilation (not L2),
and the read itself is also listed as a host sync."""

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)

for step in range(8):
    x = torch.randn(16, 4).to(device)
    positive = int((x[:, 0] > 0).sum())  # how many rows to keep: a value only the device knows
    loss = model(x[: max(positive, 1)]).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
