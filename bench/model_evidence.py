"""Findings closed with evidence: the rules alone vs rules + the code model, on manual findings of real programs.

    .venv/bin/python bench/model_evidence.py [--model DIR | --no-model] [--only SUBSTRING] [--static-only]
        [--corpus /work/corpus] [--env DIR] [--json out.json] [--accepted accepted.jsonl]

The findings are those of bench/model_findings.toml: sites the default `xlaport migrate` leaves for a human, in
real training programs that run here with small synthetic data. For each program (its snapshot under
`--corpus/OWNER__NAME`, fetched by you; never kept here):

  default   `xlaport migrate` (no flags): the manifest's findings must be reported there (else: stale manifest);
  rules     `xlaport migrate --unsafe-fixes`: every rule, unsafe fixes included;
  model     the rules' copy, then for each function holding a finding the rules left, the code model's proposal
            (`xlaport.model`'s Proposer: the adapter rewrites that one function) spliced into the file.

A finding is closed *statically* in an arm when the lint of that arm's file no longer reports its code at its line
of the function (fewer findings of that code in the function, none on an identical line). It is closed *with
evidence* when, in addition, that arm's copy, run as the user runs it (`xlaport check SCRIPT --max-steps N -- ARGS`,
PJRT_DEVICE=CPU, from the program's folder), still reaches L2, the check shows no every-step host sync left in that
function other than at the sites of findings still open there, and, where the program prints a training loss,
`xlaport verify ORIGINAL ARM -- python SCRIPT ARGS` stays L3. Findings at module level cannot be given to the model
(it rewrites one function): they are listed as "not tried". Each arm's program runs only when a finding closed in it
statically, and the default copy runs once alongside as the baseline (does the program reach L2 without a patch?).

`--accepted FILE` appends the model's proposals that closed a finding with evidence as migration traces
(`xlaport.trace` records: the function before and after, the codes it fixed, `validated: true`), the input of
`xlaport train data --accepted FILE` (the flywheel). A benchmark, not a test: prints a table and JSON, exits 0.
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
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unseen import DEFAULT_CORPUS, bench_python, check_report, snapshot_dir, xlaport_command
from unseen_data import make as make_data

MANIFEST = Path(__file__).resolve().parent / "model_findings.toml"
MODULE = "<module>"
HOST_SYNC_CODES = {"XLA401", "XLA402", "XLA403", "XLA404", "XLA405"}


@dataclass(frozen=True)
class Site:
    path: str
    line: int
    code: str
    function: str
    what: str = ""


@dataclass(frozen=True)
class Program:
    repo: str
    commit: str
    script: str
    findings: tuple[Site, ...]
    cwd: str = "."
    args: tuple[str, ...] = ()
    data: str | None = None
    max_steps: int = 20
    timeout_s: float = 600
    deps: tuple[str, ...] = ()
    loss: bool = False


@dataclass
class FindingResult:
    repo: str
    script: str
    path: str
    line: int
    code: str
    function: str
    reported_by_default: bool = False
    rules_static: bool = False
    rules_evidence: bool = False
    model_tried: bool = False
    model_note: str = ""  # why not tried, the rejection, or the proposal's rationale
    model_static: bool = False
    model_evidence: bool = False
    evidence: dict = field(default_factory=dict)  # arm -> what the runs said


def load_manifest(path: Path = MANIFEST) -> list[Program]:
    programs = []
    for entry in tomllib.loads(path.read_text(encoding="utf-8")).get("program", []):
        entry = dict(entry)
        findings = tuple(Site(**f) for f in entry.pop("findings"))
        entry["args"] = tuple(entry.get("args", ()))
        entry["deps"] = tuple(entry.get("deps", ()))
        programs.append(Program(findings=findings, **entry))
    return programs


# --- static: which findings each arm's files still report ---------------------------------------------------------
def function_span(source: str, function: str) -> tuple[int, int] | None:
    """(first, last) line of `function` in `source`; the whole file for MODULE."""
    from xlaport.model.spans import function_spans

    if function == MODULE:
        return 1, len(source.splitlines())
    return next(((s, e) for name, s, e in function_spans(source) if name == function), None)


def in_function(source: str, function: str, line: int) -> bool:
    from xlaport.model.spans import enclosing_function, function_spans

    return enclosing_function(function_spans(source), line) == function


def still_reported(site: Site, default_source: str, source: str) -> bool:
    """Whether `source` (an arm's version of the file) still reports `site`: a finding of its code on a line of the
    same function with the same text, or no fewer findings of that code in the function than the default copy had."""
    from xlaport.kb import lint_source

    def of_code(text: str) -> list[int]:
        return [f.line for f in lint_source(text) if f.code == site.code and in_function(text, site.function, f.line)]

    line_text = default_source.splitlines()[site.line - 1].strip()
    after = of_code(source)
    lines = source.splitlines()
    if any(lines[n - 1].strip() == line_text for n in after):
        return True
    return len(after) >= len(of_code(default_source))


# --- runs ---------------------------------------------------------------------------------------------------------
def run_check(python: Path, tree: Path, program: Program) -> dict:
    started = time.perf_counter()
    report, error = check_report(python, tree, program)
    if report is None:
        return {"level": "none", "reasons": [error]}
    syncs = [
        {"site": p.get("site"), "every_step": p.get("every_step"), "ms_per_step": p.get("ms_per_step")}
        for p in report.get("performance", [])
        if p.get("kind") == "host_sync"
    ]
    return {
        "level": report.get("level", "?"),
        "reasons": report.get("reasons", [])[:3],
        "steps": report.get("steps"),
        "host_syncs": syncs,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def run_verify(python: Path, original: Path, tree: Path, program: Program) -> dict:
    cwd = tree / program.cwd
    script = os.path.relpath(tree / program.script, cwd)
    command = [
        *xlaport_command(python),
        "verify",
        str(original),
        str(tree),
        "--format",
        "json",
        "--timeout",
        str(program.timeout_s),
        "--",
        "python",
        script,
        *program.args,
    ]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env={**os.environ, "PJRT_DEVICE": "CPU"}, capture_output=True, text=True)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"level": "none", "reason": f"verify gave no report ({done.returncode}): {done.stderr[-400:]}"}
    return {
        "level": report.get("level", "?"),
        "verdict": report.get("verdict"),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def sync_left(check: dict, site: Site, source: str, open_lines: set[str]) -> list[str]:
    """Every-step host syncs the check saw inside `site`'s function of `source`, leaving out lines whose text is
    that of a finding still open there (those are not this finding's)."""
    span = function_span(source, site.function)
    lines = source.splitlines()
    left = []
    for sync in check.get("host_syncs", []):
        where = sync.get("site") or ""
        path, _, number = where.rpartition(":")
        if not sync.get("every_step") or not path.endswith(site.path) or not number.isdigit() or span is None:
            continue
        n = int(number)
        if span[0] <= n <= span[1] and in_function(source, site.function, n) and lines[n - 1].strip() not in open_lines:
            left.append(where.rsplit("/", 1)[-1])
    return left


# --- one program --------------------------------------------------------------------------------------------------
def migrate(python: Path, source: Path, out: Path, *flags: str) -> dict:
    done = subprocess.run(
        [*xlaport_command(python), "migrate", str(source), "--out", str(out), "--format", "json", *flags],
        capture_output=True,
        text=True,
    )
    if not out.is_dir():
        raise RuntimeError(f"migrate failed ({done.returncode}): {done.stderr[-600:]}")
    return json.loads(done.stdout)


def propose(model, source: str, function: str, codes: set[str]) -> tuple[str | None, str]:
    """(the file with `function` rewritten, or None; what happened)."""
    from xlaport.kb import lint_source
    from xlaport.model.proposer import ProposalRejected

    findings = [f for f in lint_source(source) if f.code in codes and in_function(source, function, f.line)]
    try:
        proposal = model.propose(source, function, findings, [])
    except ProposalRejected as exc:
        return None, f"rejected: {exc}"
    if proposal is None:
        return None, "not a function of the file"
    return proposal.source, proposal.rationale


def measure(
    program: Program, corpus: Path, env_dir: Path, work: Path, model, static_only: bool, log
) -> tuple[list, list]:
    """(FindingResults, accepted traces) of one program."""
    results = [
        FindingResult(program.repo, program.script, s.path, s.line, s.code, s.function) for s in program.findings
    ]
    source_dir = snapshot_dir(corpus, program.repo)
    if not source_dir.is_dir():
        for r in results:
            r.evidence["error"] = f"no snapshot at {source_dir}"
        return results, []
    python = bench_python(list(program.deps), env_dir)
    repo_dir = work / program.repo.replace("/", "__")  # the migrations of a repository serve all its programs
    original = repo_dir / "original"
    trees = {"default": repo_dir / "default", "rules": repo_dir / "rules"}
    if not (trees["rules"] / ".model-evidence-done").is_file():  # a kept --work folder is reused
        shutil.rmtree(repo_dir, ignore_errors=True)
        shutil.copytree(source_dir, original, symlinks=True)
        migrate(python, original, trees["default"])
        migrate(python, original, trees["rules"], "--unsafe-fixes")
        (trees["rules"] / ".model-evidence-done").touch()
    if program.data:
        for tree in (original, *trees.values()):
            make_data(program.data, tree)
    files = {site.path for site in program.findings}
    text = {arm: {p: (tree / p).read_text(encoding="utf-8") for p in files} for arm, tree in trees.items()}

    from xlaport.kb import lint_source

    for site, r in zip(program.findings, results, strict=True):
        reported = [f for f in lint_source(text["default"][site.path]) if f.code == site.code and f.line == site.line]
        r.reported_by_default = bool(reported)
        r.rules_static = not still_reported(site, text["default"][site.path], text["rules"][site.path])

    # the model: one proposal per function that holds findings the rules left
    accepted_candidates: dict[tuple[str, str], tuple[str, str]] = {}  # (path, function) -> (before, after)
    text["model"] = dict(text["rules"])
    if model is not None:
        by_function: dict[tuple[str, str], list[int]] = {}
        for index, (site, r) in enumerate(zip(program.findings, results, strict=True)):
            if not r.rules_static:
                by_function.setdefault((site.path, site.function), []).append(index)
        for (path, function), indexes in by_function.items():
            if function == MODULE:
                for i in indexes:
                    results[i].model_note = "not tried: module-level code (the model rewrites one function)"
                continue
            codes = {program.findings[i].code for i in indexes}
            started = time.perf_counter()
            new_source, note = propose(model, text["model"][path], function, codes)
            log(f"    model on {path}:{function} ({time.perf_counter() - started:.0f} s): {note[:160]}")
            for i in indexes:
                results[i].model_tried = True
                results[i].model_note = note
            if new_source is not None:
                accepted_candidates[(path, function)] = (text["model"][path], new_source)
                text["model"][path] = new_source
        for site, r in zip(program.findings, results, strict=True):
            r.model_static = r.rules_static or (
                r.model_tried and not still_reported(site, text["default"][site.path], text["model"][site.path])
            )
        if accepted_candidates:
            trees["model"] = work / "model"
            shutil.rmtree(trees["model"], ignore_errors=True)
            shutil.copytree(trees["rules"], trees["model"], symlinks=True)
            for path in files:
                (trees["model"] / path).write_text(text["model"][path], encoding="utf-8")
    if static_only:
        return results, []

    # evidence: run each arm that closed something statically, and the default copy as the baseline
    arms = [a for a in ("rules", "model") if a in trees and any(getattr(r, f"{a}_static") for r in results)]
    if arms and text["model"] == text["rules"] and "model" in arms:
        arms.remove("model")  # the model changed nothing: its copy is the rules' copy
    if not arms:
        return results, []  # nothing closed statically: no run could show evidence
    runs = {}
    for arm in ["default", *arms]:
        log(f"    check {arm} ...")
        runs[arm] = {"check": run_check(python, trees[arm], program)}
        log(
            f"      {runs[arm]['check']['level']} ({runs[arm]['check'].get('wall_s')} s) {runs[arm]['check']['reasons'][:1]}"
        )
        if arm != "default" and program.loss and runs[arm]["check"]["level"] in ("L2", "L3", "L4"):
            runs[arm]["verify"] = run_verify(python, original, trees[arm], program)
            log(f"      verify {runs[arm]['verify']}")
    for r in results:
        r.evidence = {arm: run for arm, run in runs.items()}
    shared = runs.get("rules") if "model" not in runs else None
    for arm in ("rules", "model"):
        run = runs.get(arm) or (shared if arm == "model" else None)
        if run is None:
            continue
        for site, r in zip(program.findings, results, strict=True):
            if not getattr(r, f"{arm}_static"):
                continue
            open_lines = {
                text["default"][o.path].splitlines()[o.line - 1].strip()
                for o, other in zip(program.findings, results, strict=True)
                if o.path == site.path and o.function == site.function and not getattr(other, f"{arm}_static")
            }
            left = (
                sync_left(run["check"], site, text[arm][site.path], open_lines) if site.code in HOST_SYNC_CODES else []
            )
            verified = not program.loss or (run.get("verify", {}).get("level") in ("L3", "L4"))
            closed = run["check"]["level"] in ("L2", "L3", "L4") and not left and verified
            setattr(r, f"{arm}_evidence", closed or (arm == "model" and r.rules_evidence))
            r.evidence[f"{arm}_syncs_left"] = left
    traces = []
    for (path, function), (before, after) in accepted_candidates.items():
        closed = [
            r
            for s, r in zip(program.findings, results, strict=True)
            if s.path == path and s.function == function and r.model_evidence and not r.rules_evidence
        ]
        if closed:
            codes = sorted({r.code for r in closed})
            traces.append(accepted_trace(program, path, function, before, after, codes, model.name, runs["model"]))
    return results, traces


def accepted_trace(
    program: Program, path: str, function: str, before: str, after: str, codes: list[str], model: str, run: dict
) -> dict:
    """An `xlaport.trace` function record of an accepted candidate: the post-rule function before, the model's
    rewrite after, and the run that accepted it (what `xlaport train data --accepted` reads)."""
    import difflib

    from xlaport.model.spans import function_sources

    from xlaport.trace import TraceRecord, TraceValidation

    original = function_sources(before)[function]
    migrated = function_sources(after).get(function, "")
    verify = run.get("verify", {}).get("level")
    record = TraceRecord(
        run_id=f"model-evidence-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}",
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        src=f"{program.repo}@{program.commit[:12]}",
        path=path,
        unit="function",
        function=function,
        original=original,
        migrated=migrated,
        patch="".join(difflib.unified_diff(original.splitlines(True), migrated.splitlines(True), path, path)),
        codes_applied=codes,
        codes_left=[],
        proposed_by=[f"model:{model}"],
        validation=TraceValidation(
            status="validated",
            level=verify or run["check"]["level"],
            reasons=[],
            command=" ".join(["python", program.script, *program.args]),
        ),
    )
    return json.loads(record.to_json())


# --- report -------------------------------------------------------------------------------------------------------
def summarize(results: list[FindingResult]) -> dict:
    counted = [r for r in results if r.reported_by_default]
    return {
        "findings": len(results),
        "reported_by_default_migrate": len(counted),
        "by_code": dict(Counter(r.code for r in counted)),
        "in_functions": sum(r.function != MODULE for r in counted),
        "rules_static": sum(r.rules_static for r in counted),
        "rules_evidence": sum(r.rules_evidence for r in counted),
        "model_tried": sum(r.model_tried for r in counted),
        "rules_model_static": sum(r.model_static for r in counted),
        "rules_model_evidence": sum(r.model_evidence or r.rules_evidence for r in counted),
        "programs_reaching_l2_unpatched": sorted(
            {
                f"{r.repo}:{r.script}"
                for r in counted
                if r.evidence.get("default", {}).get("check", {}).get("level") in ("L2", "L3", "L4")
            }
        ),
    }


def table(results: list[FindingResult]) -> str:
    rows = [f"{'finding':70} {'code':7} {'rules':>9} {'+model':>9}  model"]
    for r in results:
        rules = ("E" if r.rules_evidence else "s" if r.rules_static else "-") + (" " if r.reported_by_default else "?")
        both = "E" if r.model_evidence or r.rules_evidence else "s" if r.model_static else "-"
        name = f"{r.repo.split('/')[-1]}/{r.path}:{r.line} {r.function}"
        rows.append(f"{name[:70]:70} {r.code:7} {rules:>9} {both:>9}  {r.model_note[:90]}")
    rows.append(
        "E: closed with evidence; s: closed by lint only (no run evidence); -: open; ?: not reported by migrate"
    )
    return "\n".join(rows)


def write_json(
    path: Path, model, static_only: bool, started: float, results: list, traces: list, partial: bool
) -> None:
    payload = {
        "model": str(model.model_dir) if model else None,
        "static_only": static_only,
        "partial": partial,
        "wall_s": round(time.perf_counter() - started, 1),
        "summary": summarize(results),
        "findings": [asdict(r) for r in results],
        "accepted": traces,
    }
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--env", type=Path, default=Path(tempfile.gettempdir()) / "xlaport-model-evidence-env")
    parser.add_argument("--model", type=Path, help="LoRA model directory (default: $XLAPORT_MODEL, else the newest)")
    parser.add_argument("--no-model", action="store_true", help="rules only")
    parser.add_argument("--only", help="only programs whose repo/script contains this")
    parser.add_argument("--skip", action="append", default=[], help="leave out programs whose repo/script has this")
    parser.add_argument("--work", type=Path, help="keep the migrated copies here (reused by a later run)")
    parser.add_argument("--static-only", action="store_true", help="lint only: no check or verify runs")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--accepted", type=Path, help="append accepted candidates' traces (JSONL) here")
    args = parser.parse_args(argv)
    os.environ.setdefault("USE_TORCH_XLA", "0")  # the model and the lint run eagerly here; runs are children

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    model = None
    if not args.no_model:
        from xlaport.model.proposer import load_proposer, no_model_message

        started = time.perf_counter()
        model = load_proposer(args.model)
        if model is None:
            raise SystemExit(no_model_message())
        log(f"model {model.model_dir} loaded in {time.perf_counter() - started:.0f} s")
    programs = [
        p
        for p in load_manifest()
        if (not args.only or args.only in f"{p.repo}/{p.script}")
        and not any(skip in f"{p.repo}/{p.script}" for skip in args.skip)
    ]
    results, traces = [], []
    started = time.perf_counter()
    work = args.work or Path(tempfile.mkdtemp(prefix="xlaport-model-evidence-"))
    work.mkdir(parents=True, exist_ok=True)
    for program in programs:
        log(f"... {program.repo}: {program.script}")
        try:
            found, accepted = measure(program, args.corpus, args.env, work, model, args.static_only, log)
        except Exception as exc:  # one broken program never stops the list
            found = [
                FindingResult(program.repo, program.script, s.path, s.line, s.code, s.function)
                for s in program.findings
            ]
            for r in found:
                r.evidence["error"] = f"{type(exc).__name__}: {exc}"
            accepted = []
            log(f"    ! {type(exc).__name__}: {exc}")
        results += found
        traces += accepted
        if args.json:  # after each program: a long run stopped early keeps what it measured
            write_json(args.json, model, args.static_only, started, results, traces, partial=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(results)
    print(table(results))
    print(json.dumps(summary, indent=1))
    if args.accepted and traces:
        with args.accepted.open("a", encoding="utf-8") as out:
            for trace in traces:
                out.write(json.dumps(trace) + "\n")
    if args.json:
        write_json(args.json, model, args.static_only, started, results, traces, partial=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
