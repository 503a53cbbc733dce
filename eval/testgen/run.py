"""Running the generated tests in a sandboxed pytest and counting the outcome."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from xlaport.eval.sandbox import read_child_file, run_sandboxed, scratch

from .results import TestFailure, TestgenError, TestRunResult


def run_generated_tests(
    out: Path, timeout_s: float = 1800.0, trees: list[Path] | tuple[Path, ...] = ()
) -> TestRunResult:
    """Runs pytest on the generated folder in a sandboxed child; counts and failure messages.
    `trees`: the original and migrated roots the tests read: a folder itself, a single file's folder (not
    the folder above a tree: when that is /tmp, the sandbox's private /tmp would hide the trees)."""
    out = Path(out).resolve()
    if not out.is_dir():
        raise TestgenError(f"no such folder: {out}")
    with scratch("xlaport-testrun-") as tmp:
        junit = Path(tmp) / "junit.xml"
        run = run_sandboxed(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
                f"--rootdir={out}",
                str(out),
            ],
            cwd=out,
            timeout_s=timeout_s,
            writable=[Path(tmp)],
            readable=[root if root.is_dir() else root.parent for root in (Path(t).resolve() for t in trees)],
            reveal=True,  # the generated tests and the trees they were written from
        )
        counts, failures = _read_junit(junit)
    tail = (run.stdout + run.stderr)[-4000:]
    return TestRunResult(
        passed=counts["passed"],
        failed=counts["failed"],
        errors=counts["errors"],
        skipped=counts["skipped"],
        failures=failures,
        returncode=run.returncode,
        wall_s=run.wall_s,
        output_tail=tail,
        timed_out=run.timed_out,
    )


def _read_junit(path: Path) -> tuple[dict[str, int], list[TestFailure]]:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures: list[TestFailure] = []
    text = read_child_file(path)
    if text is None:
        return counts, failures
    for case in ElementTree.fromstring(text).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
        if failure is not None:
            counts["failed"] += 1
            failures.append(TestFailure(name, _failure_text(failure)))
        elif error is not None:
            counts["errors"] += 1
            failures.append(TestFailure(name, _failure_text(error)))
        elif skipped is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failures


def _failure_text(element: ElementTree.Element) -> str:
    """The assertion message (the part a person reads), not the whole traceback."""
    message = element.get("message") or ""
    return message if message.strip() else (element.text or "").strip()[-2000:]
