"""A correctly migrated loop in the MpDeviceLoader style: the loader cuts the steps,
xm.optimizer_step updates, logging through a step closure. `xlaport check` must grade it L2."""

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
dataset = TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
loader = pl.MpDeviceLoader(DataLoader(dataset, batch_size=4, drop_last=True), device)

for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    xm.optimizer_step(optimizer)
    xm.add_step_closure(lambda step, loss: print(f"step {step} loss {loss.item():.4f}"), args=(step, loss))
