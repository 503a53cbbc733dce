"""A kb entry is a libcst rule class: its docs (what / why / example / fix safety) and its detector."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import ClassVar, Literal

import libcst as cst
from libcst.metadata import CodeRange

from .analysis.module import ModuleAnalysis
from .cst_helpers import whole_statement
from .finding import Applicability, Category

# How bad a finding is for a program on a TPU host (SARIF's levels): "error" it fails, trains on the wrong device or
# silently loses a setting; "warning" it runs, slower (host syncs, recompiles, CPU fallback) or with other numerics;
# "note" the code is harmless there (a no-op call, a deprecated spelling that still works).
Severity = Literal["error", "warning", "note"]
SEVERITY_BY_CATEGORY: dict[str, Severity] = {
    "C1": "error",
    "C2": "error",
    "C3": "error",
    "C4": "warning",
    "C5": "warning",
    "C6": "warning",
    "C7": "warning",
}

CATEGORY_NAMES: dict[str, str] = {
    "C1": "environment / dependencies",
    "C2": "CUDA / device assumptions",
    "C3": "third-party libraries (HF Trainer, PEFT, accelerate)",
    "C4": "lazy-tensor execution (host sync, recompilation)",
    "C5": "unsupported ops, CPU fallback, numerics",
    "C6": "memory capacity",
    "C7": "infrastructure",
}

# An import a rewrite needs: (module, name or None, alias or None).
# ("torch_xla", None, None) is `import torch_xla`;
# ("torch_xla.core.xla_model", None, "xm") is `import torch_xla.core.xla_model as xm`.
ImportSpec = tuple[str, str | None, str | None]

IMPORT_TORCH_XLA: ImportSpec = ("torch_xla", None, None)
IMPORT_XM: ImportSpec = ("torch_xla.core.xla_model", None, "xm")
IMPORT_PL: ImportSpec = ("torch_xla.distributed.parallel_loader", None, "pl")
IMPORT_XR: ImportSpec = ("torch_xla.runtime", None, "xr")
IMPORT_TORCH: ImportSpec = ("torch", None, None)
IMPORT_XLA_BACKENDS: ImportSpec = ("torch_xla.backends", None, None)

# The device expression rewrites put where CUDA code named a GPU.
XLA_DEVICE = "torch_xla.device()"

# torch's float32 matmul precision -> the equivalent `torch_xla.backends.set_mat_mul_precision` value.
MATMUL_PRECISIONS = {"highest": "highest", "high": "high", "medium": "default"}
SET_MATMUL_PRECISION = "torch_xla.backends.set_mat_mul_precision"

# Removes the reported statement; the engine keeps its leading comments.
REMOVE = cst.RemovalSentinel.REMOVE


@dataclass
class Report:
    """One detection inside a parsed module, before it becomes a Finding."""

    node: cst.CSTNode
    message: str
    replacement: cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel | None = None
    imports: tuple[ImportSpec, ...] = ()
    # The node the replacement swaps when it is not `node` (e.g. a block whose statements are
    # reordered, while the finding points at one statement of it).
    target: cst.CSTNode | None = None
    # This occurrence's applicability when it differs from the rule's (Ruff's per-fix applicability):
    # an unsafe rule whose analysis is certain here keeps the numbers, so its fix is safe.
    fix: Applicability | None = None


class Rule(cst.BatchableCSTVisitor):
    """Base class of every kb rule. Subclasses set the entry fields and visit nodes.

    The docs fields follow Ruff's rule pages: what it detects, why it matters on TPU
    (the symptom), an example before/after, and whether the fix is safe to apply blind.
    `before` must trigger the rule; when the rule rewrites, fixing `before` gives `after`.
    """

    # None: names, parents and positions come from `self.analysis`, which resolves each only when asked.
    METADATA_DEPENDENCIES = ()

    code: ClassVar[str]
    title: ClassVar[str]
    category: ClassVar[Category]
    fix: ClassVar[Applicability]
    detects: ClassVar[str]
    why: ClassVar[str]
    before: ClassVar[str]
    after: ClassVar[str] = ""
    message: ClassVar[str] = ""
    # None: SEVERITY_BY_CATEGORY of the category (see `severity_of`)
    severity: ClassVar[Severity | None] = None
    symptoms: ClassVar[tuple[str, ...]] = ()
    references: ClassVar[tuple[str, ...]] = ()
    # Snippets that must produce no finding of this rule (Fixit's "valid" examples).
    valid: ClassVar[tuple[str, ...]] = ()
    # Does the rule rewrite code (for the occurrences it can handle)?
    autofix: ClassVar[bool] = False
    # Words (lower case) of which the source must contain one, in any case, for the rule to report anything there;
    # the engine does not run the rule on other sources (most rules on most files). Every part of an import-resolved
    # name is spelled in the text, by its import or its attribute chain (`from torch import cuda as c; c.synchronize()`
    # spells "cuda" and "synchronize"), so a rule about `torch.cuda.*` may need "cuda". Empty: the rule always runs.
    needs: ClassVar[tuple[str, ...]] = ()
    # The backends (xlaport/targets.py) this entry is about. An entry about torch_xla's lazy tensors (step barriers,
    # recompiles) says nothing about an eager `tpu` device, so entries apply to torch_xla unless they say more
    # (`targets = TARGETS` where detection, message and fix hold on TorchTPU as they stand).
    targets: ClassVar[tuple[str, ...]] = ("torch_xla",)

    # Set by the engine before the visit: the facts about the module that its rules share.
    analysis: ModuleAnalysis

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[Report] = []

    def get_visitors(self) -> dict[str, Callable[[cst.CSTNode], object]]:
        """Same result as libcst's `get_visitors`, which inspects ~1,700 attributes per instance on every
        traversal (90% of lint time with 100 rules). The visitor names only depend on the class."""
        names = _visitor_names(type(self))
        return {name: getattr(self, name) for name in names}

    # --- reporting -----------------------------------------------------------------
    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        replacement: cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel | None = None,
        imports: tuple[ImportSpec, ...] = (),
        target: cst.CSTNode | None = None,
        fix: Applicability | None = None,
    ) -> None:
        self.reports.append(Report(node, message or self.message or self.title, replacement, imports, target, fix))

    def report_removal(self, call: cst.Call) -> None:
        """Reports `call`, with its statement's removal as the fix when the call is the whole statement."""
        line = whole_statement(self, call)
        if line is not None:
            self.report(line, replacement=REMOVE)
        else:
            self.report(call)

    # --- name resolution -----------------------------------------------------------
    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        """Import-resolved dotted names of `node` (never locals: `cuda = 1; cuda.x` is not torch.cuda)."""
        return self.analysis.imported_names(node)

    def call_name(self, call: cst.Call) -> str | None:
        names = self.qualified_names(call.func)
        return min(names) if names else None

    def is_call_to(self, node: cst.CSTNode, *names: str) -> bool:
        # by exact type: isinstance on libcst's classes goes through ABCMeta (this runs for every call and rule)
        return type(node) is cst.Call and not self.qualified_names(node.func).isdisjoint(names)

    # --- tree context ----------------------------------------------------------------
    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.analysis.parent(node)

    def ancestors(self, node: cst.CSTNode):
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The statement line (or compound statement) that holds `node`."""
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return anc
        return None

    def position(self, node: cst.CSTNode) -> CodeRange:
        return self.analysis.position(node)


def severity_of(rule: type[Rule]) -> Severity:
    """The rule's own severity, else its category's."""
    return rule.severity or SEVERITY_BY_CATEGORY[rule.category]


@cache
def _visitor_names(cls: type) -> list[str]:
    """The visitor methods a rule class defines (dir's order). Read from the class dicts of its own classes: libcst's
    visitor bases define a no-op for every node type, ~1,700 attributes that `dir` listed for every rule class of
    every process (~0.1 s of a command's start-up and of each worker's)."""
    own = {
        name
        for klass in cls.__mro__
        if klass is not object and not klass.__module__.startswith("libcst")
        for name in vars(klass)
        if name.startswith(("visit_", "leave_"))
    }
    names = []
    for name in sorted(own):
        attr = getattr(cls, name)
        if callable(attr) and not getattr(attr, "_is_no_op", False):
            names.append(name)
    return names
