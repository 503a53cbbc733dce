"""CUDA references left in migrated code that nobody owns: neither rewritten nor reported.

After `migrate`, every CUDA reference (`torch.cuda.*`, cuDNN, `torch.accelerator`, `.cuda()`, a CUDA device
string, `'nccl'`, an int used as a device) must be either gone, inside a quiet CUDA guard (code a TPU host
never runs, see devices.py), or on a statement that still carries a finding for the user. Anything else is a
silent leftover: the migrated program may fail or run on the CPU while the report says nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ..finding import Finding
from .device_regions import cuda_references
from .devices import DeviceAnalysis


@dataclass(frozen=True)
class Leftover:
    line: int
    what: str
    code: str  # the source line, stripped

    def __str__(self) -> str:
        return f"{self.line}: {self.what}: {self.code}"


def _statement_lines(wrapper: MetadataWrapper) -> dict[cst.CSTNode, tuple[int, int]]:
    positions = wrapper.resolve(PositionProvider)
    return {n: (p.start.line, p.end.line) for n, p in positions.items()}


def silent_leftovers(source: str, findings: list[Finding]) -> list[Leftover]:
    """CUDA references in `source` not covered by `findings` (on the same statement) nor by a quiet guard."""
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    spans = _statement_lines(wrapper)
    analysis = DeviceAnalysis(module)
    dead = [spans[n] for n in analysis.facts.dead_regions() if n in spans]
    # the test of a guard that does not flip is False on a TPU host, as intended: the TPU takes the path the
    # author wrote for machines without CUDA (what it protects is still scanned, unless the guard is quiet)
    dead += [spans[g.condition] for g in analysis.facts.guards if not g.flips and g.condition in spans]
    reported = {f.line for f in findings}
    lines = source.splitlines()
    out = []
    for node, what in cuda_references(analysis, module):
        start, end = spans[node]
        if any(a <= start and end <= b for a, b in dead):
            continue
        first, last = _statement_span(analysis, node, spans)
        if any(first <= line <= last for line in reported):
            continue
        out.append(Leftover(start, what, lines[start - 1].strip()))
    return sorted(set(out), key=lambda x: x.line)


def _statement_span(
    analysis: DeviceAnalysis, node: cst.CSTNode, spans: dict[cst.CSTNode, tuple[int, int]]
) -> tuple[int, int]:
    """The lines of the simple statement holding `node` (or of the `if`/`while` test it sits in)."""
    current: cst.CSTNode | None = node
    while current is not None:
        parent = analysis.parent(current)
        if isinstance(current, cst.SimpleStatementLine) or (
            isinstance(parent, (cst.If, cst.While)) and getattr(parent, "test", None) is current
        ):
            return spans[current]
        if isinstance(current, (cst.Import, cst.ImportFrom)):
            return spans[current]
        current = parent
    return spans[node]


__all__ = ["DeviceAnalysis", "Leftover", "silent_leftovers"]
