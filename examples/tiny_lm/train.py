"""A tiny character-level GPT with best-checkpoint saving (written for an NVIDIA GPU).

The corpus is generated from a small grammar with a fixed seed, so every run sees the same text.
Training keeps the checkpoint with the best validation loss and reloads it for the final evaluation.
"""

import argparse
import json
import math
import os
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

SUBJECTS = ["the model", "a tensor", "the device", "my kernel", "the graph", "our loss"]
VERBS = ["compiles", "moves", "trains", "syncs", "falls back", "converges"]
OBJECTS = ["on the chip", "to the host", "every step", "in bf16", "without errors", "slowly"]


def make_corpus(n_sentences, seed):
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(n_sentences)
    )


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab, block_size, dim=64, heads=4, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        mask = torch.triu(torch.full((block_size, block_size), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def get_batch(data, block_size, batch_size, gen):
    starts = torch.randint(0, len(data) - block_size - 1, (batch_size,), generator=gen)
    x = torch.stack([data[s : s + block_size] for s in starts])
    y = torch.stack([data[s + 1 : s + 1 + block_size] for s in starts])
    return x.cuda(), y.cuda()


@torch.no_grad()
def val_loss(model, data, block_size, batches=4):
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    total = torch.zeros((), device="cuda")
    for _ in range(batches):
        x, y = get_batch(data, block_size, 32, gen)
        logits = model(x)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    model.train()
    return (total / batches).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--out-dir", default="checkpoints")
    parser.add_argument("--metrics-out", default="metrics.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    text = make_corpus(2000, seed=0)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = TinyGPT(len(chars), args.block_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, fused=True)
    os.makedirs(args.out_dir, exist_ok=True)
    best_path = os.path.join(args.out_dir, "best.pt")

    gen = torch.Generator().manual_seed(1)
    losses, evals, best = [], [], math.inf
    for step in range(args.steps):
        x, y = get_batch(train_data, args.block_size, 32, gen)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.detach())
        if (step + 1) % args.eval_every == 0:
            current = val_loss(model, val_data, args.block_size)
            evals.append({"step": step + 1, "val_loss": current})
            print(f"step {step + 1} val_loss {current:.4f}")
            if current < best:
                best = current
                torch.save(model.state_dict(), best_path)

    model.load_state_dict(torch.load(best_path, map_location="cuda"))
    final = val_loss(model, val_data, args.block_size)
    print(f"best val_loss {best:.4f} reloaded val_loss {final:.4f}")
    history = [float(v) for v in torch.stack(losses).cpu()]
    with open(args.metrics_out, "w") as f:
        json.dump({"loss": history, "evals": evals, "val_loss": final}, f)


if __name__ == "__main__":
    main()
