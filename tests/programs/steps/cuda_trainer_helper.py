"""A GPU trainer class: the epoch loop calls a `_step_on_batch` helper that runs backward and the optimizer
step. Written for the CUDA device; `xlaport migrate` must put one step barrier per batch."""

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


class Trainer:
    def __init__(self, model, loader, optimizer):
        self.model = model
        self.loader = loader
        self.optimizer = optimizer

    def _step_on_batch(self, features, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(features), targets)
        loss.backward()
        self.optimizer.step()

    def _epoch(self, epoch):
        for features, targets in self.loader:
            self._step_on_batch(features.cuda(), targets.cuda())
        print(f"epoch {epoch} done")

    def train(self, epochs):
        for epoch in range(epochs):
            self._epoch(epoch)


dataset = TensorDataset(torch.randn(96, 10), torch.randn(96, 1))
loader = DataLoader(dataset, batch_size=8, shuffle=True, drop_last=True)
model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
Trainer(model, loader, optimizer).train(epochs=2)
