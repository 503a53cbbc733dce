"""What the pipeline returns: typed results every front serializes as they are (JSON, OpenAPI, MCP).

A patch or a migration is "validated" only when every check ran and passed; a check that failed makes
it "rejected" (with the reason); checks that were not asked for, not allowed or could not run leave it
"unvalidated", saying why (`verdict`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from xlaport.kb import Finding
from xlaport.kb.hits import FixHit

from xlaport.targets import DEFAULT_TARGET, Target

from .phases import PhaseTime

Status = Literal["validated", "rejected", "unvalidated"]


def _whole_number(value: object) -> object:
    """43.0 is 43: JSON has one kind of number and many clients write every number as a float. 43.5, true and
    "43" are still refused (the models are strict)."""
    return int(value) if type(value) is float and value.is_integer() else value


WholeInt = Annotated[int, BeforeValidator(_whole_number)]  # an integer field that accepts a whole-number float


class ManualItem(BaseModel):
    """A finding no rule (and no model) fixed, with the kb entries that fit it best."""

    finding: Finding  # kb's dataclass: pydantic validates and serializes it as it is
    function: str = Field(description="Qualified name of the enclosing function, or <module>.")
    retrieved: list[FixHit]
    migrated_line: int | None = Field(
        None, description="The finding's line in the migrated text (`finding.line` is in the original file's)."
    )


class CheckRun(BaseModel):
    """One validation step and what it found."""

    name: Literal["xla_check", "generated_tests"]
    passed: bool | None = Field(description="None: the check could not run (tool missing, nothing to test).")
    level: str | None = None
    reasons: list[str] = []
    report: dict[str, Any] = {}


class Evidence(BaseModel):
    codes_applied: list[str]
    codes_left: list[str]
    rewritten_functions: list[str] = Field([], description="Functions the code model rewrote.")
    model: str | None = Field(None, description="The code model that rewrote them (None: the rules alone).")
    checks: list[CheckRun] = []
    level: str | None = None
    validated: bool = False
    status: Status = "unvalidated"
    reason: str | None = Field(None, description="Why the patch is rejected or unvalidated.")
    ran: str | None = Field(None, description="What validation ran: the command and its folder, or the tests alone.")


class Patch(BaseModel):
    path: str
    changed: bool
    diff: str
    migrated: str
    applied: list[Finding]
    manual: list[ManualItem]
    evidence: Evidence
    notes: list[str] = []


class SuggestOptions(BaseModel):
    model_config = ConfigDict(strict=True)  # as declared: 0 is not false

    unsafe_fixes: bool = Field(False, description="Also apply fixes that may change behaviour.")
    target: Target = Field(DEFAULT_TARGET, description="The backend to migrate to: torch_xla or torch_tpu.")
    select: list[str] | None = Field(None, description="Codes, prefixes or categories (C1..C7) to use.")
    ignore: list[str] | None = Field(None, description="Codes, prefixes or categories to skip.")
    k: WholeInt = Field(3, ge=0, le=20, description="Fixes retrieved per finding left for a human.")
    validate_patch: bool = Field(False, description="Run the XLA execution check and generated tests.")
    args: list[str] = Field([], description="Arguments of the file's own entry point when validation runs it.")
    command: str | None = Field(
        None,
        description='The command validation runs, as typed in `cwd`, e.g. "python train.py --epochs 1" (its script '
        "may be another file of the project that uses this one). Default: the file's own entry point with `args`; "
        "a module without one is validated by generated tests of its functions and classes.",
    )
    cwd: str | None = Field(
        None, description='The folder of the project the command is typed in, relative to its root. Default: ".".'
    )
    timeout_s: float = Field(300.0, gt=0, le=3600, description="Seconds each validation run may take.")
    memory_mb: WholeInt = Field(4096, ge=256, le=65536, description="Memory limit of each validation run, in MiB.")


class MigrateOptions(BaseModel):
    unsafe_fixes: bool | None = Field(
        None, description="Also apply fixes that may change behaviour; None: the configuration's unsafe-fixes, else no."
    )
    target: Target = Field(DEFAULT_TARGET, description="The backend to migrate to: torch_xla or torch_tpu.")
    select: list[str] | None = None
    ignore: list[str] | None = None
    k: int = Field(3, ge=0, le=20)
    jobs: int | None = Field(None, ge=1, le=64, description="Worker processes; None: one per core for 8+ files.")
    validate_cmd: str | None = Field(
        None, description='Entry command in the migrated tree, e.g. "python train.py --steps 20".'
    )
    verify_cmd: str | None = Field(
        None, description="Command for verify (L0–L4 against the original); the same as validate_cmd runs it once."
    )
    in_place: bool = False
    force: bool = False
    optimize: bool = Field(
        False,
        description="After validation/verify, try performance rewrites one at a time and keep those the evidence "
        "supports (xlaport optimize); needs validate_cmd or verify_cmd.",
    )
    keep_trace: bool = Field(
        False,
        description="Keep the migration trace (every changed file's and function's source, before and after) "
        "beside the migrated tree and in the training trace file; off by default: it holds the user's code.",
    )
    config: str | None = Field(
        None, description="The lint configuration file; None: the nearest above the source (kb/lint_config.py)."
    )
    isolated: bool = Field(False, description="Read no lint configuration ([tool.xlaport]: select, exclude, ...).")
    timeout_s: float = Field(600.0, gt=0, le=7200)
    memory_mb: int = Field(8192, ge=256, le=131072)


class CheckOutcome(BaseModel):
    script: str
    check: CheckRun


class FixEntry(BaseModel):
    entry: dict[str, Any]
    markdown: str


class FileOutcome(BaseModel):
    path: str
    status: Literal["changed", "unchanged", "error"]
    diff: str = ""
    codes_applied: list[str] = []
    manual: list[ManualItem] = []
    rewritten_functions: list[str] = []
    model: str | None = None  # the code model that rewrote functions of this file
    notes: list[str] = []
    error: str | None = None


class Validation(BaseModel):
    command: str | None = None
    checks: list[CheckRun] = []
    level: str | None = None
    validated: bool = False
    status: Status = "unvalidated"
    reason: str | None = None


class VerifyOutcome(BaseModel):
    """Verify's verdict (L0–L4 against a reference run of the original) and its full report."""

    command: str
    status: Literal["pass", "fail", "inconclusive"]
    level: str
    exit_code: int
    reasons: list[str] = []
    report: dict[str, Any] = Field(
        {}, description="Everything verify measured (xlaport.eval.verify.report.VerifyReport)."
    )
    reports: dict[str, str] = Field({}, description="Where its HTML and JSON were written, if anywhere.")

    def to_dict(self) -> dict[str, Any]:
        """The verify report's own form (what `xlaport verify` renders)."""
        return self.report


