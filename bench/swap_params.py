"""Does torch's swap-on-conversion keep an optimizer built BEFORE `model.to(xla)` working? (research, no rule uses it)

`torch.__future__.set_swap_module_params_on_conversion(True)` makes `Module._apply` swap each Parameter's contents
in place (`torch.utils.swap_tensors`) instead of putting new Parameter objects in the module, so the objects an
optimizer (or a kept list, or a tie) already holds would follow the move. Without it, moving to XLA replaces the
Parameters and an optimizer built before trains nothing (XLA215 / XLA316 / the check's stale-optimizer reason).

For each case: the same seed, data and steps, trained five ways
    cpu           all on the CPU: the numbers every other way must give
    after         optimizer built AFTER the move, swap off (what the rules make today)
    before+swap   optimizer built BEFORE the move, swap on
    before+swap+reload  the same, then `optimizer.load_state_dict(optimizer.state_dict())` after the move (which
                  casts the optimizer's state to its parameters' device)
    before        optimizer built BEFORE the move, swap off (the fault, for contrast)
and compared: do the parameters change, do parameters and buffers equal those of `after` and of `cpu` (max abs
difference), does each Parameter stay the same object, does the tie hold. "holds": before+swap trains, keeps the
objects and the tie, and gives the numbers of `after` or of `cpu` (`after` loses a tie: the tied case needs `cpu`;
XLA's BatchNorm running_var differs from the CPU's: that case needs `after`).

    PJRT_DEVICE=CPU .venv/bin/python bench/swap_params.py [--json bench/results/swap_params_2026-12-04.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch_xla  # noqa: E402

STEPS = 3
TOLERANCE = 1e-5


class Tied(torch.nn.Module):
    """A tiny language model whose output layer shares the embedding's weight (GPT-2's lm_head.weight = wte.weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(11, 6)
        self.body = torch.nn.Linear(6, 6)
        self.lm_head = torch.nn.Linear(6, 11, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids):
        return self.lm_head(torch.tanh(self.body(self.wte(ids))))


def make(case: str):
    """(model, inputs, loss function, optimizer class) of one case, built on the CPU from seed 0."""
    torch.manual_seed(0)
    mse = lambda out: out.pow(2).mean()  # noqa: E731
    if case == "Linear":
        return torch.nn.Linear(5, 3), torch.randn(4, 5), mse, torch.optim.SGD
    if case == "Conv2d":
        return torch.nn.Conv2d(3, 4, 3, padding=1), torch.randn(2, 3, 6, 6), mse, torch.optim.SGD
    if case == "BatchNorm2d":
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
        return model, torch.randn(4, 3, 6, 6) * 2 + 1, mse, torch.optim.SGD
    if case == "Embedding":
        return torch.nn.Embedding(10, 4), torch.tensor([[1, 2, 3], [4, 5, 1]]), mse, torch.optim.SGD
    if case == "tied weight":
        return Tied(), torch.tensor([[1, 2, 3], [4, 5, 6]]), mse, torch.optim.SGD
    if case == "Adam state after a step":
        return torch.nn.Linear(5, 3), torch.randn(4, 5), mse, torch.optim.Adam
    raise ValueError(case)


def train(case: str, way: str) -> dict:
    """Trains one case one way; returns its final state (on the CPU) and what the move did to the Parameters."""
    swap = way.startswith("before+swap")
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        model, x, loss_of, optimizer_class = make(case)
        device = torch.device("cpu") if way == "cpu" else torch_xla.device()
        lr = {"lr": 0.1} if optimizer_class is torch.optim.SGD else {"lr": 0.05}
        early_step = case == "Adam state after a step"  # one step on the CPU, then the move, then the rest
        before_ids = [id(p) for p in model.parameters()]
        start = {k: v.detach().clone() for k, v in model.named_parameters()}
        optimizer = None
        if way != "after":
            optimizer = optimizer_class(model.parameters(), **lr)
        steps_left = STEPS
        if early_step and optimizer is not None:
            optimizer.zero_grad()
            loss_of(model(x)).backward()
            optimizer.step()
            steps_left -= 1
        model.to(device)
        identity_kept = [id(p) for p in model.parameters()] == before_ids
        if way == "before+swap+reload":
            optimizer.load_state_dict(optimizer.state_dict())
        if optimizer is None:
            optimizer = optimizer_class(model.parameters(), **lr)
        if early_step and way == "after":  # no stepped optimizer to carry over: a fresh one steps first
            optimizer.zero_grad()
            loss_of(model(x.to(device))).backward()
            optimizer.step()
            steps_left -= 1
        for _ in range(steps_left):
            optimizer.zero_grad()
            loss_of(model(x.to(device))).backward()
            optimizer.step()
            if device.type == "xla":
                torch_xla.sync()
        end = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # parameters and buffers
        tied = case != "tied weight" or model.lm_head.weight is model.wte.weight
        state_devices = sorted(
            {str(t.device) for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)}
        )
        return {
            "error": None,
            "start": start,
            "end": end,
            "identity_kept": identity_kept,
            "tied": tied,
            "state_devices": state_devices,
        }
    except Exception as error:  # a way that cannot run is a result: say what raised
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)


