"""Latency and bounds of the serving fronts: `nice -n 10 .venv/bin/python bench/serve.py [--requests 30]
[--tree DIR] [--jobs 2] [--validate] [--no-migrate] [--no-bounds] [--json bench/results/serve.json]`.

Prints, from one run:
- `POST /v1/suggest` p50/p95 (rules only, no validation) for a ~200-line file through the ASGI app (driven by
  httpx in one event loop, as a server drives it; lifespan run once, index and a fix worker warm), with new text each request (a changed
  comment: no cache hit) and with the same text again (the kb's result cache); next to it the engine alone
  (`fix_source` in this process on the same new texts), so the service's own cost is the difference; and a
  different real file each request (150-300 lines of the real tree: other rules and messages, some of them new
  to the index's query cache, so retrieval's encoding is in it too);
- `POST /v1/search` p50/p95 (code snippets and error messages);
- `migrate` (no validation) on a tree of real code (default: the pytorch/examples checkout, else examples/):
  files, lines, wall time and lines/s, with 1 and `--jobs` worker processes;
- bounds: huge inputs (whole real corpus files joined: 100 KB to 5 MB) and pathological shapes through
  `lint_source` in a fresh process (killed at 120 s) and the service's fix worker (memory-capped, killed at
  the service's own limit): the outcome (or the refusal's reason), seconds and peak memory;
- with `--validate`, `migrate examples/ --unsafe-fixes --validate` wall time.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import gc
import json
import multiprocessing
import os
import platform
import re
import resource
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CORPUS = Path("/work/corpus")
REAL_TREE = CORPUS / "pytorch__examples"
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
BOUND_TIMEOUT_S = 120.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def bench_file() -> tuple[str, int]:
    """Two example scripts back to back: a ~200-line CUDA-era file."""
    parts = [(EXAMPLES / name / "train.py").read_text() for name in ("amp_classifier", "ddp_finetune")]
    text = "\n\n".join(parts)
    return text, text.count("\n")


async def timed_requests(client, path: str, bodies: list[dict]) -> list[float]:
    times = []
    for body in bodies:
        start = time.perf_counter()
        response = await client.post(path, json=body)
        times.append(time.perf_counter() - start)
        if response.status_code != 200:
            raise SystemExit(f"{path} answered {response.status_code}: {response.text[:300]}")
    return times


def latency(times: list[float]) -> dict:
    return {
        "n": len(times),
        "p50_ms": round(1000 * statistics.median(times), 1),
        "p95_ms": round(1000 * percentile(times, 95), 1),
    }


def service(requests: int) -> dict:
    """The ASGI app driven in one event loop (as uvicorn drives it), lifespan run once; then the engine alone."""
    from xlaport.kb import fix_source, select_rules

    source, lines = bench_file()
    new_texts = [f"{source}\n# request {i}\n" for i in range(requests)]
    report = asyncio.run(_requests(source, new_texts, real_files(requests)))
    rules = select_rules()
    engine, engine_cpu = [], []
    for text in new_texts:  # the same new texts, in this process: the kb engine's own cost
        gc.disable()  # as the service's fix worker runs a request (serve/isolated.py): collections come after it
        begin, begin_cpu = time.perf_counter(), time.process_time()
        fix_source(text + "# engine\n", "bench.py", rules)
        engine.append(time.perf_counter() - begin)
        engine_cpu.append(time.process_time() - begin_cpu)
        gc.enable()
        gc.collect()
    # CPU time next to wall time: on a shared 2-core machine the wall time follows the other processes' load
    cpu = latency(engine_cpu)
    engine_row = {**latency(engine), "cpu_p50_ms": cpu["p50_ms"], "cpu_p95_ms": cpu["p95_ms"]}
    return {"file_lines": lines, **report, "engine_fix_source": engine_row}


def real_files(count: int) -> list[str]:
    """Up to `count` files of 150-300 lines from the real tree (examples/ without it), in a stable order."""
    tree = REAL_TREE if REAL_TREE.is_dir() else EXAMPLES
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(tree.rglob("*.py")) if p.is_file()]
    return [t for t in texts if 150 <= t.count("\n") <= 300][:count]


async def _requests(source: str, new_texts: list[str], files: list[str]) -> dict:
    import httpx
    from xlaport.serve.http import create_app
    from xlaport.serve.pipeline import Pipeline

    start = time.perf_counter()
    app = create_app(Pipeline(proposer=None), token=None, max_concurrency=1, timeout_s=600)
    async with app.router.lifespan_context(app):
        startup = time.perf_counter() - start
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            await timed_requests(client, "/v1/suggest", [{"source": "import torch\n", "path": "warm.py"}])
            new = await timed_requests(client, "/v1/suggest", [{"source": s, "path": "bench.py"} for s in new_texts])
            same = await timed_requests(
                client, "/v1/suggest", [{"source": source, "path": "bench.py"}] * len(new_texts)
            )
            searches = [{"text": QUERIES[i % len(QUERIES)], "k": 5} for i in range(len(new_texts))]
            search = await timed_requests(client, "/v1/search", searches)
            other = await timed_requests(client, "/v1/suggest", [{"source": t, "path": "real.py"} for t in files])
    return {
        "startup_s": round(startup, 2),
        "suggest_new_text": latency(new),
        "suggest_same_text": latency(same),
        "suggest_real_files": latency(other),
        "search": latency(search),
    }


def count_lines(tree: Path) -> tuple[int, int]:
    files = [p for p in tree.rglob("*.py") if p.is_file() and not p.is_symlink()]
    return len(files), sum(p.read_bytes().count(b"\n") for p in files)


def migrate_tree(tree: Path, jobs: int, validate: str | None = None, unsafe: bool = False) -> dict:
    from xlaport.serve.pipeline import Pipeline
    from xlaport.serve.results import MigrateOptions

    files, lines = count_lines(tree)
    with tempfile.TemporaryDirectory(prefix="xlaport-bench-") as tmp:
        start = time.perf_counter()
        options = MigrateOptions(jobs=jobs, validate_cmd=validate, unsafe_fixes=unsafe)
        result = Pipeline(proposer=None).migrate(tree, Path(tmp) / "out", options)
        wall = time.perf_counter() - start
    return {
        "tree": str(tree),
        "jobs": jobs,
        "files": files,
        "lines": lines,
        "wall_s": round(wall, 2),
        "lines_per_s": round(lines / wall, 1),
        "files_changed": result.files_changed,
        "errors": len(result.errors),
        "validation": result.validation.status,
    }


# --- bounds -------------------------------------------------------------------------------------------------
def joined_corpus(chars: int) -> tuple[str, int]:
    """Whole real files from /work/corpus (those that parse and meet the shape limits), joined in a stable
    order until the text has `chars` characters (the corpus again from its start when it is smaller):
    a big module of distinct real code, not one file repeated. (text, number of files); no corpus: examples."""
    from xlaport.kb.parsing import SourceError, check_parse_limits, check_statements_per_line

    parts: list[str] = []
    total = 0
    files = sorted(CORPUS.rglob("*.py")) if CORPUS.is_dir() else []
    usable = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            tree = compile(text, str(path), "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
            check_statements_per_line(tree)
            check_parse_limits(tree, text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, SourceError):
            continue
        usable.append(text)
    # `from __future__` must open a file: in the middle of the joined text it would not compile
    usable = [re.sub(r"^from __future__ import", "# from __future__ import", t, flags=re.M) for t in usable]
    usable = usable or [bench_file()[0]]
    while total < chars:
        text = usable[len(parts) % len(usable)]
        parts.append(text)
        total += len(text) + 2
    return "\n\n".join(parts), len(parts)


def bound_cases() -> dict[str, str]:
    """Huge and pathological inputs (issue 12): sizes are of the text, shapes are what minified code looks like."""
    cases = {}
    for size in (100_000, 250_000, 500_000, 5_000_000):
        text, files = joined_corpus(size)
        cases[f"real code ({files} files joined), {size // 1000:,} KB"] = text
    return {
        **cases,
        "10k-term expression (1 + 1 + ...)": "x = " + " + ".join(["1"] * 10_000) + "\n",
        "10k-term `and` chain": "y = " + " and ".join(["x"] * 10_000) + "\n",
        "10k statements on one line": "; ".join(f"x{i} = {i}" for i in range(10_000)) + "\n",
        "10k-element list literal": "x = [" + ", ".join(str(i) for i in range(10_000)) + "]\n",
    }


def _lint_in_child(source: str, queue) -> None:
    from xlaport.kb import lint_source

    start = time.perf_counter()
    try:
        outcome = f"{len(lint_source(source, 'bound.py'))} findings"
    except ValueError as exc:  # SourceError: refused with a reason
        outcome = f"refused: {exc}"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put((outcome, time.perf_counter() - start, peak))


def lint_bound(source: str) -> dict:
    """`lint_source` in a fresh process (the CLI's path): outcome, seconds, peak MB (killed past the timeout)."""
    context = multiprocessing.get_context("forkserver")
    queue = context.Queue()
    child = context.Process(target=_lint_in_child, args=(source, queue), daemon=True)
    child.start()
    try:
        outcome, seconds, peak = queue.get(timeout=BOUND_TIMEOUT_S)
    except Exception:
        outcome, seconds, peak = f"no answer within {BOUND_TIMEOUT_S:.0f} s (exit {child.exitcode})", None, None
    child.kill()
    child.join()
    return {
        "lint": outcome,
        "lint_s": None if seconds is None else round(seconds, 2),
        "lint_peak_mb": None if peak is None else round(peak),
    }


def fix_bound(source: str) -> dict:
    """The service's fix step (warm worker, memory-capped, killed at the service's own time limit for it):
    outcome and seconds."""
    from xlaport.kb import select_rules
    from xlaport.serve.http import TIMEOUT_S
    from xlaport.serve.isolated import FIX_WORKERS

    FIX_WORKERS.warm(1)
    time.sleep(3)  # the worker's own warm-up is not the input's cost
    start = time.perf_counter()
    try:
        result = FIX_WORKERS.fix(source, "bound.py", select_rules(), False, 0.9 * TIMEOUT_S)  # as /v1/suggest
        outcome = f"{len(result.applied)} fixes, {len(result.remaining)} left"
    except (ValueError, TimeoutError) as exc:
        outcome = f"refused: {exc}"
    return {"service_fix": outcome, "service_fix_s": round(time.perf_counter() - start, 2)}


def bounds() -> list[dict]:
    rows = []
    for name, source in bound_cases().items():
        rows.append({"case": name, "chars": len(source), **lint_bound(source), **fix_bound(source)})
    return rows


# --- output ---------------------------------------------------------------------------------------------------
def print_table(report: dict) -> None:
    rows = []
    s = report["service"]
    rows.append(("service start-up (index + model load + fix worker)", f"{s['startup_s']:.2f} s", ""))
    for key, name in (
        ("suggest_new_text", f"POST /v1/suggest, {s['file_lines']}-line file, new text each request"),
        ("suggest_same_text", "POST /v1/suggest, the same text again (result cache)"),
        ("engine_fix_source", "  kb fix_source alone, in-process, new text (the engine's share)"),
        ("suggest_real_files", "POST /v1/suggest, a different real 150-300-line file each request"),
        ("search", "POST /v1/search"),
    ):
        m = s[key]
        cpu = f", CPU p50 {m['cpu_p50_ms']:.0f} ms, p95 {m['cpu_p95_ms']:.0f} ms" if "cpu_p50_ms" in m else ""
        rows.append((f"{name} (n={m['n']})", f"p50 {m['p50_ms']:.0f} ms", f"p95 {m['p95_ms']:.0f} ms{cpu}"))
    for m in report["migrate"]:
        rows.append(
            (
                f"migrate {m['tree']} (no validation, jobs={m['jobs']})",
                f"{m['lines_per_s']:.0f} lines/s",
                f"{m['files']} files, {m['lines']} lines, {m['wall_s']} s, {m['errors']} errors",
            )
        )
    if report.get("validate"):
        m = report["validate"]
        rows.append(
            (f'migrate examples/ --unsafe-fixes --validate "{VALIDATE_CMD}"', f"{m['wall_s']} s", m["validation"])
        )
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>16}  detail")
    for name, value, detail in rows:
        print(f"{name:<{width}}  {value:>16}  {detail}")
    print()
    print(f"{'bound case':<36} {'chars':>9}  {'lint s':>7} {'peak MB':>7}  {'fix s':>6}  outcome (lint | service fix)")
    for b in report["bounds"]:
        lint_s = "-" if b["lint_s"] is None else f"{b['lint_s']:.2f}"
        peak = "-" if b["lint_peak_mb"] is None else str(b["lint_peak_mb"])
        print(
            f"{b['case']:<36} {b['chars']:>9,}  {lint_s:>7} {peak:>7}  {b['service_fix_s']:>6.2f}  "
            f"{b['lint'][:90]} | {b['service_fix'][:90]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--tree", type=Path, default=REAL_TREE if REAL_TREE.is_dir() else EXAMPLES)
    parser.add_argument("--jobs", type=int, default=2, help="Worker processes for the second migrate run.")
    parser.add_argument("--validate", action="store_true", help="Also migrate examples/ with validation.")
    parser.add_argument("--no-bounds", action="store_true", help="Skip the bounds table.")
    parser.add_argument("--no-migrate", action="store_true", help="Skip the migrate runs.")
    parser.add_argument("--json", type=Path, help="Also write the numbers here (e.g. bench/results/serve.json).")
    args = parser.parse_args()
    os.environ.setdefault("XLAPORT_TRACES", str(Path(tempfile.mkdtemp(prefix="xlaport-bench-")) / "traces.jsonl"))

    report: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start",
        "service": service(args.requests),
        "migrate": []
        if args.no_migrate
        else [migrate_tree(args.tree.resolve(), 1)]
        + ([migrate_tree(args.tree.resolve(), args.jobs)] if args.jobs > 1 else []),
        "bounds": [] if args.no_bounds else bounds(),
    }
    if args.validate:
        report["validate"] = migrate_tree(EXAMPLES, 1, VALIDATE_CMD, unsafe=True)
    report["load_at_end"] = round(os.getloadavg()[0], 1)
    print_table(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
