"""What the sandbox costs per run: the same commands with a plain subprocess and through eval/sandbox/.

    .venv/bin/python bench/sandbox_overhead.py [--runs 10] [--json out.json]

Each command runs `--runs` times both ways, interleaved (so load on a shared machine hits both alike); the
table gives median wall seconds and the difference. A benchmark, not a test: it exits 0 whatever the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from xlaport.eval.sandbox import run_sandboxed, sandbox_status

COMMANDS = {
    "true": ["true"],
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
}


def plain(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, env={"PATH": "/usr/bin:/bin", "USE_TORCH_XLA": "0"}, check=True)
    return time.perf_counter() - start


def sandboxed(argv: list[str]) -> float:
    start = time.perf_counter()
    result = run_sandboxed(argv, env={"USE_TORCH_XLA": "0"}, timeout_s=300)
    if result.returncode != 0:
        raise SystemExit(f"sandboxed {argv} failed: {result.stderr[-500:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", help="also write the numbers here")
    options = parser.parse_args()
    status = sandbox_status()
    sandboxed(["true"])  # the one-time probe is not part of a run
    rows = []
    for name, argv in COMMANDS.items():
        times: dict[str, list[float]] = {"plain": [], "sandboxed": []}
        for _ in range(options.runs):
            times["plain"].append(plain(argv))
            times["sandboxed"].append(sandboxed(argv))
        plain_s, sandbox_s = statistics.median(times["plain"]), statistics.median(times["sandboxed"])
        rows.append({"command": name, "plain_s": plain_s, "sandboxed_s": sandbox_s, "overhead_s": sandbox_s - plain_s})
    print(f"sandboxed: {status.sandboxed}; refused: {list(status.refused) or 'none'}; runs: {options.runs} each")
    print(f"{'command':28} {'plain s':>9} {'sandboxed s':>12} {'overhead s':>11}")
    for row in rows:
        print(f"{row['command']:28} {row['plain_s']:9.3f} {row['sandboxed_s']:12.3f} {row['overhead_s']:11.3f}")
    data = {"runs": options.runs, "mechanisms": status.to_dict(), "rows": rows}
    print(json.dumps(data))
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)


if __name__ == "__main__":
    main()
