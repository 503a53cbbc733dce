"""Performance of lint, fix, migrate and the service, with the parse-only floor measured in the same run.

    .venv/bin/python bench/perf.py [--jobs 2] [--every 1] [--requests 30] [--json out.json]
    .venv/bin/python bench/perf.py --skip kb migrate service     # the commands only (and their floor)
    .venv/bin/python bench/perf.py --acceptance [--json out.json]  # issue #27's figures only, table + JSON

- kb: torch's own `torch/nn`, `torch/optim`, `torch/distributed` (471 files in torch 2.9.0, from the
  installed package: offline). libcst parse only (the floor), `lint` (all rules), `fix` (all safe rewrites),
  back to back over the same files with the same `--jobs` worker processes; files/s, lines/s, the ratio to
  the floor (wall time, and the workers' CPU time: steadier on a shared machine) and the peak RSS of a worker.
- migrate (no validation, rules only) of a tree of real code: the repositories under /work/corpus (or `--tree`).
- commands: what a user runs, as subprocesses, start-up included: `xlaport lint DIR...` over the same torch
  folders (`-j --jobs`), `xlaport fix DIR...` on a copy of them, `xlaport migrate` of that copy, and `migrate`
  of one file (examples/amp_classifier/train.py alone in a folder). Wall time, the CPU time of the process tree
  (user + sys of the command and the workers it waited for) and the peak RSS of its largest process; lint's and
  fix's ratios to the parse-only floor (wall, and CPU).
- service: `POST /v1/suggest` (rules only, no validation, the ~200-line file of bench/serve.py) and
  `POST /v1/search`, p50/p95 through the real ASGI app.

Prints a table and the same numbers as JSON (the load average is part of both: the machine is shared).
Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import libcst as cst

from serve import QUERIES, bench_file, percentile, timed_requests  # bench/serve.py

PACKAGE_DIRS = ("nn", "optim", "distributed")
CORPUS = Path("/work/corpus")
TREES = (
    "karpathy__nanoGPT",
    "karpathy__minGPT",
    "kuangliu__pytorch-cifar",
    "HobbitLong__SupContrast",
    "facebookresearch__mae",
)


def torch_dirs() -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    root = Path(next(iter(spec.submodule_search_locations)))
    return [root / d for d in PACKAGE_DIRS]


def torch_files() -> list[Path]:
    return [p for d in torch_dirs() for p in sorted(d.rglob("*.py")) if p.is_file()]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# Each task returns (lines, findings or fixes, peak RSS in MB, CPU seconds of the work): on a shared machine the
# CPU-time ratio is the steadier one (wall time also counts other people's processes).


def parse_only(path: Path) -> tuple[int, int, float, float]:
    source = path.read_text(encoding="utf-8")
    start = time.process_time()
    cst.parse_module(source)
    return source.count("\n"), 0, _rss_mb(), time.process_time() - start


def lint(path: Path) -> tuple[int, int, float, float]:
    from xlaport.kb import lint_source

    source = path.read_text(encoding="utf-8")
    start = time.process_time()
    found = len(lint_source(source, str(path)))
    return source.count("\n"), found, _rss_mb(), time.process_time() - start


def fix(path: Path) -> tuple[int, int, float, float]:
    from xlaport.kb import fix_source

    source = path.read_text(encoding="utf-8")
    start = time.process_time()
    fixed = len(fix_source(source, str(path)).applied)
    return source.count("\n"), fixed, _rss_mb(), time.process_time() - start


def _warm(_: int) -> None:
    from xlaport.kb import all_rules

    all_rules()


def kb_rows(files: list[Path], jobs: int, modes: int = 3) -> list[dict]:
    rows = []
    for name, task in (("parse only (floor)", parse_only), ("lint", lint), ("fix", fix))[:modes]:
        with Pool(jobs) as pool:  # fresh workers per mode: the peak RSS is that mode's
            pool.map(_warm, range(jobs))  # import cost is not part of the measurement
            start = time.perf_counter()
            results = pool.map(task, files, chunksize=2)
            seconds = time.perf_counter() - start
        lines = sum(r[0] for r in results)
        rows.append(
            {
                "mode": name,
                "seconds": round(seconds, 2),
                "files_per_s": round(len(files) / seconds, 1),
                "lines_per_s": round(lines / seconds),
                "findings_or_fixes": sum(r[1] for r in results),
                "peak_rss_mb": round(max(r[2] for r in results)),
                "cpu_seconds": round(sum(r[3] for r in results), 2),
            }
        )
    floor, cpu_floor = rows[0]["seconds"], rows[0]["cpu_seconds"]
    for row in rows:
        row["x_floor"] = round(row["seconds"] / floor, 2)
        row["x_floor_cpu"] = round(row["cpu_seconds"] / cpu_floor, 2)
    return rows


def migrate_row(trees: list[Path], jobs: int) -> dict:
    from xlaport.serve.pipeline import Pipeline
    from xlaport.serve.results import MigrateOptions

    pipeline = Pipeline(proposer=None)
    pipeline.warm_up()
    lines = files = 0
    seconds = 0.0
    with tempfile.TemporaryDirectory(prefix="xlaport-perf-") as tmp:
        os.environ["XLAPORT_TRACES"] = str(Path(tmp) / "traces.jsonl")  # not the user's trace file
        for tree in trees:
            py = list(tree.rglob("*.py"))
            files += len(py)
            lines += sum(p.read_text(encoding="utf-8", errors="replace").count("\n") for p in py)
            start = time.perf_counter()
            pipeline.migrate(tree, Path(tmp) / tree.name, MigrateOptions(jobs=jobs))
            seconds += time.perf_counter() - start
    return {
        "mode": f"migrate ({len(trees)} trees)",
        "seconds": round(seconds, 2),
        "files": files,
        "lines": lines,
        "files_per_s": round(files / seconds, 1),
        "lines_per_s": round(lines / seconds),
    }


XLAPORT = [sys.executable, "-m", "xlaport"]
ONE_FILE = Path(__file__).resolve().parent.parent / "examples" / "amp_classifier" / "train.py"


# Runs a command and reports on it from a small process of its own: the peak RSS a child reports (ru_maxrss) starts
# at its parent's RSS when it was forked (Linux copies the high-water mark with the memory map and keeps it across
# exec), so a command started from this process, which has imported the service by then, reported ~150 MB for a
# migrate that peaks at ~60 MB. Forked from this small process instead, it starts at ~10 MB.
_MEASURE = """
import json, os, sys, time
fd, command = int(sys.argv[1]), sys.argv[2:]
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.close(fd)  # the report's pipe: a long-lived worker of the command must not hold it open
    os.execv(command[0], command)
