"""What the torch_tpu target can execute on this host: run with the TorchTPU environment's python
(`scripts/setup.sh --target torch_tpu`, then `.venv-torchtpu/bin/python scripts/torchtpu_probe.py`).
Prints one line per question; never raises. docs/torchtpu.md quotes its output."""

import warnings

warnings.filterwarnings("ignore")


def attempt(what: str, action) -> None:
    try:
        print(f"{what}: {action()!r}")
    except Exception as exc:  # the answer is the error itself
        print(f"{what}: raised {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")


import torch  # noqa: E402

print(f"torch {torch.__version__}")
attempt("import torch_tpu", lambda: __import__("torch_tpu").__name__)
attempt("torch.accelerator.is_available()", torch.accelerator.is_available)
attempt("torch.accelerator.device_count()", torch.accelerator.device_count)
attempt("torch.ones(2, device='tpu') + 1", lambda: (torch.ones(2, device="tpu") + 1).cpu().tolist())
attempt("torch.autocast('tpu')", lambda: torch.autocast("tpu").__enter__() and "entered")
attempt("torch.compile(lambda x: x * 2)(torch.ones(2))", lambda: torch.compile(lambda x: x * 2)(torch.ones(2)).tolist())
