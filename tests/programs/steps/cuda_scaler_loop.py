"""A GPU training script in the style of small GPT trainers: a `while True` loop, gradient accumulation,
batches sampled on the fly, the optimizer step through a loss scaler. Written for the CUDA device;
`xlaport migrate` must give it one step barrier so that it compiles once and then only replays."""

import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)
max_iters = 12
accumulate = 2
use_fp16 = False
data = torch.randint(0, 32, (2000,))

model = nn.Sequential(nn.Embedding(32, 16), nn.Flatten(), nn.Linear(16 * 8, 32)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.cuda.amp.GradScaler(enabled=use_fp16)


def get_batch():
    starts = torch.randint(0, len(data) - 9, (4,))
    x = torch.stack([data[i : i + 8] for i in starts])
    y = torch.stack([data[i + 8] for i in starts])
    return x.cuda(), y.cuda()


x, y = get_batch()
it = 0
while True:
    for micro in range(accumulate):
        loss = nn.functional.cross_entropy(model(x), y) / accumulate
        x, y = get_batch()
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if it % 4 == 0:
        print(f"iter {it}: loss {loss.item() * accumulate:.4f}")
    it += 1
    if it >= max_iters:
        break
