"""Planted fault: boolean-mask indexing, a data-dependent shape (aten::nonzero falls back to the CPU)."""

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)

for _ in range(8):
    x, y = torch.randn(6, 8).to(device), torch.randn(6, 1).to(device)
    error = (model(x) - y).pow(2)
    loss = error[y > 0].mean()  # keeps only some rows: the row count depends on the data
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
