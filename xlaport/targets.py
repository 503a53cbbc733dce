"""The backends a migration can aim at, and what each one can prove here. The one place that decides the target.

`torch_xla` (PyTorch/XLA 2.9): lazy tensors on the `xla` device; every kb entry is written for it, and this
machine runs it on the CPU (`PJRT_DEVICE=CPU`), so `check`/`verify` produce evidence.

`torch_tpu` (the `torch-tpu` 0.2.0 wheel, docs/torchtpu.md): an eager, native `tpu` device (torch's PrivateUse1
backend renamed), loaded by `import torch` through torch's backend autoload. It registers the device only when
libtpu finds a TPU chip, so nothing of a migrated program executes on a host without one: evidence for this
target needs a TPU host, and until it has some a migration is labelled unvalidated.
"""

from __future__ import annotations

from typing import Literal

Target = Literal["torch_xla", "torch_tpu"]
TARGETS: tuple[str, ...] = ("torch_xla", "torch_tpu")
DEFAULT_TARGET: Target = "torch_xla"

# The device string a rewrite puts where CUDA code named a GPU, per target.
DEVICE_STRING = {"torch_xla": "xla", "torch_tpu": "tpu"}

# What a target's validation can say on this machine (None: it runs here and gives evidence).
NO_EVIDENCE_HERE = {
    "torch_xla": None,
    "torch_tpu": "TorchTPU evidence needs a TPU host",
}

# The label of a migration that no run has checked.
UNVALIDATED = "unvalidated"


def check_target(name: str) -> str:
    """`name` when it is a known target; KeyError otherwise (as an unknown rule code: a usage error)."""
    if name not in TARGETS:
        raise KeyError(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}")
    return name


def evidence_note(target: str) -> str | None:
    """Why `check`/`verify` cannot give evidence for `target` on this machine; None when they can."""
    return NO_EVIDENCE_HERE[check_target(target)]
