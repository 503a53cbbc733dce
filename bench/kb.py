"""Benchmark: lint and fix throughput of the kb over a real PyTorch corpus, against parse-only.

    .venv/bin/python bench/kb.py [--limit 400] [--jobs 2] [--packages torch transformers]

Uses the installed packages' own .py files (offline). Prints files/s and lines/s for libcst
parse only, `lint` (all rules), and `fix --diff` (rewrite + unified diff, nothing written), and the
ratio of each to parse-only. The same shuffled sample of files (fixed seed) is used for all three.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import random
import statistics
import time
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

import libcst as cst


def corpus(packages: list[str]) -> list[Path]:
    files: list[Path] = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"package not installed: {name}")
        root = Path(next(iter(spec.submodule_search_locations)))
        files += sorted(p for p in root.rglob("*.py") if p.is_file())
    return files


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def parse_only(path: Path) -> tuple[int, int, int]:
    source = _read(path)
    if source is None:
        return 0, 0, 1
    try:
        cst.parse_module(source)
    except cst.ParserSyntaxError:
        return source.count("\n"), 0, 1
    return source.count("\n"), 0, 0


def lint(path: Path) -> tuple[int, int, int]:
    from xlaport.kb import SourceError, lint_source

    source = _read(path)
    if source is None:
        return 0, 0, 1
    try:
        return source.count("\n"), len(lint_source(source, str(path))), 0
    except SourceError:
        return source.count("\n"), 0, 1


def fix_diff(path: Path) -> tuple[int, int, int]:
    from xlaport.kb import SourceError, fix_source

    source = _read(path)
    if source is None:
        return 0, 0, 1
    try:
        result = fix_source(source, str(path))
    except SourceError:
        return source.count("\n"), 0, 1
    diff = list(difflib.unified_diff(source.splitlines(True), result.fixed.splitlines(True)))
    return source.count("\n"), len(result.applied) if diff else 0, 0


def _warm(_: int) -> None:
    from xlaport.kb import all_rules

    all_rules()


def run(task, files: list[Path], jobs: int) -> tuple[float, list[tuple[int, int, int]]]:
    with Pool(jobs) as pool:
        pool.map(_warm, range(jobs))  # import cost is not part of the measurement
        start = time.perf_counter()
        results = pool.map(task, files, chunksize=4)
        return time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packages", nargs="+", default=["torch", "transformers"])
    parser.add_argument("--limit", type=int, default=400, help="files sampled (0 = all)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode; the median is reported")
    args = parser.parse_args()

    files = corpus(args.packages)
    random.Random(0).shuffle(files)
    if args.limit:
        files = files[: args.limit]
    print(f"corpus: {len(files)} files from {', '.join(args.packages)}; {args.jobs} processes")

    rows = []
    for name, task in (("parse only", parse_only), ("lint", lint), ("fix --diff", fix_diff)):
        times, results = [], []
        for _ in range(args.repeat):
            seconds, results = run(task, files, args.jobs)
            times.append(seconds)
        seconds = statistics.median(times)
        lines = sum(r[0] for r in results)
        counted = sum(r[1] for r in results)
        errors = sum(r[2] for r in results)
        rows.append((name, seconds, len(files) / seconds, lines / seconds, counted, errors))

    base = rows[0][2]
    print(
        f"{'mode':<12} {'seconds':>8} {'files/s':>9} {'lines/s':>10} {'vs parse':>9} {'findings/fixes':>15} {'errors':>7}"
    )
    for name, seconds, fps, lps, counted, errors in rows:
        print(f"{name:<12} {seconds:>8.1f} {fps:>9.1f} {lps:>10.0f} {fps / base:>8.2f}x {counted:>15} {errors:>7}")
    top = Counter()
    from xlaport.kb import SourceError, lint_source

    for path in files[:100]:
        source = _read(path)
        if source:
            try:
                top.update(f.code for f in lint_source(source))
            except SourceError:
                pass
    print("most frequent codes in the first 100 files:", ", ".join(f"{c}×{n}" for c, n in top.most_common(8)))


if __name__ == "__main__":
    main()
