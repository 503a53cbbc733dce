"""A GPU training script split over modules in the style of larger projects: the epoch loop here, the batch
loop in loop.py, the optimizer step in support/updates.py. `xlaport migrate` must give the batch loop one
step barrier, so that after the warm-up steps nothing compiles again."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from loop import run_epoch
from support.updates import ClippedUpdate

torch.manual_seed(0)
torch.set_num_threads(1)

device = torch.device("cuda")
dataset = TensorDataset(torch.randn(64, 10), torch.randn(64, 1))
loader = DataLoader(dataset, batch_size=8, shuffle=True, drop_last=True)
model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
update = ClippedUpdate(max_norm=1.0)
for epoch in range(2):
    run_epoch(model, loader, optimizer, device, update)
    print(f"epoch {epoch} done")
