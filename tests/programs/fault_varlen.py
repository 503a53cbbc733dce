"""Planted fault: every batch has a new sequence length, so every step compiles a new graph."""

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)

for step in range(8):
    tokens = torch.randint(0, 32, (2, 5 + step)).to(device)  # length 5, 6, 7, ...: no padding
    loss = model(tokens).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
