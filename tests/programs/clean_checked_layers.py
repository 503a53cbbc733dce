"""Correct loop whose forward pass checks every layer's output on the host (`if torch.isnan(h).any(): raise`,
as normalizing-flow code does): within the first step each check compiles a bigger graph (the forward so far),
then every later step reuses those graphs. Not a missing step barrier: the barrier follows each optimizer step."""

import torch
import torch_xla


class CheckedStack(torch.nn.Module):
    def __init__(self, layers: int = 10) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
            if torch.isnan(x).any():
                raise RuntimeError("a layer produced NaN")
        return x


torch.manual_seed(0)
device = torch_xla.device()
model = CheckedStack().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(8):
    x = torch.randn(4, 8, device=device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