_, status, usage = os.wait4(pid, 0)
report = [time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, os.waitstatus_to_exitcode(status)]
os.write(fd, json.dumps(report).encode())
"""


def timed_command(args: list[str], cwd: Path | None = None) -> dict:
    """One command as a subprocess: wall seconds, CPU seconds of its process tree (the command and the processes
    it waited for: its workers; not a forkserver's children, which `migrate`'s are), peak RSS (MB) of its largest
    process, exit code, and its standard output."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    # start-up as a user has it: an installed package has its bytecode compiled (a session's
    # PYTHONDONTWRITEBYTECODE=1 made every command compile xlaport's ~90 modules again: ~0.1 s CPU each start)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    read, write = os.pipe()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", _MEASURE, str(write), *map(str, args)],
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            text=True,
            env=env,
            pass_fds=(write,),
        )
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            report = pipe.read()
        process.wait()
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    if not report:
        raise SystemExit(f"{' '.join(map(str, args))}: no report ({err[-2000:]})")
    wall, cpu, peak_kb, code = json.loads(report)
    if code not in (0, 1):
        raise SystemExit(f"{' '.join(map(str, args))} exited {code}: {err[-2000:]}")
    return {
        "seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 2),
        "peak_rss_mb": round(peak_kb / 1024),
        "exit": code,
        "stdout": out,
    }