def max_diff(a: dict, b: dict) -> float:
    """The largest absolute difference over the keys of `a` (a tied weight is one key in both)."""
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


WAYS = ("cpu", "after", "before+swap", "before+swap+reload", "before")


def measure(case: str) -> dict:
    runs = {way: train(case, way) for way in WAYS}
    row: dict = {"case": case}
    cpu, after = runs["cpu"], runs["after"]
    for way, run in runs.items():
        if run["error"]:
            row[way] = {"error": run["error"]}
            continue
        row[way] = {
            "trains": max_diff(run["start"], run["end"]) > 0,
            "max_diff_vs_cpu": None if cpu["error"] else max_diff(run["end"], cpu["end"]),
            "max_diff_vs_after": None if after["error"] else max_diff(run["end"], after["end"]),
            "identity_kept": run["identity_kept"],
            "tied": run["tied"],
            "optimizer_state_on": run["state_devices"],
        }
    swap = row["before+swap"]
    row["holds"] = bool(
        "error" not in swap
        and swap["trains"]
        and any(swap[key] is not None and swap[key] <= TOLERANCE for key in ("max_diff_vs_after", "max_diff_vs_cpu"))
        and swap["identity_kept"]
        and swap["tied"]
    )
    return row


def cell(run: dict) -> str:
    if "error" in run:
        return "ERROR " + run["error"][:40]
    diffs = [run["max_diff_vs_after"], run["max_diff_vs_cpu"]]
    after, cpu = ("-" if diff is None else f"{diff:.1e}" for diff in diffs)
    return (
        f"trains={'yes' if run['trains'] else 'NO'} vs_after={after} vs_cpu={cpu}"
        f" same_obj={'yes' if run['identity_kept'] else 'no'}" + ("" if run["tied"] else " UNTIED")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    cases = ["Linear", "Conv2d", "BatchNorm2d", "Embedding", "tied weight", "Adam state after a step"]
    # the XLA device first: a CPU backward before it sizes autograd's device queues without XLA's, and every XLA
    # backward after that fails an internal assert (engine.cpp "device_ready_queues_")
    torch_xla.device()
    started, cpu_started = time.perf_counter(), time.process_time()
    rows = [measure(case) for case in cases]
    wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    print(f"torch {torch.__version__}, torch_xla {torch_xla.__version__}, PJRT_DEVICE={os.environ['PJRT_DEVICE']}")
    print(
        f"vs_after, vs_cpu: max abs difference of parameters and buffers after {STEPS} steps from the run that builds"
    )
    print("the optimizer after the move, and from the all-CPU run; same_obj: the move kept each Parameter object")
    print(f"{'case':<25} {'holds':<6} {'way':<19} result")
    for row in rows:
        for way in WAYS[1:]:
            holds = ("yes" if row["holds"] else "NO") if way == "before+swap" else ""
            print(f"{row['case'] if way == 'after' else '':<25} {holds:<6} {way:<19} {cell(row[way])}")
    for row in rows:
        swap = row["before+swap"]
        if "error" not in swap and swap["optimizer_state_on"]:
            print(f"  {row['case']}: optimizer state after the run on {', '.join(swap['optimizer_state_on'])}")
    print(
        f"all hold: {all(r['holds'] for r in rows)}; {wall_s:.1f} s wall, {cpu_s:.1f} s CPU (load {os.getloadavg()[0]:.1f})"
    )
    result = {
        "torch": torch.__version__,
        "torch_xla": torch_xla.__version__,
        "python": platform.python_version(),
        "steps": STEPS,
        "tolerance": TOLERANCE,
        "rows": rows,
        "all_hold": all(r["holds"] for r in rows),
        "wall_s": round(wall_s, 2),
        "cpu_s": round(cpu_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
