"""Correct, but one host sync per step: a kept GradScaler reads its inf check (found_inf) on the host before
each optimizer step. The step ends with a barrier, so the graph does not grow: L2 with a performance finding
at the `scaler.step` line."""

import torch
import torch_xla

torch.set_num_threads(1)
torch.manual_seed(0)
device = torch_xla.device()
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)).to(device)
opt = torch.optim.Adam(net.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler("xla", init_scale=1024.0)

for _ in range(9):
    features = torch.randn(8, 16).to(device)
    labels = torch.randint(0, 2, (8,)).to(device)
    with torch.autocast("xla", dtype=torch.bfloat16):
        logits = net(features)
    loss = torch.nn.functional.cross_entropy(logits.float(), labels)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch_xla.sync()
