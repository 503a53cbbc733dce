"""A small CUDA training program for the optimization stage (xlaport optimize): a causal character model
(every position's logits see only the tokens up to it), its loss read with `.item()` and printed every step,
optionally GradScaler + float16 autocast (--amp), and optionally a greedy continuation grown by `torch.cat`
one token at a time (--generate N). Seeded: two runs print the same numbers."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 32

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--amp", action="store_true")
parser.add_argument("--generate", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class CausalMean(nn.Module):
    """Embeds the tokens, averages each prefix, predicts the next token: causal by construction."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, idx):
        h = self.embed(idx)
        counts = torch.arange(1, idx.size(1) + 1, device=idx.device, dtype=h.dtype)[None, :, None]
        return self.head(torch.tanh(torch.cumsum(h, dim=1) / counts))


model = CausalMean().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
data = torch.randint(0, VOCAB, (64, 17), generator=torch.Generator().manual_seed(1))

for step in range(args.steps):
    start = (step * 8) % 64
    batch = data[start : start + 8].to(device)
    x, y = batch[:, :-1], batch[:, 1:]
    with torch.autocast("cuda", dtype=torch.float16, enabled=args.amp):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), y.reshape(-1))
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(f"step {step} loss {loss.item():.4f}")

if args.generate:
    model.eval()
    idx = data[:2, :4].to(device)
    with torch.no_grad():
        for _ in range(args.generate):
            logits = model(idx)
            logits = logits[:, -1, :]
            next_token = torch.argmax(logits, dim=-1, keepdim=True)
            idx = torch.cat((idx, next_token), dim=1)
    print("generated:", idx.tolist())
