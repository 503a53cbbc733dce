"""A migrated script configured by module globals that `--name=value` arguments override (an executed
overrides file). The device line says the XLA device; `--device=cpu` on the command line replaces it."""

import os

import torch
import torch_xla  # noqa: F401  (registers the "xla" device)

device = "xla"
steps = 40
lr = 0.1
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "overrides.py")).read())

torch.manual_seed(0)
model = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
for _ in range(steps):
    x = torch.randn(8, 4).to(device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
