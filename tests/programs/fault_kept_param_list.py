"""Planted fault: the model keeps a list of its parameters from __init__ (`self.body_params = list(...)`), and
the optimizer's groups are built from that list after model.to(device). The move replaced the parameters, so the
list (and the optimizer) hold the old CPU copies. Built after the move, and still stale: the reason must say why."""

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 1)
        self.body_params = list(self.body.parameters())  # kept: goes stale when the model moves
        self.head_params = list(self.head.parameters())

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


device = torch_xla.device()
model = Net().to(device)
optimizer = torch.optim.Adam(
    [{"params": model.body_params, "weight_decay": 0.01}, {"params": model.head_params}], lr=1e-2
)

for _ in range(8):
    x, y = torch.randn(4, 8).to(device), torch.randn(4, 1).to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
