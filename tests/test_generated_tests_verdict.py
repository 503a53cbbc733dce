"""Generated tests that run out of time before any failed are no evidence either way: the migration is unvalidated,
not rejected (tiny_lm's 5 tests timed out at 600 s on a machine at load 15 and all passed when run again alone)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from xlaport.eval.testgen import TestFailure, TestRunResult
from xlaport.serve import checks
from xlaport.serve.results import verdict


def run_with(monkeypatch, tmp_path: Path, result: TestRunResult):
    generated = SimpleNamespace(tests=[object()] * 5, notes=[], undrivable=[], to_dict=dict)
    monkeypatch.setattr(checks.testgen, "generate_tests", lambda *args, **kwargs: generated)
    monkeypatch.setattr(checks.testgen, "run_generated_tests", lambda *args, **kwargs: result)
    return checks.run_generated_tests(tmp_path / "original", tmp_path / "migrated", tmp_path / "tests_xla")


def outcome(failures: list[TestFailure], timed_out: bool, passed: int = 0) -> TestRunResult:
    return TestRunResult(
        passed=passed,
        failed=len(failures),
        errors=0,
        skipped=0,
        failures=failures,
        returncode=-9 if timed_out else int(bool(failures)),
        wall_s=601.0,
        output_tail="",
        timed_out=timed_out,
    )


def test_a_timeout_without_a_failure_leaves_the_migration_unvalidated(monkeypatch, tmp_path: Path):
    check = run_with(monkeypatch, tmp_path, outcome([], timed_out=True))
    assert check.passed is None
    status, reason, _ = verdict([check])
    assert status == "unvalidated" and "timed out after 601 s, none failed" in reason


@pytest.mark.parametrize("timed_out", [True, False])
def test_a_failed_test_rejects_it_in_time_or_not(monkeypatch, tmp_path: Path, timed_out: bool):
    failure = TestFailure("test_xlaport_train.py::test_Block", "outputs differ")
    check = run_with(monkeypatch, tmp_path, outcome([failure], timed_out=timed_out))
    assert check.passed is False
    assert verdict([check])[0] == "rejected"


def test_tests_that_all_pass_validate(monkeypatch, tmp_path: Path):
    check = run_with(monkeypatch, tmp_path, outcome([], timed_out=False, passed=5))
    assert check.passed is True and verdict([check])[0] == "validated"