def _count_findings(stdout: str) -> int:
    """`lint --format json`: {"findings": [...], ...} (a bare list before schema 2)."""
    found = json.loads(stdout)
    return len(found["findings"] if isinstance(found, dict) else found)


def command_rows(dirs: list[Path], jobs: int, floor: dict) -> list[dict]:
    """The CLI on the torch folders (lint; fix and migrate on a copy) and migrate of one file."""
    rows = []
    jobs_args = ["-j", str(jobs)]
    lint = timed_command([*XLAPORT, "lint", *map(str, dirs), "--format", "json", *jobs_args])
    findings = len(json.loads(lint.pop("stdout"))["findings"])
    rows.append({"mode": "xlaport lint DIRS", "findings_or_fixes": findings, **lint})
    with tempfile.TemporaryDirectory(prefix="xlaport-perf-cli-") as tmp:
        copies = []
        for d in dirs:
            copy = Path(tmp, "src", d.name)
            shutil.copytree(d, copy, ignore=shutil.ignore_patterns("__pycache__"))
            copies.append(copy)
        fix = timed_command([*XLAPORT, "fix", *map(str, copies), *jobs_args])
        fix.pop("stdout")
        rows.append({"mode": "xlaport fix DIRS (a copy)", **fix})
        for copy in copies:  # migrate reads the original text again
            shutil.rmtree(copy)
            shutil.copytree(dirs[copies.index(copy)], copy, ignore=shutil.ignore_patterns("__pycache__"))
        migrate = timed_command(
            [*XLAPORT, "migrate", str(Path(tmp, "src")), "--out", str(Path(tmp, "out")), *jobs_args]
        )
        migrate.pop("stdout")
        rows.append({"mode": "xlaport migrate DIR (the copy)", **migrate})
        one = Path(tmp, "one")
        one.mkdir()
        shutil.copy(ONE_FILE, one / ONE_FILE.name)
        single = timed_command([*XLAPORT, "migrate", str(one), "--out", str(Path(tmp, "one-out"))])
        single.pop("stdout")
        rows.append({"mode": "xlaport migrate (one file)", **single})
    for row in rows[:2]:
        row["x_floor"] = round(row["seconds"] / floor["seconds"], 2)
        row["x_floor_cpu"] = round(row["cpu_seconds"] / floor["cpu_seconds"], 2)
    return rows


SCALES = (10_000, 40_000, None)  # lines of torch's code linted as one tree (None: all 471 files, ~160k lines)


