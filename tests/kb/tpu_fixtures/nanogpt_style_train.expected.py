"""A small GPT-style training script written for this test (nanoGPT's shape: seeding, device guard, autocast,
DDP start-up, torch.compile), on CUDA."""

import os

import torch
import torch.distributed as dist
from torch import nn

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group(backend="tpu")
device = "tpu" if torch.accelerator.is_available() else "cpu"
torch.manual_seed(1337)
torch.tpu.manual_seed(1337)


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        return self.head(self.embed(idx))


model = TinyGPT().to("tpu")
model = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.cuda.amp.GradScaler()
for _ in range(10):
    x = torch.randint(0, 64, (4, 16), device=device)
    y = torch.randint(0, 64, (4, 16)).to("tpu")
    with torch.autocast(device_type="tpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
torch.accelerator.synchronize()
print(loss.item())
