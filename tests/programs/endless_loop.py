"""A correctly migrated loop that never ends on its own (real scripts loop for NUM_BATCHES = 1e5):
`xlaport check --max-steps N` must stop it cleanly after N steps and grade those."""

import itertools

import torch
import torch_xla

torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
try:
    for step in itertools.count():
        x = torch.randn(2, 4, device=device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch_xla.sync()
finally:
    print("cleanup ran")
