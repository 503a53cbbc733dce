"""Generality: how many real training programs reach L2 after the default migration, with no edit?

    .venv/bin/python bench/zero_edit.py [--corpus /work/corpus] [--only SUBSTRING] [--json out.json]

For each [[program]] of bench/unseen_repos.toml whose repository snapshot lies under `--corpus/OWNER__NAME`
(fetched by you; never kept here): copy the repository, write the small synthetic data set the program
expects (bench/unseen_data.py), run the default `xlaport migrate` (no flags) over the whole copy, then, standing
in the folder a user runs it from, `xlaport check SCRIPT --max-steps N -- ARGS` on PJRT_DEVICE=CPU, as a user
types `python SCRIPT ARGS`. A program counts when the check says L2 (or above) with no edit of the migrated code.

The list must change each time generality is measured (programs this project has not used before): the
results file names the programs measured. A benchmark, not a test: it prints a table and JSON and exits 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unseen import (
    DEFAULT_CORPUS,
    DEFAULT_ENV,
    Program,
    bench_python,
    check_report,
    load_manifest,
    snapshot_dir,
    xlaport_command,
)
from unseen_data import make as make_data


@dataclass
class ProgramResult:
    repo: str
    script: str
    level: str = "not run"
    reasons: list[str] = field(default_factory=list)
    performance: list[str] = field(default_factory=list)
    fixes: int = 0  # fixes applied to the program's own script
    manual: int = 0  # findings left for a human in the program's own script
    tree_fixes: int = 0  # the same over the whole repository the default migrate rewrote
    tree_manual: int = 0
    steps: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def zero_edit_l2(self) -> bool:
        return self.level in ("L2", "L3", "L4")


def measure(program: Program, corpus: Path, env_dir: Path, work: Path) -> ProgramResult:
    result = ProgramResult(program.repo, program.script)
    source = snapshot_dir(corpus, program.repo)
    if not source.is_dir():
        result.error = f"no snapshot at {source}"
        return result
    repos = {r.name: r for r in load_manifest()[0]}
    deps = [*program.deps, *(repos[program.repo].deps if program.repo in repos else [])]
    python = bench_python(deps, env_dir)
    original, migrated = work / "original", work / "migrated"
    shutil.copytree(source, original, symlinks=True)
    for spec in [program.data] if isinstance(program.data, str) else program.data or []:
        make_data(spec, original)
    done = subprocess.run(
        [*xlaport_command(python), "migrate", str(original), "--out", str(migrated), "--format", "json"],
        capture_output=True,
        text=True,
    )
    if not migrated.is_dir():
        result.error = f"migrate failed ({done.returncode}): {done.stderr[-800:]}"
        return result
    _count_migration(done.stdout, migrated / "xlaport-report.json", program.script, result)
    started = time.perf_counter()
    report, error = check_report(python, migrated, program)
    result.seconds = round(time.perf_counter() - started, 1)
    if report is None:
        result.error = error
        return result
    result.level = report.get("level", "?")
    result.reasons = list(report.get("reasons", []))
    result.performance = [
        str(p.get("message", p)) if isinstance(p, dict) else str(p) for p in report.get("performance", [])
    ]
    result.steps = int(report.get("steps") or 0)
    return result


def _count_migration(summary_json: str, report: Path, script: str, result: ProgramResult) -> None:
    """Fixes and findings left: the script's own (from the migration report's per-file entries) and the tree's."""
    try:
        summary = json.loads(summary_json)
    except json.JSONDecodeError:
        result.fixes = result.manual = result.tree_fixes = result.tree_manual = -1  # unknown, never a silent 0
        print(f"    migrate printed no JSON summary: {summary_json[:200]!r}", file=sys.stderr)
        return
    result.tree_fixes = sum(summary.get("fixes_applied", {}).values())
    result.tree_manual = sum(summary.get("findings_left", {}).values())
    if report.is_file():
        for entry in json.loads(report.read_text()).get("files", []):
            if entry.get("path") == script:
                result.fixes = len(entry.get("codes_applied", []))
                result.manual = len(entry.get("manual", []))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument(
        "--only", help="measure only programs whose repo/script contains one of these (comma-separated)"
    )
    parser.add_argument("--env", type=Path, default=DEFAULT_ENV, help="the layered bench environment")
    parser.add_argument("--keep", type=Path, help="keep each migrated copy under this folder")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    programs = load_manifest()[1]
    if args.only:
        wanted = args.only.split(",")
        programs = [p for p in programs if any(w in f"{p.repo}/{p.script}" for w in wanted)]
    results = []
    for program in programs:
        print(f"... {program.repo}: {program.script}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="xlaport-zero-edit-") as tmp:
            try:
                results.append(measure(program, args.corpus, args.env, Path(tmp)))
            except Exception as exc:  # one broken program never stops the list
                results.append(ProgramResult(program.repo, program.script, error=f"{type(exc).__name__}: {exc}"))
            if args.keep and (Path(tmp) / "migrated").is_dir():  # absent when the program failed before migrate
                name = f"{program.repo}/{program.script}".replace("/", "__")
                shutil.copytree(
                    Path(tmp) / "migrated", args.keep / name, dirs_exist_ok=True, ignore_dangling_symlinks=True
                )
        r = results[-1]
        print(f"    {r.level} ({r.seconds} s) {r.error or '; '.join(r.reasons)[:300]}", file=sys.stderr, flush=True)
    print("fixes / manual: in the program's script (in the whole repository)")
    print(f"{'program':64} {'level':>6} {'fixes':>9} {'manual':>9} {'steps':>5} {'s':>6}")
    for r in results:
        fixes, manual = f"{r.fixes} ({r.tree_fixes})", f"{r.manual} ({r.tree_manual})"
        print(f"{r.repo + ': ' + r.script:64} {r.level:>6} {fixes:>9} {manual:>9} {r.steps:>5} {r.seconds:>6}")
        for reason in r.reasons[:3]:
            print(f"    - {reason[:200]}")
        if r.error:
            print(f"    ! {r.error[:300]}")
    runnable = [r for r in results if r.error is None]
    passed = sum(r.zero_edit_l2 for r in runnable)
    print(f"\nzero-edit L2: {passed} of {len(runnable)} runnable programs")
    if args.json:
        payload = {"programs": [asdict(r) | {"zero_edit_l2": r.zero_edit_l2} for r in results], "zero_edit_l2": passed}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
