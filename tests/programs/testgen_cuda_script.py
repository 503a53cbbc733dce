"""A small CUDA training script (fixture): must run unchanged under xlaport.eval.cuda_to_cpu."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

assert torch.cuda.is_available(), "needs a GPU"
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = True
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)
torch.cuda.set_device(0)
device = torch.device("cuda")

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.cuda.amp.GradScaler()
data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
loader = DataLoader(data, batch_size=8, pin_memory=True)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for step, (x, y) in enumerate(loader):
    if step == args.steps:
        break
    x, y = x.to(device, non_blocking=True), y.cuda(non_blocking=True)
    noise = torch.zeros(8, 1, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x) + noise
        loss = nn.functional.mse_loss(out, y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.cuda.synchronize()
    print(f"step {step} loss {loss.item():.6f} dtype {out.dtype} device {out.device}")
end.record()
print(f"elapsed_ms {start.elapsed_time(end):.3f} mem {torch.cuda.max_memory_allocated()} scale {scaler.get_scale()}")
torch.cuda.empty_cache()
