"""Planted fault: torch.bincount has no XLA lowering and runs on the CPU every step."""

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Linear(8, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)

for _ in range(8):
    x = torch.randn(8, 8).to(device)
    labels = torch.randint(0, 4, (8,)).to(device)
    class_weight = 1.0 / (torch.bincount(labels, minlength=4).float() + 1.0)
    loss = torch.nn.functional.cross_entropy(model(x), labels, weight=class_weight)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
