"""Measurement: what loss scaling (GradScaler) and float16 autocast cost on the XLA device.

    PJRT_DEVICE=CPU .venv/bin/python bench/grad_scaler.py [--steps 8]

Each variant trains the same small MLP for `--steps` steps in its own process (one `torch_xla.sync()` per
step) and reports, per step after two warm-up steps, the compilations, graph executions, device-to-host
transfers and `.item()`-style host reads (torch_xla.debug.metrics), plus the compute dtype and the losses.
Prints a table and the JSON. The facts it measured are in the GradScaler entry (XLA502) and the notes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

VARIANTS = {
    # name: (scaler, autocast, optimizer)
    "fp32, no scaler": ("none", "off", "sgd"),
    "cuda scaler + cuda autocast (default migrate)": ("cuda", "cuda", "sgd"),
    "amp scaler 'xla' + xla float16 autocast": ("xla", "xla-fp16", "sgd"),
    "amp scaler 'xla' + xla bfloat16 autocast": ("xla", "xla-bf16", "sgd"),
    "disabled scaler + xla float16 autocast": ("disabled", "xla-fp16", "sgd"),
    "cuda scaler + syncfree SGD": ("cuda", "cuda", "syncfree"),
    "no scaler + xla bfloat16 autocast (--unsafe-fixes)": ("none", "xla-bf16", "sgd"),
}


def run_variant(scaler_kind: str, autocast_kind: str, optimizer_kind: str, steps: int) -> dict:
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met

    torch.manual_seed(0)
    device = torch_xla.device()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    if optimizer_kind == "syncfree":
        from torch_xla.amp import syncfree

        optimizer = syncfree.SGD(model.parameters(), lr=0.05)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = {
        "none": None,
        "cuda": lambda: torch.amp.GradScaler("cuda"),
        "xla": lambda: torch.amp.GradScaler("xla"),
        "disabled": lambda: torch.amp.GradScaler("xla", enabled=False),
    }[scaler_kind]
    scaler = scaler() if scaler else None
    autocast = {
        "off": lambda: torch.autocast("cpu", enabled=False),
        "cuda": lambda: torch.autocast("cuda", dtype=torch.float16),
        "xla-fp16": lambda: torch.autocast("xla", dtype=torch.float16),
        "xla-bf16": lambda: torch.autocast("xla", dtype=torch.bfloat16),
    }[autocast_kind]
    xs, ys = torch.randn(steps, 8, 16), torch.randn(steps, 8, 1)

    def counters() -> dict:
        found = {k: (met.metric_data(k) or (0,))[0] for k in ("CompileTime", "ExecuteTime", "TransferFromDeviceTime")}
        return found | {"HostReads": met.counter_value("aten::_local_scalar_dense") or 0}

    per_step, losses, dtype = [], [], None
    for i in range(steps):
        before = counters()
        optimizer.zero_grad()
        with autocast():
            out = model(xs[i].to(device))
            dtype = str(out.dtype).removeprefix("torch.")
            loss = torch.nn.functional.mse_loss(out.float(), ys[i].to(device))
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        torch_xla.sync()
        losses.append(loss.detach())
        after = counters()
        per_step.append({k: after[k] - before[k] for k in after})
    warm = per_step[2:]
    return {
        "dtype": dtype,
        "scaler_enabled": None if scaler is None else scaler.is_enabled(),
        "final_scale": float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None,
        "per_step_after_warmup": {k: sum(s[k] for s in warm) / len(warm) for k in warm[0]},
        "losses": [round(float(x), 6) for x in losses],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # the child's side
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(*VARIANTS[args.variant], args.steps)))
        return
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    results = {}
    for name in VARIANTS:
        done = subprocess.run(
            [sys.executable, __file__, "--steps", str(args.steps), "--variant", name],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        results[name] = json.loads(lines[-1]) if lines else {"error": done.stderr[-500:]}
    print(f"{'variant':52} {'dtype':9} {'scaler':7} {'compiles':>8} {'execs':>6} {'transfers':>9} {'host reads':>10}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:52} error: {r['error'].splitlines()[-1] if r['error'] else '?'}")
            continue
        s = r["per_step_after_warmup"]
        print(
            f"{name:52} {r['dtype']:9} {str(r['scaler_enabled']):7} {s['CompileTime']:8.2f} {s['ExecuteTime']:6.2f} "
            f"{s['TransferFromDeviceTime']:9.2f} {s['HostReads']:10.2f}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