class MigrationResult(BaseModel):
    run_id: str
    src: str
    dst: str | None
    in_place: bool
    written: bool  # False when --in-place and validation rejected the migration
    python_files: int
    files_changed: int
    other_files_copied: int
    errors: list[str]
    fixes_applied: dict[str, int]
    findings_left: dict[str, int]
    files: list[FileOutcome]
    validation: Validation
    verification: VerifyOutcome | None = None
    optimization: dict[str, Any] | None = None  # serve/optimize.py's report, with --optimize
    notes: list[str] = []
    report_dir: str
    reports: dict[str, str] = {}
    wall_s: float = 0.0
    phases: list[PhaseTime] = []  # where wall_s went (serve/phases.py)

    def summary(self) -> dict[str, Any]:
        """The short form the CLI prints (same keys as before, plus validation and reports)."""
        return {
            "src": self.src,
            "dst": self.dst,
            "in_place": self.in_place,
            "written": self.written,
            "python_files": self.python_files,
            "files_changed": self.files_changed,
            "other_files_copied": self.other_files_copied,
            "fixes_applied": self.fixes_applied,
            "findings_left": self.findings_left,
            "errors": self.errors,
            "left_for_human": [m.finding.to_dict() for f in self.files for m in f.manual],
            "validation": {
                "status": self.validation.status,
                "level": self.validation.level,
                "reason": self.validation.reason,
            },
            "verification": None
            if self.verification is None
            else {
                "status": self.verification.status,
                "level": self.verification.level,
                "reasons": self.verification.reasons,  # what failed, or what would decide: a caller acts on them
            },
            "optimization": None
            if self.optimization is None
            else {"status": self.optimization["status"], "reason": self.optimization["reason"]},
            "notes": self.notes,
            "reports": self.reports,
            "wall_s": self.wall_s,
        }


# --- the verdict of a list of checks ---------------------------------------------------------------
def verdict(checks: list[CheckRun]) -> tuple[Status, str | None, str | None]:
    """(status, reason, level) of a list of check runs."""
    if not checks:
        return "unvalidated", "validation was not requested", None
    failed = [c for c in checks if c.passed is False]
    if failed:
        reasons = "; ".join(f"{c.name}: {', '.join(c.reasons) or 'failed'}" for c in failed)
        return "rejected", reasons, _level(checks)
    missing = [c for c in checks if c.passed is None]
    if missing:
        reasons = "; ".join(f"{c.name}: {', '.join(c.reasons) or 'did not run'}" for c in missing)
        return "unvalidated", reasons, _level(checks)
    return "validated", None, _level(checks)


def _level(checks: list[CheckRun]) -> str | None:
    return next((c.level for c in checks if c.name == "xla_check" and c.level), None)


def with_verdict(evidence: Evidence, checks: list[CheckRun]) -> Evidence:
    status, reason, level = verdict(checks)
    return evidence.model_copy(
        update={
            "checks": checks,
            "status": status,
            "reason": reason,
            "level": level,
            "validated": status == "validated",
        }
    )
