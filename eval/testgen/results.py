"""What `generate_tests` and `run_generated_tests` return, and the error for bad input."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GeneratedTest:
    test_file: str
    test_name: str
    source: str  # the original file, relative to the original root
    target: str
    kind: str  # "function" or "module"
    inputs_from: str  # "recorded" or "synthesized"
    inputs: str  # the inputs as written in the test


@dataclass
class Undrivable:
    source: str
    target: str
    reason: str


@dataclass
class TestgenResult:
    __test__ = False  # not a pytest class

    out: str
    tests: list[GeneratedTest] = field(default_factory=list)
    undrivable: list[Undrivable] = field(default_factory=list)
    files_written: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TestFailure:
    __test__ = False  # not a pytest class

    test: str
    message: str


@dataclass
class TestRunResult:
    __test__ = False  # not a pytest class

    passed: int
    failed: int
    errors: int
    skipped: int
    failures: list[TestFailure]
    returncode: int
    wall_s: float
    output_tail: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.failed == 0 and self.errors == 0 and self.passed > 0

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


class TestgenError(ValueError):
    """Bad input to testgen: the message says what to change."""

    __test__ = False  # not a pytest class
