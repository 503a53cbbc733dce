"""Every way torch_xla 2.9 cuts a step, 3 steps each: `xlaport check` must count 12 steps.
xm.mark_step(), xm.optimizer_step(barrier=True) and `with torch_xla.step()` all end in torch_xla.sync();
a second barrier right after a first launches nothing and must not count as a step of its own."""

import torch
import torch_xla
import torch_xla.core.xla_model as xm

torch.set_num_threads(1)
device = torch_xla.device()
model = torch.nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)


def forward_backward():
    loss = model(torch.randn(4, 8, device=device)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()


for _ in range(3):
    forward_backward()
    optimizer.step()
    xm.mark_step()
for _ in range(3):
    forward_backward()
    xm.optimizer_step(optimizer, barrier=True)
for _ in range(3):
    with torch_xla.step():
        forward_backward()
        optimizer.step()
for _ in range(3):
    forward_backward()
    optimizer.step()
    xm.mark_step()
    xm.optimizer_step(optimizer, barrier=True)  # nothing pending: no extra step
