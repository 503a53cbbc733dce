"""A CUDA training script configured through module-level variables that `--key=value` arguments override
(the configurator idiom): the device, its type for autocast, the dtype and the backend are plain values."""

import sys
from contextlib import nullcontext

import torch

backend = "nccl"  # only used when launched for several processes
device = "cuda"  # 'cpu', 'cuda', 'cuda:1', ...
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
steps = 3
for arg in sys.argv[1:]:  # --device=cpu --steps=5
    key, value = arg.removeprefix("--").split("=")
    globals()[key] = type(globals()[key])(value)

device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
amp = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
if torch.cuda.is_available():
    torch.cuda.manual_seed(7)  # CUDA-only housekeeping


def batch():
    x = torch.randn(8, 16)
    y = torch.randn(8, 1)
    if device_type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(steps):
    x, y = batch()
    with amp:
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("device", next(model.parameters()).device, "dtype", dtype, "autocast", device_type)
print("loss", float(loss))
