"""One side of a differential test: import the module from its tree copy, run each case, save the results."""

from __future__ import annotations

import importlib
import os
import socket
import sys
import traceback
from typing import Any

from xlaport.eval.tied_weights import shared_groups

from .values import (
    draws_random_numbers,
    flatten,
    follow_moved_parameters,
    load_inputs,
    module_parameters,
    to_side,
    weighted_sum,
)


def enter_project(root: str, argv: list[str]) -> None:
    """The working directory, sys.path and sys.argv that the recorded command saw: the tree root as the
    working directory, the script's folder first on sys.path, the command's arguments in sys.argv."""
    os.chdir(root)
    sys.path.insert(0, root)
    if argv and argv[0] != "-m":
        sys.path.insert(0, os.path.join(root, os.path.dirname(argv[0])))
    sys.argv = list(argv[1:] if argv[:1] == ["-m"] else argv) or [""]


class NetworkBlocked(OSError):
    """User code tried to reach the network while testgen ran it."""


def block_network() -> None:
    """Makes every connection to a non-local address fail: importing or replaying user code must not
    download anything (a data-preparation module fetching a data set, a model hub). The sandbox's network
    namespace already does this where Linux allows it; this holds where it does not."""

    def refuse(address) -> None:
        host = address[0] if isinstance(address, tuple) and address else address
        if isinstance(host, str) and (host in ("localhost", "::1") or host.startswith("127.")):
            return
        raise NetworkBlocked(f"network access is blocked while xlaport testgen runs user code (to {address!r})")

    original_connect, original_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            refuse(address)
        return original_connect(self, address)

    def connect_ex(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            refuse(address)
        return original_connect_ex(self, address)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"


def _import(root: str, module: str, argv: list[str]):
    enter_project(root, argv)
    return importlib.import_module(module)


def _side_setup(side: str):
    """(device, device argument) for the side; installs the shim on the original side."""
    import torch

    if side == "original":
        from xlaport.eval import cuda_to_cpu

        cuda_to_cpu.install()
        return torch.device("cpu"), "cuda"
    import torch_xla
    import torch_xla.backends

    torch_xla.backends.set_mat_mul_precision("highest")  # on a TPU, fp32 matmuls otherwise use bf16 passes
    device = torch_xla.device()
    return device, device


def run_side(job: dict) -> dict:
    """Runs every case of the job on this side; {case name: {"outputs", "grads", "error"}} with CPU tensors."""
    results: dict[str, dict] = {}
    try:
        device, device_arg = _side_setup(job["side"])
        module = _import(job["root"], job["module"], job.get("argv", []))
    except BaseException as exc:  # noqa: BLE001 - import-time code is the user's
        error = _error_text(exc)
        return {case["name"]: {"outputs": {}, "grads": {}, "error": error} for case in job["cases"]}
    for case in job["cases"]:
        results[case["name"]] = run_case(job["side"], module, case, job["seed"], device, device_arg)
    return results


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc().splitlines(True)[-12:])


def run_case(side: str, module, case: dict, seed: int, device, device_arg) -> dict:
    """One target on this side: a module is built under `seed` (the migrated one then gets the
    original's weights), run in eval(), and back-propagated once through `weighted_sum`."""
    import torch

    result: dict[str, Any] = {"outputs": {}, "grads": {}, "error": None, "sharing": [], "notes": []}
    try:
        target = getattr(module, case["target"])
        inputs = load_inputs(case["inputs"], seed)
        if case["kind"] == "module":
            torch.manual_seed(seed)
            init_args = to_side(inputs["init_args"], "cpu", device_arg)
            init_kwargs = to_side(inputs["init_kwargs"], "cpu", device_arg)
            model = target(*init_args, **init_kwargs)
            if side == "original":
                torch.save(model.state_dict(), case["weights"])
            else:
                state = torch.load(case["weights"], map_location="cpu", weights_only=True)
                model.load_state_dict(state, strict=True)  # names must match: the migration kept the module
            model = model.to(device).eval()  # eval(): dropout would make the comparison random
            result["sharing"] = shared_groups(model)  # a move to XLA may untie weights (kb XLA314)
            args = to_side(inputs["args"], device, device_arg)
            kwargs = to_side(inputs["kwargs"], device, device_arg)
            outputs = flatten(model(*args, **kwargs), "output", {})
            loss = weighted_sum(outputs, seed)
            if loss is not None:
                loss.backward()
            result["grads"] = {f"grad[{name}]": p.grad for name, p in model.named_parameters() if p.grad is not None}
        else:
            torch.manual_seed(seed)
            before = module_parameters([*inputs["args"], *inputs["kwargs"].values()])
            args = to_side(inputs["args"], device, device_arg)
            kwargs = to_side(inputs["kwargs"], device, device_arg)
            follow_moved_parameters([*args, *kwargs.values()], before)
            outputs = flatten(target(*args, **kwargs), "output", {})
            # in-place changes to tensor arguments are results too, and so are the parameters of module
            # arguments (a training function's optimizer step) unless dropout draws on the device's generator
            for key, value in flatten(args, "args", {}).items():
                if isinstance(value, torch.Tensor):
                    outputs[f"{key} after the call"] = value
            for i, arg in enumerate(args):
                if isinstance(arg, torch.nn.Module):
                    if draws_random_numbers(arg):
                        result["notes"].append(
                            f"args[{i}] ({type(arg).__name__}) has dropout: its parameters after the call are not compared"
                        )
                        continue
                    for name, param in arg.named_parameters():
                        outputs[f"args[{i}].{name} after the call"] = param
        result["outputs"] = outputs
    except BaseException as exc:  # noqa: BLE001 - report anything the user code raised
        result["error"] = _error_text(exc)
    return _to_cpu(result)


def _to_cpu(result: dict) -> dict:
    import torch

    def cpu(value):
        return value.detach().cpu() if isinstance(value, torch.Tensor) else value

    try:
        result["outputs"] = {k: cpu(v) for k, v in result["outputs"].items()}
        result["grads"] = {k: cpu(v) for k, v in result["grads"].items()}
    except Exception as exc:  # a device error surfaces at the first read
        result["error"] = result["error"] or f"{type(exc).__name__} while reading results: {exc}"
        result["outputs"], result["grads"] = {}, {}
    return result
