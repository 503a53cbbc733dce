"""A device flip carries what it makes live (issue #24).

On a TPU host the original program falls back to the CPU: `'cuda' if torch.cuda.is_available() else 'cpu'` gives
'cpu', so code behind `if 'cuda' in device:` or `device_type != 'cpu'` never runs there. The flips (XLA203's
fallback, XLA226's CUDA origins, XLA230's guards) make the device XLA, and that code runs. Each flip is kept only
when every CUDA reference it makes reachable is rewritten by a safe fix of the same pass (XLA501 turns a bfloat16
CUDA autocast into the XLA one, XLA205 drops a cuDNN flag, ...); otherwise the flip is withheld, its finding says
which call blocks it, and the program keeps running on the CPU as before instead of dying at start-up.

The blockers are CUDA-only calls (`torch.cuda.*`, `torch.backends.*`, `torch.accelerator.*` that need a driver);
device values and moves in that code (`'cuda'`, `.cuda()`) are the choice the flip is for, and XLA201/202/226
rewrite them. Two kinds of code become live: what a flipped guard protects, and the non-CPU branch of a CPU test on a device
value (`ctx = nullcontext() if device_type == 'cpu' else torch.cuda.amp.autocast(...)`). The first withholds that
guard's flip; the second the flips that make that value XLA: its CUDA origins, the guards and the fallbacks that
assign it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import libcst as cst

from .analysis.device_facts import key_of
from .analysis.device_regions import HARMLESS_CALLS, cuda_reference_list
from .analysis.devices import DeviceAnalysis
from .cst_walk import walk

# the flips per target (TorchTPU's twins: TPU204 the guard's string, TPU205 the origins, TPU207 string guards)
ORIGIN_CODES = frozenset({"XLA226", "TPU205"})
GUARD_CODES = frozenset({"XLA230", "TPU207"})
FALLBACK_CODES = frozenset({"XLA203", "TPU204"})
FLIP_CODES = ORIGIN_CODES | GUARD_CODES | FALLBACK_CODES
HARMLESS_WITHOUT_CUDA = frozenset({"XLA501"})
# What a script kept on the CPU (devices.cpu_utility) does not get: the flips, and the rewrites that put its device,
# tensors or generator on the accelerator or assume they are there: `.cuda()`, `"cuda"`, a GPU index, CUDA tensor
# types, `torch.accelerator`, CUDA seeding, the GPU count, the compile backend, a sampling loop's barrier, a load
# moved to the device (on TorchTPU its `torch.cuda.*` calls). They stay reported, as manual findings.
CPU_KEPT_CODES = FLIP_CODES | frozenset(
    {
        *("XLA201", "XLA202", "XLA207", "XLA211", "XLA216", "XLA227", "XLA228", "XLA232", "XLA418", "XLA711"),
        *("TPU201", "TPU202", "TPU203", "TPU401"),
    }
)
Span = tuple[tuple[int, int], tuple[int, int]]


class Detected(Protocol):
    """What the audit reads of an engine detection."""

    start: tuple[int, int]
    end: tuple[int, int]

    @property
    def code(self) -> str: ...
    @property
    def node(self) -> cst.CSTNode: ...
    @property
    def safe_fix(self) -> bool: ...


@dataclass(frozen=True)
class Blocker:
    """A CUDA reference that a flip would make reachable, with no safe rewrite in the same pass."""

    what: str  # `torch.cuda.Event`, `.cuda()`
    line: int
    because: str  # the test that kept it from running on a TPU host


def blocked_flips(
    analysis: DeviceAnalysis,
    detections: list[Detected],
    span_of: Callable[[cst.CSTNode], Span],
    dead: list[Span],
) -> dict[int, Blocker]:
    """index in `detections` -> the blocker, for each flip that must be withheld. `span_of`: a node's
    ((line, column), (line, column)); `dead`: the spans of code a TPU host never runs (quiet CUDA guards)."""
    # what a safe fix rewrites, and CUDA autocasts (XLA501): without CUDA one is a no-op, and a bfloat16 one, which
    # raises there, is a safe fix
    # (a guard's own flip rewrites the whole `if`: what its block holds is what the audit asks about)
    fixed = [
        (d.start, d.end)
        for d in detections
        if (d.safe_fix or d.code in HARMLESS_WITHOUT_CUDA) and d.code not in GUARD_CODES
    ]
    flips = {i: d for i, d in enumerate(detections) if d.code in FLIP_CODES}
    if not flips:
        return {}

    def blocker(region: cst.CSTNode, because: str) -> Blocker | None:
        for node, what in cuda_reference_list(analysis, region):
            if what.startswith(HARMLESS_CALLS):
                continue
            # device values and moves ('cuda', `.cuda()`) are the choice the flip is for when a safe fix of the
            # same pass rewrites them (XLA201/202/226); one that none rewrites (`devices.append('cuda')`) would
            # run as CUDA and blocks the flip like a CUDA-only call
            span = span_of(node)
            if any(_within(span, s) for s in dead) or any(_within(span, s) for s in fixed):
                continue
            if any(node is s for s in analysis.facts.string_origins):
                continue  # a device value the device flow knows: XLA202/226 rewrite it (when selected)
            return Blocker(what, span[0][0], because)
        return None

    out: dict[int, Blocker] = {}
    facts = analysis.facts
    for guard in facts.guards:
        if not guard.flips:
            continue
        found = next((b for r in guard.regions if (b := blocker(r, _code(guard.condition)))), None)
        if found is None:
            # `device.startswith('cuda')` on a parameter that `@pytest.mark.parametrize('device', ['cpu', 'cuda'])`
            # feeds: the flipped test no longer matches the value it was written for, which stays CUDA
            found = next(
                (
                    b
                    for value in _parametrized_values(analysis, guard.test)
                    if (b := blocker(value, _code(guard.condition)))
                ),
                None,
            )
        if found is not None:
            for i, d in flips.items():
                if d.code in GUARD_CODES and d.node is guard.test:
                    out[i] = found
    for key, test in facts.cpu_tests:
        found = next((b for r in test.regions if (b := blocker(r, _code(test.condition)))), None)
        if found is None:
            continue
        for i, d in flips.items():
            if i not in out and key in _flip_keys(analysis, d):
                out[i] = found
    return out


CPU_UTILITY = (
    "kept on the CPU: this script loads, converts or saves models and never trains (no backward, no optimizer "
    "step); on a TPU host it ran on the CPU, and its saves need CPU tensors. Rewrite the device by hand "
    "(`torch_xla.device()`) if it should run on the TPU"
)
CPU_KEPT = (
    "not rewritten, the script is kept on the CPU (it loads, converts or saves models and never trains; its saves "
    "need CPU tensors): "
)


def message(code: str, blocker: Blocker) -> str:
    device = "TorchTPU" if code.startswith("TPU") else "XLA"
    return (
        f"not rewritten: this flip makes the device {device}, and then `{blocker.what}` at line {blocker.line} runs "
        f"(a TPU host never ran it: `{blocker.because}` kept it on the CPU path), which needs CUDA; rewrite it "
        f"for {device} first, then migrate again"
    )


def _parametrized_values(analysis: DeviceAnalysis, test: cst.CSTNode) -> list[cst.CSTNode]:
    """The value lists of the `@pytest.mark.parametrize` decorators that feed the parameter a string test reads
    (`'cuda' in device`, `device.startswith('cuda')`, `device.type == 'cuda'`): what that parameter can be."""
    if not isinstance(test, cst.SimpleString):
        return []
    parent = analysis.parent(test)
    if isinstance(parent, cst.Arg):  # `device.startswith('cuda')`
        call = analysis.parent(parent)
        tested = call.func.value if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) else None
    else:  # `'cuda' in device`, `device.type == 'cuda'`
        comparison = analysis.parent(parent) if isinstance(parent, cst.ComparisonTarget) else parent
        if not isinstance(comparison, cst.Comparison):
            return []
        sides = (comparison.left, comparison.comparisons[0].comparator)
        tested = next((side for side in sides if side is not test), None)
    while isinstance(tested, cst.Attribute):
        tested = tested.value
    if not isinstance(tested, cst.Name):
        return []
    function = next((n for n in _ancestors(analysis, test) if isinstance(n, cst.FunctionDef)), None)
    if function is None or tested.value not in {param.name.value for param in function.params.params}:
        return []
    values = []
    for decorator in function.decorators:
        call = decorator.decorator
        if not (isinstance(call, cst.Call) and len(call.args) >= 2 and _code(call.func).endswith("parametrize")):
            continue
        names = call.args[0].value
        if isinstance(names, cst.SimpleString) and tested.value in names.evaluated_value.replace(",", " ").split():
            values.append(call.args[1].value)
    return values


def _ancestors(analysis: DeviceAnalysis, node: cst.CSTNode):
    parent = analysis.parent(node)
    while parent is not None:
        yield parent
        parent = analysis.parent(parent)


def _flip_keys(analysis: DeviceAnalysis, d: Detected) -> set[str]:
    """The device keys whose value the flip `d` makes XLA: an origin's key, the target of the assignment around
    a fallback or a guard (`device = 'cuda' if ... else 'cpu'`), or what a guarded block assigns (`if
    torch.cuda.is_available(): device = 'cuda'`)."""
    if d.code in ORIGIN_CODES:
        key = analysis.facts.origin_keys.get(id(d.node))
        if key is not None:
            return {key}
    node: cst.CSTNode | None = d.node
    while node is not None and not isinstance(node, cst.SimpleStatementLine):
        parent = analysis.parent(node)
        if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1:
            return {key_of(parent.targets[0].target)} - {None}  # type: ignore[return-value]
        if isinstance(parent, cst.AnnAssign) and parent.value is node:
            return {key_of(parent.target)} - {None}  # type: ignore[return-value]
        if isinstance(parent, cst.If) and parent.test is node:
            targets = (t.target for n in walk(parent.body) if isinstance(n, cst.Assign) for t in n.targets)
            return {key_of(t) for t in targets} - {None}  # type: ignore[return-value]
        node = parent
    return set()


def _code(node: cst.CSTNode) -> str:
    text = cst.Module(body=[]).code_for_node(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _within(inner: Span, outer: Span) -> bool:
    return outer[0] <= inner[0] and inner[1] <= outer[1]
