"""Planted fault: the loss takes the log of a value that goes negative, so the loss is NaN.
It is logged the recommended way (a step closure), so the check sees the NaN values the script reads."""

import torch
import torch_xla
import torch_xla.core.xla_model as xm

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)

for step in range(8):
    x = torch.randn(4, 8).to(device)
    loss = torch.log(model(x)).mean()  # model(x) is negative for some rows: log gives NaN
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    xm.add_step_closure(lambda step, loss: print(f"step {step} loss {loss.item():.4f}"), args=(step, loss))
