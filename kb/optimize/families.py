"""Every family behind one call, and the kb's own unsafe fixes that remove a per-step cost as families.

plan(family, source, path, lines) -> (Rewrite | None, notes)
"""

from __future__ import annotations

from ..engine import fix_source, lint_source
from ..registry import select_rules
from . import FAMILIES, Rewrite, fixed_generation, logging_reads

# families that are the kb's unsafe fixes: bfloat16 autocast without a GradScaler (no inf check on the host every
# step), and MpDeviceLoader (batches moved to the device in the background, a barrier per batch)
KB_FAMILIES = {"bf16_no_scaler": ("XLA501", "XLA502", "XLA503"), "device_loader": ("XLA408",)}
# the families whose rewrite changes the numbers (not only when they are read): they need a curve to judge them
CHANGES_NUMBERS = frozenset({"bf16_no_scaler"})
DESCRIPTIONS = {
    "logging_reads": "per-step host reads for logging -> step closures (xm.add_step_closure) or device accumulators",
    "fixed_generation": "a sequence grown by torch.cat every token -> a fixed-size buffer, logits read at the position",
    "bf16_no_scaler": "GradScaler + float16 autocast -> bfloat16 autocast without the scaler (kb XLA501-503)",
    "device_loader": "a host-side input pipeline -> pl.MpDeviceLoader (kb XLA408)",
}


def plan(
    family: str, source: str, path: str, lines: list[int] | tuple[int, ...] = ()
) -> tuple[Rewrite | None, list[str]]:
    """The family's rewrite of `source` at `lines` (empty: wherever it applies), and notes on what it left."""
    if family == "logging_reads":
        return logging_reads.plan(source, path, lines)
    if family == "fixed_generation":
        return fixed_generation.plan(source, path, lines)
    if family in KB_FAMILIES:
        return _kb_fix(family, source, path)
    raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")


def _kb_fix(family: str, source: str, path: str) -> tuple[Rewrite | None, list[str]]:
    codes = KB_FAMILIES[family]
    rules = select_rules(list(codes))
    result = fix_source(source, path, rules, unsafe=True)
    left = [f"{f.path}:{f.line}: {f.code} left: {f.message}" for f in result.remaining if f.code in codes]
    if not result.changed:
        return None, left
    applied = sorted({f.line for f in result.applied})
    summary = (
        f"kb {', '.join(sorted({f.code for f in result.applied}))} applied at line(s) {', '.join(map(str, applied))}"
    )
    return Rewrite(family=family, text=result.fixed, lines=applied, summary=summary, notes=left), left


def static_sites(source: str, path: str) -> dict[str, list[int]]:
    """Where each family's pattern is in a module, by the kb's findings (what `optimize` proposes when nothing
    was measured): family -> lines."""
    sites: dict[str, list[int]] = {}
    codes = {c: fam for fam, cs in KB_FAMILIES.items() for c in cs}
    codes |= {"XLA401": "logging_reads", "XLA402": "logging_reads", "XLA403": "logging_reads"}
    codes |= {"XLA404": "logging_reads", "XLA417": "fixed_generation"}
    for finding in lint_source(source, path, select_rules(sorted(codes))):
        sites.setdefault(codes[finding.code], []).append(finding.line)
    return sites
