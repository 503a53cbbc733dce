"""Does the default migration break a working program? Each repository's own test suite, before and after.

    .venv/bin/python bench/repo_tests.py [--corpus /work/corpus] [--repos owner/name,...] [--json out.json]
        [--manifest bench/repo_tests.toml] [--env DIR]

For each repository of bench/unseen_repos.toml found under `--corpus/OWNER__NAME` (a snapshot you fetched;
its code is never kept here): copy it, run its tests with PJRT_DEVICE=CPU (the original then runs on the
CPU, as on any host without CUDA), migrate the copy with the default `xlaport migrate` (no flags), and run
the same tests on the migrated copy. A test that passed before and fails after is a migration that broke
working code: the goal is 0. Per-test outcomes come from pytest's JUnit XML.

A benchmark, not a test: it prints a table and JSON and exits 0 whatever the numbers are (2 when it cannot
run at all).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unseen import (
    DEFAULT_CORPUS,
    DEFAULT_ENV,
    MANIFEST,
    Repo,
    bench_python,
    load_manifest,
    snapshot_dir,
    xlaport_command,
)

PASSED = "passed"


@dataclass
class SuiteRun:
    outcomes: dict[str, str]  # test id -> passed / failed / error / skipped
    seconds: float
    exit_code: int
    tail: str

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)


@dataclass
class RepoResult:
    name: str
    files_changed: int = 0
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)  # passed before, not after
    fixed: list[str] = field(default_factory=list)  # not passed before, passed after
    error: str | None = None


def junit_outcomes(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            outcomes[test_id] = "failed"
        elif "error" in kinds:
            outcomes[test_id] = "error"
        elif "skipped" in kinds:
            outcomes[test_id] = "skipped"
        else:
            outcomes[test_id] = PASSED
    return outcomes


def _suite_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tree)}


def selected_tests(python: Path, tree: Path, repo: Repo) -> list[str]:
    """The pytest arguments to run: the manifest's, or every `sample`-th test id they collect (the same ids
    run before and after, so a sampled suite still compares test by test)."""
    if repo.sample <= 1:
        return list(repo.tests)
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *repo.tests]
    done = subprocess.run(command, cwd=tree, env=_suite_env(tree), capture_output=True, text=True, timeout=600)
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line]
    return ids[:: repo.sample] or list(repo.tests)


def run_suite(python: Path, tree: Path, repo: Repo, junit: Path, tests: list[str]) -> SuiteRun:
    env = _suite_env(tree)
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *tests]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=repo.timeout_s)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as timeout:
        code, output = 124, f"timed out after {repo.timeout_s} s\n{timeout.stdout or ''}"
    return SuiteRun(junit_outcomes(junit), round(time.perf_counter() - started, 1), code, output[-1500:])


def summary(run: SuiteRun) -> dict:
    return {
        "passed": run.count(PASSED),
        "failed": run.count("failed"),
        "error": run.count("error"),
        "skipped": run.count("skipped"),
        "seconds": run.seconds,
        "exit_code": run.exit_code,
    }


def measure(repo: Repo, corpus: Path, env_dir: Path, work: Path) -> RepoResult:
    result = RepoResult(repo.name)
    source = snapshot_dir(corpus, repo.name)
    if not source.is_dir():
        result.error = f"no snapshot at {source}"
        return result
    python = bench_python(repo.deps, env_dir)
    original = work / "original"
    migrated = work / "migrated"
    shutil.copytree(source, original, symlinks=True)
    tests = selected_tests(python, original, repo)
    before = run_suite(python, original, repo, work / "before.xml", tests)
    done = subprocess.run(
        [*xlaport_command(), "migrate", str(source), "--out", str(migrated), "--format", "json"],
        capture_output=True,
        text=True,
    )
    if done.returncode not in (0, 1) or not migrated.is_dir():
        result.error = f"migrate failed ({done.returncode}): {done.stderr[-500:]}"
        return result
    result.files_changed = _files_changed(source, migrated)
    after = run_suite(python, migrated, repo, work / "after.xml", tests)
    result.before, result.after = summary(before), summary(after)
    result.broken = sorted(t for t, o in before.outcomes.items() if o == PASSED and after.outcomes.get(t) != PASSED)
    result.fixed = sorted(t for t, o in after.outcomes.items() if o == PASSED and before.outcomes.get(t) != PASSED)
    if result.broken:
        result.error = "broken tests; after-run tail:\n" + after.tail
    return result


def _files_changed(original: Path, migrated: Path) -> int:
    changed = 0
    for path in original.rglob("*.py"):
        twin = migrated / path.relative_to(original)
        if twin.exists() and twin.read_bytes() != path.read_bytes():
            changed += 1
    return changed


def print_table(results: list[RepoResult]) -> None:
    header = f"{'repository':38} {'files changed':>13} {'passed before':>13} {'passed after':>12} {'broken':>6}"
    print(header)
    print("-" * len(header))
    for r in results:
        if r.before:
            print(
                f"{r.name:38} {r.files_changed:>13} {r.before['passed']:>13} {r.after['passed']:>12} {len(r.broken):>6}"
            )
        else:
            print(f"{r.name:38} {'':>13} {'':>13} {'':>12} {'-':>6}  {r.error}")
    for r in results:
        for test in r.broken:
            print(f"BROKEN {r.name}: {test}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--repos", help="comma-separated owner/name list (default: all in the manifest)")
    parser.add_argument("--env", type=Path, default=DEFAULT_ENV, help="the layered bench environment")
    parser.add_argument("--manifest", type=Path, default=MANIFEST, help="the [[repo]] list (default: %(default)s)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    repos, _ = load_manifest(args.manifest)
    if args.repos:
        wanted = set(args.repos.split(","))
        repos = [r for r in repos if r.name in wanted]
    if not repos:
        print("no repository selected", file=sys.stderr)
        return 2
    results = []
    for repo in repos:
        with tempfile.TemporaryDirectory(prefix="xlaport-repo-tests-") as tmp:
            print(f"... {repo.name}", file=sys.stderr, flush=True)
            results.append(measure(repo, args.corpus, args.env, Path(tmp)))
    print_table(results)
    total_broken = sum(len(r.broken) for r in results)
    measured = [r for r in results if r.before]
    print(
        f"\n{len(measured)} repositories, {sum(r.before['passed'] for r in measured)} tests passing before, "
        f"{total_broken} broken by the default migration"
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
