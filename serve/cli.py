"""The command-line front of the pipeline: `migrate`, `suggest`, `serve` and `mcp`; `register` adds
them to the root app. Commands parse, call the pipeline and render; nothing else.

Each command imports what it runs inside its function: every `xlaport` invocation imports this module,
and the pipeline (libcst, matplotlib, the kb) would make `xlaport --help` take 5 s instead of 0.4 s.
"""

from __future__ import annotations

import json
import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from xlaport.cliutil import (
    EXIT_FAILED,
    ConfigOption,
    ConfiguredUnsafeOption,
    IgnoreOption,
    IsolatedOption,
    OutputFormat,
    SelectOption,
    TargetOption,
    UnsafeFixesOption,
    fail_usage,
    split_codes,
)


class Transport(StrEnum):
    stdio = "stdio"
    http = "http"


def migrate(
    src: Annotated[Path, typer.Argument(help="The project to migrate (only read, unless --in-place).")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Where the migrated copy (and the reports) are written.")
    ] = None,
    unsafe_fixes: ConfiguredUnsafeOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Write into a non-empty destination; with --in-place: rewrite dirty files.")
    ] = False,
    format: Annotated[OutputFormat, typer.Option("--format", help="Summary format.")] = OutputFormat.text,
    validate: Annotated[
        str | None,
        typer.Option(
            "--validate", help='Entry command to check on the migrated tree, e.g. "python train.py --steps 20".'
        ),
    ] = None,
    verify: Annotated[
        str | None,
        typer.Option(
            "--verify",
            help="Command for the L0–L4 assessment of the migrated tree against the original, run from the tree "
            'root, e.g. "python train.py --steps 40" (see `xlaport verify`).',
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs", "-j", min=1, max=64, help="Files rewritten in parallel \\[default: one per core for 8+ files]."
        ),
    ] = None,
    in_place: Annotated[
        bool,
        typer.Option("--in-place", help="Rewrite SRC itself (refuses a dirty git tree; reports go to SRC/.xlaport)."),
    ] = False,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    config: ConfigOption = None,
    isolated: IsolatedOption = False,
    target: TargetOption = "torch_xla",
    related: Annotated[
        int,
        typer.Option(
            "--related",
            min=0,
            max=20,
            help="Related kb fixes to search for each finding left for a human (loads the search model: seconds "
            "and ~1 GB) \\[default: 0, none].",
        ),
    ] = 0,
    optimize: Annotated[
        bool,
        typer.Option(
            "--optimize",
            help="Then try performance rewrites one at a time on the copy, kept only when the check and verify "
            "show a cheaper step with the same curve (see `xlaport optimize`).",
        ),
    ] = False,
    keep_trace: Annotated[
        bool,
        typer.Option(
            "--keep-trace",
            help="Keep the migration trace (the source of every changed file and function, before and after) in "
            "DST/xlaport-trace.jsonl and the training trace file (see README); off by default.",
        ),
    ] = False,
) -> None:
    """Migrate a whole tree: rewritten copy and reports (JSON, Markdown, HTML) in --out.

    Reads the lint configuration as `xlaport lint SRC` does ([tool.xlaport]: select, ignore, exclude,
    per-file-ignores, unsafe-fixes); --select/--ignore/--unsafe-fixes are a layer on top. Excluded files are copied.

    Exit 0 when done, 1 when validation rejected the migration, 2 on usage errors; with --verify, verify's
    exit code (0 pass, 1 fail, 3 inconclusive) unless validation rejected it."""

    from xlaport.files import DirtyTree, WriteFailed

    from .pipeline import MigrateOptions, get_pipeline
    from .tree import DestinationNotEmpty

    if out is None and not in_place:
        fail_usage("give --out DST (or --in-place to rewrite SRC itself)")
    _check_target(target)
    options = MigrateOptions(
        unsafe_fixes=unsafe_fixes,
        select=split_codes(select),
        ignore=split_codes(ignore),
        target=target,
        jobs=jobs,
        validate_cmd=validate,
        verify_cmd=verify,
        in_place=in_place,
        force=force,
        k=related,
        keep_trace=keep_trace,
        optimize=optimize,
        config=str(config) if config else None,
        isolated=isolated,
    )
    try:
        with ProgressBar() as progress:
            result = get_pipeline().migrate(src, out, options, progress)
    except (DestinationNotEmpty, NotADirectoryError, DirtyTree, ValueError) as exc:
        fail_usage(str(exc))
    except WriteFailed as exc:  # disk full, read-only: nothing half-written is left
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    if format is OutputFormat.json:
        typer.echo(json.dumps(result.summary(), indent=2))
    else:
        typer.echo(render_summary(result))
    for error in result.errors:
        typer.echo(f"error: {error}", err=True)
    if format is OutputFormat.text and result.verification is not None:
        from xlaport.eval.verify.cli import render_text as render_verify_text  # only with --verify: eval's imports

        typer.echo(render_verify_text(result.verification))
        typer.echo(f"  verify report: {result.verification.reports.get('html')} (also .json)")
    rejected = result.validation.status == "rejected"
    verify_exit = result.verification.exit_code if result.verification is not None else 0
    raise typer.Exit(1 if rejected else verify_exit)


