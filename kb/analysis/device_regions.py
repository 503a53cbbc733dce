"""What a region of code holds, for the device analysis: only text, a device choice, CUDA references."""

from __future__ import annotations

from typing import Protocol

import libcst as cst

from ..cst_helpers import TEXT, string_value
from ..cst_walk import children_of, walk
from .device_facts import DeviceFacts, is_cuda_value


class DeviceLookup(Protocol):
    """What a region is read with: the module's device facts and its names and parents (devices.py
    `DeviceAnalysis` is one; this module sits below it)."""

    facts: DeviceFacts

    def qualified(self, node: cst.CSTNode) -> str | None: ...
    def call_name(self, call: cst.Call) -> str | None: ...
    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None: ...


# Probes that a rule rewrites for XLA: a guard that holds one of them in its test must flip with it.
MIGRATED_PROBES = frozenset({"torch.cuda.is_bf16_supported"})
# Calls that choose the device or the process topology: code holding one is the path a TPU must take.
DEVICE_CHOICES = frozenset(
    {
        "torch.device",
        "torch.accelerator.current_accelerator",
        "torch.cuda.device_count",
        "torch.accelerator.device_count",
    }
)


def only_text(region: cst.CSTNode) -> bool:
    """Does `region` only build text (`log_msg.append('max mem: {memory}')`, `fmt += ' mem'`)? A CUDA guard
    around it prepares a log line for CUDA hosts: nothing a TPU host needs."""
    if isinstance(region, cst.Else):
        region = region.body
    if not isinstance(region, cst.IndentedBlock):
        return False
    for line in region.body:
        if not isinstance(line, cst.SimpleStatementLine):
            return False
        for small in line.body:
            if isinstance(small, (cst.Assign, cst.AugAssign)):
                text = isinstance(small.value, TEXT)
            elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                call = small.value  # `lines.append('...')`
                text = isinstance(call.func, cst.Attribute) and all(isinstance(a.value, TEXT) for a in call.args)
                text = text and bool(call.args)
            else:
                text = False
            if not text:
                return False
    return True


def device_path(analysis: DeviceLookup, region: cst.CSTNode) -> bool:
    """Does `region` choose the device: a device call, `.cuda()`, or a CUDA string that a rule rewrites (an
    origin, 'nccl', or one given right to a device consumer)?"""
    facts = analysis.facts
    for node in walk(region):
        if isinstance(node, cst.Call):
            name = analysis.call_name(node)
            func = node.func
            if name in DEVICE_CHOICES or name in MIGRATED_PROBES:
                return True
            if name is None and isinstance(func, cst.Attribute) and func.attr.value == "cuda":
                return True
        elif isinstance(node, cst.SimpleString):
            if (
                any(node is o for o in facts.string_origins)
                or any(node is o for o in facts.nccl_origins)
                or (is_cuda_value(node) and isinstance(analysis.parent(node), cst.Arg))
            ):
                return True
        elif isinstance(node, cst.FormattedString) and any(node is o for o in facts.string_origins):
            return True
    return False


# CUDA references that run without a CUDA driver (measured with torch 2.9 on a host without one): settings, probes
# that answer False or 0, seeds and cache calls that do nothing. What they mean on a TPU is other rules' business;
# they do not stop a program. (`synchronize`, `Event(...).record()`, `set_device`, `current_device`,
# `get_device_name`, `reset_peak_memory_stats` raise.)
HARMLESS_CALLS = (
    "torch.backends.",
    "torch.cuda.is_available",
    "torch.cuda.device_count",
    "torch.cuda.is_bf16_supported",
    "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all",
    "torch.cuda.empty_cache",
    "torch.cuda.memory_allocated",
    "torch.cuda.max_memory_allocated",
    "torch.cuda.nvtx.",
)


def region_verdict(analysis: DeviceLookup, region: cst.CSTNode) -> str | None:
    """ "blocked" when `region` calls CUDA-only code that needs a driver (beyond device values and moves, which the
    device rules rewrite everywhere, and HARMLESS_CALLS), else "device" when it chooses the device, else None."""
    for _, what in cuda_reference_list(analysis, region):
        if what.startswith("torch.") and not what.startswith(HARMLESS_CALLS):
            return "blocked"
    return "device" if device_path(analysis, region) else None


CUDA_MODULES = ("torch.cuda", "torch.backends.cuda", "torch.backends.cudnn", "torch.accelerator")
CUDA_METHODS = frozenset({"cuda", "pin_memory"})


def cuda_reference_list(analysis: DeviceLookup, root: cst.CSTNode) -> list[tuple[cst.CSTNode, str]]:
    """Every CUDA reference under `root`: (node, what) pairs, in syntax order. Imports are not references
    (an import alone does nothing on a TPU host; its uses are)."""
    found: list[tuple[cst.CSTNode, str]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Attribute):
            name = analysis.qualified(node)
            if name and any(name == m or name.startswith(m + ".") for m in CUDA_MODULES):
                found.append((node, name))
                continue
        elif isinstance(node, cst.Name):
            name = analysis.qualified(node)
            parent = analysis.parent(node)
            attr = isinstance(parent, cst.Attribute) and parent.attr is node
            if not attr and name and any(name.startswith(m + ".") for m in CUDA_MODULES):
                found.append((node, name))  # `from torch.cuda.amp import autocast`; autocast(...)
        elif isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in CUDA_METHODS and analysis.qualified(func) is None:
                found.append((node, f".{func.attr.value}()"))
        elif isinstance(node, cst.Import | cst.ImportFrom):
            continue
        elif isinstance(node, cst.SimpleString):
            if is_cuda_value(node) or string_value(node) == "nccl":
                found.append((node, repr(string_value(node))))
        elif isinstance(node, cst.FormattedString):
            if is_cuda_value(node):
                found.append((node, "f'cuda:...'"))
            continue
        stack.extend(reversed(children_of(node)))
    return found


def cuda_references(analysis: DeviceLookup, root: cst.CSTNode) -> list[tuple[cst.CSTNode, str]]:
    """The CUDA references under `root` (see `cuda_reference_list`) and the ints used as devices."""
    return cuda_reference_list(analysis, root) + [(n, "int used as a device") for n in analysis.facts.int_devices]
