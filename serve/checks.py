"""The evidence behind a verdict: thin adapters from xlaport.eval's checks to the pipeline's results.

- the XLA execution check (`xlaport.eval.check`): L0/L2 of one script, in a sandboxed child;
- the generated original-vs-migrated tests (`xlaport.eval.testgen`);
- verify (`xlaport.eval.verify`): L0–L4 of a migrated tree against a reference run of the original.
  Verify runs the execution check itself; `check_run_of_verify` lets validation reuse that run when
  both were asked for with the same command, so the program is executed once for both.
"""

from __future__ import annotations

from pathlib import Path

from xlaport.eval import testgen
from xlaport.eval.check import run_check
from xlaport.eval.sandbox import SandboxRefused
from xlaport.eval.verify.api import verify_tree
from xlaport.eval.verify.config import VerifyConfig
from xlaport.eval.verify.report import VerifyReport
from xlaport.kb import Finding, SourceError, lint_source
from xlaport.kb.symptoms import explain_error

from .inputs import parse_command
from .phases import Step
from .results import CheckRun, VerifyOutcome


def run_xla_check(
    script: Path,
    args: list[str],
    timeout_s: float,
    memory_mb: int,
    workdir: Path | None = None,
    project: Path | None = None,
    reveal: bool = True,
    module: str | None = None,
) -> CheckRun:
    """The execution check on `script` (in a sandboxed child): passed means L2. `workdir`: the tree the command
    runs from (a project that reads files by relative path needs its root); the run sees it through a private
    view, so what the program writes (checkpoints, logs) does not land in the tree. Without a workdir (a script
    a client named) nothing the sandbox user could not read is shown to it: such a run is refused, with the
    reason, and never made as root. `project`: the tree around `workdir` the run sees (default: `workdir`).
    `reveal` False: a user's own folder named by a server's client (MCP `check_xla` with `cwd`): the project is
    found around `workdir` and nothing the sandbox user could not read is shown to it. `module`: run
    `python -m MODULE` from `workdir` instead of `script` (the module's file)."""
    try:
        if workdir is None:
            report = run_check(script, args, timeout_s=timeout_s, memory_mb=memory_mb, explain=explain_error)
        else:
            root = Path(project or workdir).resolve() if project or reveal else None
            # a tree xlaport wrote itself (the migrated copy): the run may read all of it, as the copy it ran in did
            report = run_check(
                script,
                args,
                timeout_s=timeout_s,
                memory_mb=memory_mb,
                workdir=Path(workdir).resolve(),
                project=root,
                reveal=reveal,
                explain=explain_error,
                module=module,
            )
    except SandboxRefused as refused:
        return CheckRun(name="xla_check", passed=None, reasons=[f"not run: {refused}"])
    return CheckRun(
        name="xla_check", passed=report.ok, level=report.level, reasons=list(report.reasons), report=report.to_dict()
    )


# Findings that make a program fail on a TPU host (APIs, devices, libraries, precision, memory, distribution), not
# the host syncs and shapes (C4) that only cost time
FAILING_CATEGORIES = ("C1", "C2", "C3", "C5", "C6", "C7")


def failing_findings_at(path: Path, line: int) -> list[Finding]:
    """The kb's findings of the categories that make a run fail, on `line` of the Python file `path` (a finding
    spans its statement's lines); none when the file does not parse."""
    try:
        found = lint_source(path.read_text(encoding="utf-8"), path.name)
    except (SourceError, OSError, UnicodeDecodeError, ValueError):
        return []
    return [
        f for f in found if f.category in FAILING_CATEGORIES and f.line <= line <= max(f.end_line or f.line, f.line)
    ]


def check_run_of_verify(report: dict) -> CheckRun:
    """The execution check that verify ran on the migrated command (in its report), as a validation check."""
    check = report.get("check") or {}
    level = check.get("level")
    if not check:
        return CheckRun(name="xla_check", passed=None, reasons=["verify did not run the execution check"])
    return CheckRun(
        name="xla_check", passed=level == "L2", level=level, reasons=list(check.get("reasons", [])), report=check
    )


