"""A single-process trainer that addresses its GPU by index: an int rank handed down as the device, plus a
--device flag with CUDA choices for the evaluation copy."""

import argparse

import torch


class Runner:
    def __init__(self, model: torch.nn.Module, gpu_id: int) -> None:
        self.gpu_id = gpu_id
        self.model = model.to(gpu_id)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, x, y):
        x, y = x.to(self.gpu_id), y.to(self.gpu_id)
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss


def evaluate(model, device="cuda:0"):
    probe = torch.ones(2, 6, device=device)
    return model.to(device)(probe).sum()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--eval-device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    gpu = 0  # the first GPU
    runner = Runner(torch.nn.Linear(6, 1), gpu)
    for _ in range(3):
        loss = runner.step(torch.randn(4, 6), torch.randn(4, 1))
    print("device", next(runner.model.parameters()).device)
    print("eval", evaluate(runner.model, args.eval_device).device)
    print("loss", float(loss))