def optimize(
    tree: Annotated[
        Path, typer.Argument(help="A migrated tree whose check reaches L2 (kept candidates are written there).")
    ],
    validate: Annotated[
        str | None,
        typer.Option(
            "--validate", help='Command the check runs, e.g. "python train.py --steps 20"; without it: propose only.'
        ),
    ] = None,
    verify: Annotated[
        str | None,
        typer.Option(
            "--verify", help="Command for verify against the original (its reference runs once, for every candidate)."
        ),
    ] = None,
    original: Annotated[
        Path | None,
        typer.Option(
            "--original", help="The original tree verify compares with \\[default: the src of TREE's migrate report]."
        ),
    ] = None,
    family: Annotated[
        list[str] | None, typer.Option("--family", help="Only these families (repeatable) \\[default: all].")
    ] = None,
    workdir: Annotated[
        str, typer.Option("--workdir", help="The folder of the trees the commands run in, relative to TREE.")
    ] = "",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Judge, but write nothing into TREE.")] = False,
    format: Annotated[OutputFormat, typer.Option("--format", help="Report format.")] = OutputFormat.text,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per run.")] = 600.0,
    timing_runs: Annotated[
        int,
        typer.Option(
            "--timing-runs",
            min=1,
            help="Runs of each tree, interleaved, when the step time decides: alone (equal counts of host reads and "
            "compiles), or whether a counted saving is clearly slower.",
        ),
    ] = 3,
) -> None:
    """Performance rewrites kept only with evidence: each candidate (per-step logging reads, GradScaler+float16,
    growing generation, host input pipelines) is applied alone, the check and verify run again against the same
    reference, and it is kept when the step cost improves and the curve holds.

    Exit 0 when done (kept or not), 1 when refused (the tree's check is not L2), 2 on usage errors."""
    from .optimize import optimize as run_optimize
    from .optimize import render_text as render_optimize

    try:
        report = run_optimize(
            tree,
            validate,
            verify,
            original,
            timeout_s=timeout,
            write=not dry_run,
            families_wanted=family,
            subdir=workdir,
            timing_runs=timing_runs,
        )
    except ValueError as exc:
        fail_usage(str(exc))
    typer.echo(json.dumps(report.to_dict(), indent=2) if format is OutputFormat.json else render_optimize(report))
    raise typer.Exit(1 if report.status == "refused" else 0)