def scaling_rows(jobs: int) -> list[dict]:
    """`xlaport lint TREE -j jobs` (a subprocess, start-up included) on the first files of the torch folders up to
    ~10k, ~40k lines and on all of them, each copied as one tree (`nn/...`, `optim/...`), each next to the
    parse-only floor of the same files measured just before it: the ratio, and the cost per line."""
    root = torch_dirs()[0].parent
    files = torch_files()
    rows = []
    for scale in SCALES:
        chosen, lines = [], 0
        for path in files:
            if scale is not None and lines >= scale:
                break
            chosen.append(path)
            lines += path.read_text(encoding="utf-8").count("\n")
        floor = kb_rows(chosen, jobs, modes=1)[0]
        with tempfile.TemporaryDirectory(prefix="xlaport-perf-scale-") as tmp:
            for path in chosen:
                copy = Path(tmp, path.relative_to(root))
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, copy)
            lint = timed_command([*XLAPORT, "lint", tmp, "--format", "json", "-j", str(jobs)])
        findings = _count_findings(lint.pop("stdout"))
        rows.append(
            {
                "files": len(chosen),
                "lines": lines,
                "floor_seconds": floor["seconds"],
                "lint_seconds": lint["seconds"],
                "x_floor": round(lint["seconds"] / floor["seconds"], 2),
                "lint_us_per_line": round(1e6 * lint["seconds"] / lines, 1),
                "floor_us_per_line": round(1e6 * floor["seconds"] / lines, 1),
                # CPU time (the parse's in the workers; the command's and its workers'): steadier under load
                "floor_cpu_seconds": floor["cpu_seconds"],
                "lint_cpu_seconds": lint["cpu_seconds"],
                "x_floor_cpu": round(lint["cpu_seconds"] / floor["cpu_seconds"], 2),
                "lint_cpu_us_per_line": round(1e6 * lint["cpu_seconds"] / lines, 1),
                "findings": findings,
                "lint_peak_rss_mb": lint["peak_rss_mb"],
                "load_average": round(os.getloadavg()[0], 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def warm_bytecode() -> None:
    """One untimed `xlaport lint` and `migrate` of one file, so that the timed commands start as an installed
    package does (with xlaport's bytecode written), not the first one alone compiling it."""
    with tempfile.TemporaryDirectory(prefix="xlaport-perf-warm-") as tmp:
        one = Path(tmp, "one")
        one.mkdir()
        shutil.copy(ONE_FILE, one / ONE_FILE.name)
        timed_command([*XLAPORT, "lint", str(one), "--format", "json"])
        timed_command([*XLAPORT, "migrate", str(one), "--out", str(Path(tmp, "one-out"))])


def one_file_migrate() -> dict:
    """`xlaport migrate` of examples/amp_classifier/train.py alone in a folder, no evidence asked."""
    with tempfile.TemporaryDirectory(prefix="xlaport-perf-one-") as tmp:
        one = Path(tmp, "one")
        one.mkdir()
        shutil.copy(ONE_FILE, one / ONE_FILE.name)
        found = timed_command([*XLAPORT, "migrate", str(one), "--out", str(Path(tmp, "one-out"))])
    found.pop("stdout")
    return found


def acceptance(jobs: int, requests: int) -> dict:
    """Issue #27's figures, each measured here in one run: lint vs the parse floor over the torch folders, its cost
    per line at ~10k/40k/160k lines, suggest p50/p95 with a new text each request, migrate of one file."""
    out: dict = {"load_average_at_start": os.getloadavg(), "cpus": os.cpu_count(), "jobs": jobs}
    warm_bytecode()
    out["scaling"] = scaling_rows(jobs)
    service = service_rows(requests)
    out["suggest_new_text"] = next(r for r in service if "new text" in r["mode"])
    out["migrate_one_file"] = one_file_migrate()
    out["load_average_at_end"] = os.getloadavg()
    whole, small = out["scaling"][-1], out["scaling"][0]
    s, m = out["suggest_new_text"], out["migrate_one_file"]
    out["figures"] = [
        ("lint / parse floor, torch nn+optim+distributed", whole["x_floor"], "<= 2"),
        ("the same in CPU time (command + workers / parse)", whole["x_floor_cpu"], "<= 2"),
        (
            "lint / floor CPU at " + " / ".join(f"{round(r['lines'] / 1000)}k" for r in out["scaling"]) + " lines",
            " / ".join(str(r["x_floor_cpu"]) for r in out["scaling"]),
            "<= 2",
        ),
        (
            "lint us/line at " + " / ".join(f"{round(r['lines'] / 1000)}k" for r in out["scaling"]) + " lines",
            " / ".join(str(r["lint_us_per_line"]) for r in out["scaling"]),
            "flat",
        ),
        (
            "lint cost per line, largest / smallest",
            round(whole["lint_us_per_line"] / small["lint_us_per_line"], 2),
            "~1",
        ),
        ("suggest p50 ms (new 200-line text)", s["p50_ms"], "<= 75"),
        ("suggest p95 ms (new 200-line text)", s["p95_ms"], "<= 150"),
        ("suggest CPU ms per request (service + its workers)", s.get("cpu_ms_per_request"), ""),
        ("migrate one file: seconds", m["seconds"], "<= 2"),
        ("migrate one file: peak MB", m["peak_rss_mb"], "<= 200"),
        ("migrate one file: CPU seconds", m["cpu_seconds"], ""),
    ]
    return out


def print_acceptance(out: dict) -> None:
    print(
        f"\nload average {out['load_average_at_start'][0]:.1f} at start, {out['load_average_at_end'][0]:.1f} at end; "
        f"{out['cpus']} cpus, -j {out['jobs']}"
    )
    print(
        f"{'files':>6} {'lines':>7} {'floor s':>8} {'lint s':>8} {'x floor':>8} {'lint us/line':>13} "
        f"{'floor cpu s':>12} {'lint cpu s':>11} {'x cpu':>7} {'cpu us/line':>12} {'findings':>9} {'load':>5}"
    )
    for r in out["scaling"]:
        print(
            f"{r['files']:>6} {r['lines']:>7} {r['floor_seconds']:>8.2f} {r['lint_seconds']:>8.2f} "
            f"{r['x_floor']:>7.2f}x {r['lint_us_per_line']:>13} {r['floor_cpu_seconds']:>12.2f} "
            f"{r['lint_cpu_seconds']:>11.2f} {r['x_floor_cpu']:>6.2f}x {r['lint_cpu_us_per_line']:>12} "
            f"{r['findings']:>9} {r['load_average']:>5}"
        )
    print(f"\n{'figure':<52} {'measured':>22} {'goal':>8}")
    for name, value, goal in out["figures"]:
        print(f"{name:<52} {str(value):>22} {goal:>8}")


def service_rows(requests: int) -> list[dict]:
    return asyncio.run(_service_rows(requests))


async def _service_rows(requests: int) -> list[dict]:
    """Through the ASGI app in one event loop, as a server drives it (bench/serve.py's way), lifespan run once."""
    import httpx
    from xlaport.serve.http import create_app
    from xlaport.serve.pipeline import Pipeline

    source, lines = bench_file()
    app = create_app(Pipeline(proposer=None), token=None, max_concurrency=1, timeout_s=600)  # rules only
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            first = [{"source": source, "path": "bench.py"}]
            await timed_requests(client, "/v1/suggest", first)  # first call: imports
            # the same text again (served from the content-hash cache) and a new text each time (a comment differs)
            same = await timed_requests(client, "/v1/suggest", first * requests)
            new = [{"source": f"{source}\n# request {i}\n", "path": "bench.py"} for i in range(requests)]
            cpu_before = process_tree_cpu_seconds()
            fresh = await timed_requests(client, "/v1/suggest", new)
            fresh_cpu_ms = round(1000 * (process_tree_cpu_seconds() - cpu_before) / len(new))
            searches = [{"text": QUERIES[i % len(QUERIES)], "k": 5} for i in range(requests)]
            await timed_requests(client, "/v1/search", searches[: len(QUERIES)])  # each query seen once before
            search = await timed_requests(client, "/v1/search", searches)
            unseen = [{"text": f"{QUERIES[i % len(QUERIES)]} (request {i})", "k": 5} for i in range(requests)]
            search_new = await timed_requests(client, "/v1/search", unseen)
    measured = (
        (f"POST /v1/suggest ({lines} lines, rules only, same text)", same),
        (f"POST /v1/suggest ({lines} lines, rules only, new text)", fresh),
        ("POST /v1/search (8 queries, each seen before)", search),
        ("POST /v1/search (a new query each time)", search_new),
    )
    rows = [
        {
            "mode": name,
            "n": len(times),
            "p50_ms": round(1000 * statistics.median(times)),
            "p95_ms": round(1000 * percentile(times, 95)),
        }
        for name, times in measured
    ]
    rows[1]["cpu_ms_per_request"] = fresh_cpu_ms
    return rows


def process_tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and every process under it (the service's fix workers are
    children of a forkserver it started), from /proc; 0 where there is none."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, CPU seconds)
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    ours = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, (parent, _) in stats.items() if parent in ours} - ours
        grew = bool(found)
        ours |= found
    return sum(stats[pid][1] for pid in ours if pid in stats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--every", type=int, default=1, help="every K-th file of the torch corpus (1 = all 471)")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--tree", type=Path, nargs="*", help="trees to migrate (default: 5 repos in /work/corpus)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["kb", "migrate", "commands", "service"])
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.add_argument(
        "--acceptance",
        action="store_true",
        help="only issue #27's figures: lint vs floor and per line at 10k/40k/160k, suggest, migrate of one file",
    )
    args = parser.parse_args()
    if args.acceptance:
        found = acceptance(args.jobs, args.requests)
        print_acceptance(found)
        text = json.dumps(found, indent=1)
        print("\n" + text)
        if args.json:
            args.json.write_text(text)
        return

    out: dict = {"load_average_at_start": os.getloadavg(), "cpus": os.cpu_count(), "jobs": args.jobs}
    files = torch_files()[:: args.every]
    out["kb_corpus"] = {"files": len(files), "lines": sum(p.read_text().count("\n") for p in files)}
    if "kb" not in args.skip:
        out["kb"] = kb_rows(files, args.jobs)
        print(json.dumps(out["kb"]), flush=True)  # partial results survive a later failure
    if "commands" not in args.skip:
        floor = out["kb"][0] if "kb" in out else kb_rows(files, args.jobs, modes=1)[0]
        out["commands"] = command_rows(torch_dirs(), args.jobs, floor)
        print(json.dumps(out["commands"]), flush=True)
    if "migrate" not in args.skip:
        trees = args.tree or [CORPUS / t for t in TREES if (CORPUS / t).is_dir()]
        out["migrate"] = migrate_row(trees, args.jobs)
        print(json.dumps(out["migrate"]), flush=True)
    if "service" not in args.skip:
        out["service"] = service_rows(args.requests)
    out["load_average_at_end"] = os.getloadavg()

    print(
        f"load average {out['load_average_at_start'][0]:.1f} at start, {out['load_average_at_end'][0]:.1f} at end; "
        f"{out['cpus']} cpus, {args.jobs} worker processes"
    )
    if "kb" in out:
        c = out["kb_corpus"]
        print(f"\ntorch/{{{','.join(PACKAGE_DIRS)}}}: {c['files']} files, {c['lines']} lines")
        print(
            f"{'mode':<20} {'seconds':>8} {'x floor':>8} {'cpu s':>8} {'x cpu':>7} {'files/s':>8} {'lines/s':>8} "
            f"{'found/fixed':>11} {'peak MB':>8}"
        )
        for r in out["kb"]:
            print(
                f"{r['mode']:<20} {r['seconds']:>8.1f} {r['x_floor']:>7.2f}x {r['cpu_seconds']:>8.1f} "
                f"{r['x_floor_cpu']:>6.2f}x {r['files_per_s']:>8.1f} {r['lines_per_s']:>8} {r['findings_or_fixes']:>11} "
                f"{r['peak_rss_mb']:>8}"
            )
    if "commands" in out:
        print(f"\ncommands (subprocesses, start-up included; -j {args.jobs}; ratios to the parse-only floor above)")
        print(f"{'command':<32} {'seconds':>8} {'x floor':>8} {'cpu s':>8} {'x cpu':>7} {'peak MB':>8} {'findings':>9}")
        for r in out["commands"]:
            ratio = f"{r['x_floor']:>7.2f}x" if "x_floor" in r else f"{'':>8}"
            cpu_ratio = f"{r['x_floor_cpu']:>6.2f}x" if "x_floor_cpu" in r else f"{'':>7}"
            print(
                f"{r['mode']:<32} {r['seconds']:>8.1f} {ratio} {r['cpu_seconds']:>8.1f} {cpu_ratio} "
                f"{r['peak_rss_mb']:>8} {r.get('findings_or_fixes', ''):>9}"
            )
    if "migrate" in out:
        r = out["migrate"]
        print(
            f"\n{r['mode']}: {r['files']} files, {r['lines']} lines in {r['seconds']:.1f} s = "
            f"{r['files_per_s']} files/s, {r['lines_per_s']} lines/s"
        )
    if "service" in out:
        print()
        for r in out["service"]:
            print(f"{r['mode']:<52} n={r['n']:<4} p50 {r['p50_ms']:>6} ms  p95 {r['p95_ms']:>6} ms")
    text = json.dumps(out, indent=1)
    print("\n" + text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
