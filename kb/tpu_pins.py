"""The library-version trap of TorchTPU: pinned transformers/accelerate releases that do not know the `tpu` device.

The study's TorchTPU run (seeds/002, IV-C) kept its project's pins of transformers and accelerate; releases from
before the `tpu` device existed pick the device by asking CUDA, MPS, XLA..., find none, and silently place the
model and every batch on the CPU. Nothing fails: training is just slow and the TPU idle. Which release first
knows `tpu` is not something this machine can establish (no TPU here, see docs/torchtpu.md), so every pin that
holds these libraries at or below a version is reported for a human to check on a TPU host.

Why there is no fix (raising the pin): the torch-tpu 0.2.0 wheel does not name a release. Its METADATA requires
neither library (Requires-Dist: numpy, absl-py, libtpu, portpicker, tensorboard, frozendict, immutabledict, pyzmq,
torch) and its README's dependency section reads "TBD"; its one reference to transformers,
`_internal/optimizers/single_trace_trainer.py`, patches `transformers.masking_utils.is_tracing` only where that
exists (a hasattr test), which names no version either; accelerate appears nowhere in it (read in
.venv-torchtpu, 2026-12-04). A pin raised to a guessed version could be as wrong as the old one.
"""

from __future__ import annotations

import re
from pathlib import PurePath

from .configs import ConfigRule
from .finding import Finding

TRAPPED = ("transformers", "accelerate")
# `transformers==4.30.2`, `accelerate<0.21`, `"transformers~=4.31"`: a requirement that caps the version.
CAPPING_PIN = re.compile(
    r"""(?<![\w.-])(?P<name>transformers|accelerate)\s*(?:\[[^\]]*\])?\s*(?P<spec>(?:==|<=|<|~=|===)\s*[\w.*+!-]+)""",
    re.IGNORECASE,
)


def is_pin_file(path: str | PurePath) -> bool:
    """requirements*.txt, *.in lock inputs and pyproject.toml: where a project pins its libraries."""
    name = PurePath(path).name.lower()
    return name == "pyproject.toml" or (name.startswith("requirements") and name.endswith((".txt", ".in")))


class LibraryPinPredatesTpu(ConfigRule):
    code = "TPU101"
    title = "transformers/accelerate pinned to a release that may not know the `tpu` device"
    category = "C1"
    fix = "manual"
    targets = ("torch_tpu",)
    example_path = "requirements.txt"
    detects = (
        "`transformers` or `accelerate` held at or below a version (`==`, `<`, `<=`, `~=`) in requirements files "
        "or pyproject.toml."
    )
    why = (
        "Releases that predate TorchTPU's `tpu` device do not list it among the devices they probe, so Trainer and "
        "accelerate put the model and the batches on the CPU without an error (the study's TorchTPU failure). "
        "Check that the pinned release knows `tpu` (or lift the pin) and confirm on a TPU host that "
        "`next(model.parameters()).device.type == 'tpu'`. Report only: the torch-tpu 0.2.0 wheel (metadata, "
        "README, code) names no transformers/accelerate release, so the first one that knows `tpu` is not known "
        "here and no pin is raised for you."
    )
    before = "torch>=2.11\ntransformers==4.30.2\naccelerate<0.21\n"
    message = (
        "pinned {name}{spec}: a release that predates the `tpu` device silently trains on the CPU; check it knows `tpu`"
    )
    valid = ("torch>=2.11\ntransformers>=4.30\n",)


def lint_pins(text: str, path: str) -> list[Finding]:
    """TPU101 findings in the text of a pin file (see is_pin_file)."""
    rule = LibraryPinPredatesTpu
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        code = line.split("#", 1)[0]
        for match in CAPPING_PIN.finditer(code):
            spec = re.sub(r"\s+", "", match.group("spec"))
            found.append(
                Finding(
                    path=path,
                    line=number,
                    column=match.start() + 1,
                    code=rule.code,
                    category=rule.category,
                    title=rule.title,
                    message=rule.message.format(name=match.group("name").lower(), spec=spec),
                    fix=rule.fix,
                )
            )
    return found