class ProgressBar:
    """Progress on stderr while `migrate` runs, on a terminal only (nothing otherwise: logs and pipes stay clean):
    the phase now running (rewrite with a bar over the files, related fixes, write, verify and validation with the
    run now going on, reports) and the time so far; each phase, once done, is left above as a line with its time
    (serve/phases.py)."""

    def __init__(self, console=None) -> None:
        self.console = console  # a rich Console; default: stderr's

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.clock = time.perf_counter
        self.console = self.console or Console(stderr=True)
        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not self.console.is_terminal,
        )
        self.task = self.bar.add_task("migrate", total=None)
        self.current: tuple[str, float] | None = None
        self.bar.start()
        return self

    def phase(self, name: str, step: str | None = None) -> None:
        if self.current is None or self.current[0] != name:
            self._done()
            self.current = (name, self.clock())
        self.bar.update(self.task, description=f"{name}: {step}" if step else name, total=None, completed=0)

    def files(self, done: int, total: int, path: str) -> None:
        self.bar.update(self.task, description=f"rewrite {done}/{total} {path}", total=total, completed=done)

    def _done(self) -> None:
        if self.current is not None and self.console.is_terminal:
            name, started = self.current
            self.bar.console.print(f"[green]✓[/green] {name} ({self.clock() - started:.1f} s)")

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self._done()
        self.bar.stop()


def render_summary(result) -> str:
    data = result.summary()
    target = data["dst"] or f"{data['src']} (in place{'' if data['written'] else ', NOT written'})"
    v = data["validation"]
    lines = [
        f"migrated {data['src']} -> {target}",
        f"  python files: {data['python_files']}, changed: {data['files_changed']}, "
        f"other files copied: {data['other_files_copied']}, errors: {len(data['errors'])}",
        "  fixes applied: " + (", ".join(f"{c}×{n}" for c, n in data["fixes_applied"].items()) or "none"),
        "  left for a human: " + (", ".join(f"{c}×{n}" for c, n in data["findings_left"].items()) or "none"),
    ]
    for item in data["left_for_human"]:
        lines.append(f"    {item['path']}:{item['line']}: {item['code']} {item['message']}")
    lines.append(
        f"  validation: {v['status']}"
        + (f" (level {v['level']})" if v["level"] else "")
        + (f": {v['reason']}" if v["reason"] else "")
    )
    if data.get("optimization"):
        lines.append(f"  optimize: {data['optimization']['status']}: {data['optimization']['reason']}")
    lines += [f"  note: {n}" for n in data["notes"] if not n.startswith("optimize: ")]
    if data["reports"].get("html"):
        trace = f"; trace {data['reports']['trace']}" if data["reports"].get("trace") else ""
        lines.append(f"  report: {data['reports']['html']} (also .json, .md{trace})")
    return "\n".join(lines)


def _check_target(target: str) -> None:
    from xlaport.targets import check_target

    try:
        check_target(target)
    except KeyError as exc:
        fail_usage(str(exc.args[0]))


def suggest(
    file: Annotated[Path, typer.Argument(help="A Python file (only read).")],
    model: Annotated[
        Path | None,
        typer.Option("--model", help="Model directory (default: $XLAPORT_MODEL, else the newest LoRA model)."),
    ] = None,
    validate: Annotated[
        bool, typer.Option("--validate", help="Run the XLA execution check and generated tests on the result.")
    ] = False,
    unsafe_fixes: UnsafeFixesOption = False,
    args: Annotated[
        list[str] | None, typer.Option("--arg", help="An argument of FILE for the execution check (repeatable).")
    ] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = OutputFormat.text,
    target: TargetOption = "torch_xla",
) -> None:
    """Rules first, then the code model on the functions they left; every proposal goes through the pipeline."""

    from xlaport.kb import SourceError
    from xlaport.kb.parsing import max_source_bytes
    from xlaport.model.proposer import ModelNotUsable, load_proposer, no_model_message

    from xlaport.files import UnreadableSource, read_source

    from .pipeline import Pipeline, SuggestOptions

    try:
        source = read_source(file, max_source_bytes())
    except (OSError, UnreadableSource) as exc:
        fail_usage(str(exc))
    try:
        proposer = load_proposer(model)
    except ModelNotUsable as exc:
        fail_usage(str(exc))
    if proposer is None:
        typer.echo(no_model_message(), err=True)
    _check_target(target)
    options = SuggestOptions(unsafe_fixes=unsafe_fixes, validate_patch=validate, args=args or [], target=target)
    try:
        patch = Pipeline(proposer=proposer).suggest(source, str(file), options)
    except (SourceError, ValueError) as exc:
        fail_usage(str(exc))
    if format is OutputFormat.json:
        typer.echo(json.dumps({"model": proposer.name if proposer else None, **patch.model_dump()}, indent=2))
        return
    typer.echo(render_patch(patch, proposer.name if proposer else None))


