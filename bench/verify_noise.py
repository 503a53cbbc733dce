"""Noise before blame: the unseeded test program's correct migration verified N times, each with fresh runs of
the original and of the migrated code (no reference cache), and the verdicts counted. A FAIL here is
randomness blamed on the migration.

    PJRT_DEVICE=CPU .venv/bin/python bench/verify_noise.py [N] [--jsonl OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from xlaport.eval.verify.api import verify
from xlaport.eval.verify.config import VerifyConfig

PROGRAM = Path(__file__).resolve().parent.parent / "tests" / "programs" / "verify_unseeded"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=int, nargs="?", default=20)
    parser.add_argument("--jsonl", type=Path, help="one record per verification")
    args = parser.parse_args()
    counts: Counter = Counter()
    for index in range(args.runs):
        started = time.perf_counter()
        report = verify(PROGRAM / "original", PROGRAM / "migrated", ["python", "train.py"], VerifyConfig(timeout_s=300))
        record = {
            "run": index,
            "status": report.status,
            "level": report.level,
            "loss": report.loss.verdict if report.loss else None,
            "metrics": {m.name: m.verdict for m in report.metrics},
            "seeded": report.spread.seeded if report.spread else None,
            "first_losses": report.spread.first_losses if report.spread else None,
            "wall_s": round(time.perf_counter() - started, 1),
        }
        counts[f"{report.status} {report.level}"] += 1
        print(json.dumps(record), flush=True)
        if args.jsonl:
            with args.jsonl.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
    print(json.dumps({"verdicts": dict(counts), "runs": args.runs}))


if __name__ == "__main__":
    main()
