"""Performance rewrites the optimization stage tries (`xlaport optimize`): one module per family.

Each family turns a module's text into another text that should compute the same thing with fewer host
waits or compiles. None of them is applied by `fix`/`migrate`: a rewrite here is only a *candidate*, kept
when a run of the program shows that it pays and the training curve stays where it was (serve/optimize.py).

    rewrite(source, path, lines) -> Rewrite | None

`lines` are the lines the execution check measured a cost at (host reads, compiles); empty means "wherever
the pattern is found" (propose-only mode, nothing measured). Families:

- `logging_reads`: per-step reads for logging (`loss.item()` in a print, a log call, an accumulator) into
  a step closure (`xm.add_step_closure`) or a device-side accumulator;
- `fixed_generation`: a sampling loop that grows its sequence by `torch.cat` into a fixed-size buffer with the
  position kept on the device (one graph for every token);
- `kb_unsafe`: the kb's own unsafe fixes that remove a per-step cost (bfloat16 without GradScaler, MpDeviceLoader).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Rewrite:
    """A family's rewrite of one module: the new text, the lines it answers, and what it did in words."""

    family: str
    text: str
    lines: list[int]  # the lines of the original text the rewrite answers
    summary: str
    notes: list[str] = field(default_factory=list)  # sites it left alone, and why


FAMILIES = ("logging_reads", "fixed_generation", "bf16_no_scaler", "device_loader")