def render_patch(patch, model_name: str | None) -> str:
    evidence = patch.evidence
    lines = [f"{patch.path}: model {model_name or 'none (rules-only)'}"]
    lines.append("  rules applied: " + (", ".join(evidence.codes_applied) or "none"))
    served = f" {evidence.model}" if evidence.model else ""
    lines.append(f"  rewritten by the model{served}: " + (", ".join(evidence.rewritten_functions) or "none"))
    for note in patch.notes:
        lines.append(f"  note: {note}")
    for item in patch.manual:
        f = item.finding
        lines.append(f"  left: {f.path}:{f.line}: {f.code} {f.message} (in {item.function})")
    lines.append(f"  validation: {evidence.status}" + (f" ({evidence.reason})" if evidence.reason else ""))
    for check in evidence.checks:
        result = {True: "passed", False: "failed", None: "did not run"}[check.passed]
        lines.append(f"    {check.name}: {result}" + (f" level {check.level}" if check.level else ""))
        lines.extend(f"      - {reason}" for reason in check.reasons)
    if patch.diff:
        lines.append(patch.diff.rstrip("\n"))
    return "\n".join(lines)


def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
) -> None:
    """Run the HTTP patch service (OpenAPI docs at /docs). Set XLAPORT_TOKEN to allow running code."""
    import uvicorn

    from .http import create_app

    if not os.environ.get("XLAPORT_TOKEN"):
        typer.echo(
            "note: XLAPORT_TOKEN is not set: /v1/check and /v1/verify are disabled and suggestions are not validated",
            err=True,
        )
    # the peer's address, never X-Forwarded-For (uvicorn trusts it from 127.0.0.1): it tells clients' slots apart
    uvicorn.run(create_app(), host=host, port=port, proxy_headers=False)


def mcp(
    transport: Annotated[
        Transport, typer.Option(help="stdio (for a local agent) or streamable HTTP.")
    ] = Transport.stdio,
    host: Annotated[str, typer.Option(help="Interface (http transport).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (http transport).")] = 8765,
    allow_exec: Annotated[
        bool | None,
        typer.Option(
            "--exec/--no-exec", help="Let tools run code in the sandbox (default: on for stdio, off for http)."
        ),
    ] = None,
    allow_write: Annotated[
        bool | None,
        typer.Option("--write/--no-write", help="Let migrate_repo write files (default: on for stdio, off for http)."),
    ] = None,
    root: Annotated[
        Path | None,
        typer.Option("--root", help="The only folder tools may read or write in \\[default: the current folder]."),
    ] = None,
    unauthenticated_read_only: Annotated[
        bool,
        typer.Option(
            "--unauthenticated-read-only",
            help="Serve HTTP without XLAPORT_TOKEN: any local process may call it; no tool runs code or writes.",
        ),
    ] = False,
    max_runs: Annotated[
        int | None,
        typer.Option(
            "--max-runs",
            min=1,
            help="Long calls (check, validation, migrate, verify) at once \\[default: one per core].",
        ),
    ] = None,
) -> None:
    """Run the MCP server (tools: suggest_patch, search_fixes, check_xla, explain_fix, migrate_repo, verify_migration).

    Over HTTP, clients must send `Authorization: Bearer $XLAPORT_TOKEN` (the server refuses to start without it,
    unless --unauthenticated-read-only)."""
    from .mcp import StartRefused, run_server

    if root is not None and not root.is_dir():
        fail_usage(f"--root: not a directory: {root}")
    try:
        run_server(transport.value, host, port, allow_exec, allow_write, root, unauthenticated_read_only, max_runs)
    except StartRefused as exc:
        fail_usage(str(exc))


def register(app: typer.Typer) -> None:
    """Adds this area's commands to the root app (see xlaport/cli.py)."""
    app.command()(migrate)
    app.command()(optimize)
    app.command()(suggest)
    app.command()(serve)
    app.command()(mcp)
