"""The verify tests' correct migration of ../original/train.py to torch_xla (hand-written).

Same program on the XLA device: `torch_xla.device()` instead of CUDA, one `torch_xla.sync()` per step so
every step is one graph, and the per-step losses kept on the device and printed after training (one
host transfer instead of one per step). Evaluation reads its accuracy on the host to pick the best
checkpoint, as the original does.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla

REPLICAS = 2
MICRO_BATCH = 16


def make_data(n, seed):
    centers = 0.6 * torch.randn(4, 16, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=gen)
    features = centers[labels] + torch.randn(n, 16, generator=gen)
    return features, labels, features[:, :4].tanh()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.Tanh())
        self.classify = nn.Linear(64, 4)
        self.regress = nn.Linear(64, 4)

    def forward(self, x):
        hidden = self.body(x)
        return self.classify(hidden), self.regress(hidden)


def all_reduce_mean(grads_per_replica):
    return [torch.stack(grads).mean(0) for grads in zip(*grads_per_replica)]


def evaluate(model, features, labels):
    model.eval()
    with torch.no_grad():
        logits, _ = model(features)
    model.train()
    return (logits.argmax(-1) == labels).float().mean().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--max-grad-norm", type=float, default=0.1)
    parser.add_argument("--aux-weight", type=float, default=0.5)
    parser.add_argument("--eval-every", type=int, default=20)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch_xla.device()
    features, labels, targets = make_data(4096, seed=1)
    val_features, val_labels, _ = make_data(1024, seed=2)
    val_features, val_labels = val_features.to(device), val_labels.to(device)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    batches = torch.Generator().manual_seed(3)

    print(f"initial eval_accuracy {evaluate(model, val_features, val_labels):.4f}")
    best = -1.0
    history = []
    for step in range(args.steps):
        grads, losses = [], []
        for _ in range(REPLICAS):
            index = torch.randint(0, len(labels), (MICRO_BATCH,), generator=batches)
            x, y, t = features[index].to(device), labels[index].to(device), targets[index].to(device)
            logits, predicted = model(x)
            loss = F.cross_entropy(logits, y) + args.aux_weight * F.mse_loss(predicted, t)
            optimizer.zero_grad()
            loss.backward()
            # a parameter the loss does not reach has no gradient: it contributes zeros to the average
            grads.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in model.parameters()])
            losses.append(loss.detach())
        for param, grad in zip(model.parameters(), all_reduce_mean(grads)):
            param.grad = grad
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        history.append(torch.stack(losses).mean())
        torch_xla.sync()
        if (step + 1) % args.eval_every == 0:
            accuracy = evaluate(model, val_features, val_labels)
            print(f"step {step} eval_accuracy {accuracy:.4f}")
            if accuracy > best:
                best = accuracy
                torch.save(model.state_dict(), "best.pt")

    for step, value in enumerate(torch.stack(history).cpu().tolist()):
        print(f"step {step} loss {value:.5f}")
    model.load_state_dict(torch.load("best.pt"))
    print(f"final eval_accuracy {evaluate(model, val_features, val_labels):.4f}")


if __name__ == "__main__":
    main()