def run_verify(
    original: Path,
    migrated: Path,
    command: str,
    step: Step | None = None,
    cwd: str | None = None,
    loss_pattern: str | None = None,
    migrated_args: list[str] | None = None,
    reference_cache: Path | None = None,
) -> VerifyReport:
    """Verify of `migrated` against `original` (settings from the project's xlaport.toml / pyproject, with
    `loss_pattern` and `migrated_args` on top when given), the command run in their folder `cwd` (default: the
    caller's folder when it stands in one of the trees, else their roots); `step` is told when each run starts.
    `reference_cache`: a folder that keeps the original's runs for a later verify (the optimization stage)."""
    script, args = parse_command(command)
    given = {
        "loss_pattern": loss_pattern,
        "migrated_args": migrated_args,
        "reference_cache": str(reference_cache) if reference_cache else None,
    }
    given = {key: value for key, value in given.items() if value}
    config = VerifyConfig(**given) if given else None  # on top of the project's own settings
    return verify_tree(original, migrated, ["python", script, *args], config, on_step=step, subdir=cwd)


def run_generated_tests(
    original: Path,
    migrated: Path,
    out: Path,
    record: str | None = None,
    timeout_s: float = 600.0,
    step: Step | None = None,
) -> CheckRun:
    """Differential tests generated from the original, run against the migration; `step` is told when the
    generation (which records the original's run) and the run of the tests start.

    `passed` is None when no test could be generated (nothing drivable changed), or when the tests ran out of time
    before any failed (a slow or loaded machine is no evidence against the migration): no evidence either way.
    """
    step = step or (lambda name: None)
    step("the original's run (recording inputs for the tests)" if record else "generating the tests")
    try:
        # every public function and module of a changed file: a change also affects what calls into it
        generated = testgen.generate_tests(original, migrated, out, record=record, changed_files=True)
    except testgen.TestgenError as exc:
        return CheckRun(name="generated_tests", passed=None, reasons=[f"no tests generated: {exc}"])
    if not generated.tests:
        why = generated.notes + [f"{u.source}:{u.target}: {u.reason}" for u in generated.undrivable]
        return CheckRun(
            name="generated_tests",
            passed=None,
            reasons=["no test could be generated" + (f" ({'; '.join(why[:3])})" if why else "")],
            report={"generated": generated.to_dict()},
        )
    step(f"the generated tests ({len(generated.tests)})")
    run = testgen.run_generated_tests(out, timeout_s=timeout_s, trees=[original, migrated])
    reasons = [f"{f.test}: {_first_lines(f.message)}" for f in run.failures]
    if run.timed_out:
        reasons.append(
            f"the generated tests timed out after {run.wall_s:.0f} s" + ("" if run.failures else ", none failed")
        )
    elif not run.ok and not reasons:
        reasons.append(f"pytest exited with code {run.returncode}")
    reasons = reasons[:10] + [
        f"{run.passed} of {len(generated.tests)} generated test(s) passed; kept in {out} "
        f"(README.md there lists them and what was not tested; run them again with `pytest {out}`)"
    ]
    return CheckRun(
        name="generated_tests",
        passed=None if run.timed_out and not run.failures else run.ok,
        level=None,
        reasons=reasons,
        report={"generated": generated.to_dict(), "run": run.to_dict()},
    )


def _first_lines(message: str, lines: int = 2, limit: int = 400) -> str:
    """The head of a failure message (what differed, and how), on one line."""
    head = " / ".join(line.strip() for line in message.strip().splitlines()[:lines] if line.strip())
    return (head[: limit - 1] + "…" if len(head) > limit else head) or "failed"


def verify_outcome(report: VerifyReport, command: str) -> VerifyOutcome:
    """A VerifyReport as the pipeline's result."""
    return VerifyOutcome(
        command=command,
        status=report.status,
        level=report.level,
        exit_code=report.exit_code,
        reasons=list(report.reasons),
        report=report.to_dict(),
    )
