"""C5 — `torch.inference_mode` on XLA tensors: a tensor made inside it cannot be moved to the device."""

from __future__ import annotations

import libcst as cst

from ..cst_helpers import expr
from ..rule import IMPORT_TORCH
from ..step_rule import StepContextRule


class InferenceModeOnXla(StepContextRule):
    code = "XLA521"
    needs = ("inference_mode",)
    title = "`torch.inference_mode` breaks moving new tensors to the XLA device"
    category = "C5"
    fix = "safe"
    autofix = True
    detects = (
        "`torch.inference_mode()` as a context manager or decorator (also bare `@torch.inference_mode`). The fix "
        "uses `torch.no_grad()`; a call with arguments (`mode=...`) is left for a human."
    )
    why = (
        "torch_xla 2.9 cannot give an inference tensor an XLA twin: `.to(xla)` of a tensor created inside "
        "`inference_mode` raises `RuntimeError: Cannot set version_counter for inference tensor` (measured), so "
        "an evaluation loop that builds or moves its batches there dies on the first batch. `no_grad` computes the "
        "same values without gradients; inference mode only skips version counting, a CPU/GPU bookkeeping saving."
    )
    before = "import torch\n\nwith torch.inference_mode():\n    loss = model(batch.to(device))\n"
    after = "import torch\n\nwith torch.no_grad():\n    loss = model(batch.to(device))\n"
    message = (
        "`torch.inference_mode` raises on XLA when a tensor made inside it is moved to the device "
        "('Cannot set version_counter for inference tensor'); use `torch.no_grad()`"
    )
    symptoms = ("RuntimeError: Cannot set version_counter for inference tensor",)
    valid = (
        "import torch\n\nwith torch.no_grad():\n    y = model(x)\n",
        "import torch\n\nenabled = torch.is_inference_mode_enabled()\n",
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, "torch.inference_mode", "torch.autograd.grad_mode.inference_mode"):
            return
        if node.args:  # inference_mode(False) turns it off; inference_mode(mode=flag) may: a human decides
            self.report(node)
            return
        self.report(node, replacement=expr("torch.no_grad()"), imports=(IMPORT_TORCH,))

    def visit_Decorator(self, node: cst.Decorator) -> None:
        # a bare `@torch.inference_mode` (the called form is a Call, seen by visit_Call)
        if isinstance(node.decorator, cst.Call) or "torch.inference_mode" not in self.qualified_names(node.decorator):
            return
        self.report(node.decorator, replacement=expr("torch.no_grad()"), imports=(IMPORT_TORCH,))
