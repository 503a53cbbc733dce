"""Device picked through torch.accelerator behind a --no-accel switch, data moved inside helpers."""

import argparse

import torch


def train_step(model, opt, device, x, y):
    x, y = x.to(device), y.to(device)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-accel", action="store_true", help="train on the CPU")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    use_accel = not args.no_accel and torch.accelerator.is_available()
    if use_accel:
        device = torch.accelerator.current_accelerator()
    else:
        device = torch.device("cpu")
    loader_kwargs = {"batch_size": 4}
    if use_accel:
        loader_kwargs.update({"pin_memory": True})
    data = torch.utils.data.TensorDataset(torch.randn(12, 10), torch.randint(0, 3, (12,)))
    loader = torch.utils.data.DataLoader(data, **loader_kwargs)
    model = torch.nn.Linear(10, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _, (x, y) in zip(range(args.steps), loader, strict=False):
        loss = train_step(model, opt, device, x, y)
    print("device", next(model.parameters()).device)
    print("loss", float(loss))


if __name__ == "__main__":
    main()
