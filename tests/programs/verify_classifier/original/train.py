"""A tiny classifier trained data-parallel on a CUDA GPU (the reference program of the verify tests).

Data parallelism is written out in one process: each of REPLICAS micro-batches plays a replica, the
replicas' gradients are averaged (the all-reduce), the averaged gradient is clipped, then the optimizer
steps. The loss has two terms (classification + an auxiliary regression head). The validation accuracy
is measured before training and every --eval-every steps, the best checkpoint is kept and reloaded at the end.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

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
    device = torch.device("cuda")
    features, labels, targets = make_data(4096, seed=1)
    val_features, val_labels, _ = make_data(1024, seed=2)
    val_features, val_labels = val_features.cuda(), val_labels.cuda()
    model = Net().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    batches = torch.Generator().manual_seed(3)

    print(f"initial eval_accuracy {evaluate(model, val_features, val_labels):.4f}")
    best = -1.0
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
        print(f"step {step} loss {torch.stack(losses).mean().item():.5f}")
        if (step + 1) % args.eval_every == 0:
            accuracy = evaluate(model, val_features, val_labels)
            print(f"step {step} eval_accuracy {accuracy:.4f}")
            if accuracy > best:
                best = accuracy
                torch.save(model.state_dict(), "best.pt")

    model.load_state_dict(torch.load("best.pt"))
    print(f"final eval_accuracy {evaluate(model, val_features, val_labels):.4f}")


if __name__ == "__main__":
    main()
