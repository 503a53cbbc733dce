"""Latency of the serving fronts: `.venv/bin/python bench/serve.py [--requests 50] [--no-validate]`.

Prints one table:
- suggestion latency p50/p95 over N `POST /v1/suggest` requests (no validation) for a ~200-line file,
  through the ASGI app (FastAPI TestClient, lifespan run once, index warm);
- retrieval latency p50/p95 over N `POST /v1/search` requests (code snippets and error messages);
- `migrate --unsafe-fixes` wall time on examples/ without and with validation (`--validate` on one
  example script; the unsafe fixes add the step barriers that let it reach L2).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
VALIDATE_CMD = "python tiny_lm/train.py --steps 6 --eval-every 3"
QUERIES = [
    "RuntimeError: Found no NVIDIA driver on your system",
    "pt-xla-profiler: CompileTime too frequent: 33 counts during 11 steps",
    "pt-xla-profiler: Op(s) not lowered: aten::nonzero",
    "x = x.cuda()",
    "torch.cuda.synchronize()",
    "scaler = torch.cuda.amp.GradScaler()",
    "print(loss.item()) inside the training loop",
    "torch.cuda.max_memory_allocated()",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def bench_file() -> tuple[str, int]:
    """Two example scripts back to back: a ~200-line CUDA-era file."""
    parts = [(EXAMPLES / name / "train.py").read_text() for name in ("amp_classifier", "ddp_finetune")]
    text = "\n\n".join(parts)
    return text, text.count("\n")


def timed_requests(client, path: str, bodies: list[dict]) -> list[float]:
    times = []
    for body in bodies:
        start = time.perf_counter()
        response = client.post(path, json=body)
        times.append(time.perf_counter() - start)
        if response.status_code != 200:
            raise SystemExit(f"{path} answered {response.status_code}: {response.text[:300]}")
    return times


def migrate_wall(validate: str | None) -> tuple[float, str]:
    from xlaport.serve.pipeline import get_pipeline
    from xlaport.serve.results import MigrateOptions

    with tempfile.TemporaryDirectory(prefix="xlaport-bench-") as tmp:
        start = time.perf_counter()
        options = MigrateOptions(unsafe_fixes=True, validate_cmd=validate)
        result = get_pipeline().migrate(EXAMPLES, Path(tmp) / "out", options)
        wall = time.perf_counter() - start
    return wall, result.validation.status + (f" ({result.validation.level})" if result.validation.level else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--no-validate", action="store_true", help="Skip the migrate run with validation.")
    args = parser.parse_args()

    from fastapi.testclient import TestClient
    from xlaport.serve.http import create_app
    from xlaport.serve.pipeline import get_pipeline

    source, lines = bench_file()
    rows = []
    start = time.perf_counter()
    with TestClient(create_app(get_pipeline(), token=None, max_concurrency=1, timeout_s=600)) as client:
        startup = time.perf_counter() - start
        suggest = timed_requests(client, "/v1/suggest", [{"source": source, "path": "bench.py"}] * args.requests)
        searches = [{"text": QUERIES[i % len(QUERIES)], "k": 5} for i in range(args.requests)]
        search = timed_requests(client, "/v1/search", searches)
    rows.append(("service start-up (index + model load)", f"{startup:.2f} s", ""))
    for name, times in ((f"POST /v1/suggest, {lines}-line file, no validation", suggest), ("POST /v1/search", search)):
        rows.append(
            (
                f"{name} (n={len(times)})",
                f"p50 {1000 * statistics.median(times):.0f} ms",
                f"p95 {1000 * percentile(times, 95):.0f} ms",
            )
        )
    wall, status = migrate_wall(None)
    rows.append(("xlaport migrate examples/ --unsafe-fixes (no validation)", f"{wall:.1f} s", status))
    if not args.no_validate:
        wall, status = migrate_wall(VALIDATE_CMD)
        rows.append((f'xlaport migrate examples/ --unsafe-fixes --validate "{VALIDATE_CMD}"', f"{wall:.1f} s", status))
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>12}  detail")
    for name, value, detail in rows:
        print(f"{name:<{width}}  {value:>12}  {detail}")


if __name__ == "__main__":
    main()
