"""`xlaport` commands of the knowledge base: `lint`, `fix` and the `kb` group (`list`, `show`, `search`, `docs`);
`register` adds them to the root app.

Each command imports the engine inside its function: every `xlaport` invocation imports this module, and
libcst and the rules would slow `xlaport --help` down.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from xlaport.cliutil import (
    IgnoreOption,
    LintFormat,
    OutputFormat,
    SelectOption,
    TargetOption,
    UnsafeFixesOption,
    fail_usage,
    split_codes,
)
from xlaport.files import (
    DirtyTree,
    WriteFailed,
    each_file_once,
    in_place_backups,
    iter_python_files,
    links_out_of,
    write_with_backup,
)


def _rules(select: list[str] | None, ignore: list[str] | None = None, target: str = "torch_xla"):
    from . import select_rules

    try:
        return select_rules(split_codes(select), split_codes(ignore), target)
    except KeyError as exc:
        fail_usage(str(exc.args[0]))


def _files(paths: list[Path]) -> list[Path]:
    """Python files, and the config files and run scripts that kb/configs.py reads."""
    from .configs import CONFIG_KINDS

    try:
        return each_file_once(list(iter_python_files(paths, (".py", *CONFIG_KINDS))))  # a file reached twice: once
    except FileNotFoundError as exc:
        fail_usage(str(exc))


def _jobs(paths: list[Path], files: list[Path]) -> tuple[list, list]:
    """What `lint` and `fix` hand kb/batch.py: each folder given is a tree (kb/analysis/project.py) of the Python
    files under it, so a loop there that calls another module's stepping helper gets its barrier, as in
    `xlaport migrate`; other files are analysed alone. Returns (the files' jobs in their order, the trees)."""
    from .batch import FileJob, Tree

    trees: list[Tree] = []
    where: dict[Path, tuple[int, Path]] = {}
    for folder in (p for p in paths if p.is_dir()):
        inside = [f for f in files if f.suffix == ".py" and folder in f.parents and f not in where]
        if inside:
            rels = tuple(f.relative_to(folder) for f in inside)
            where.update({f: (len(trees), rel) for f, rel in zip(inside, rels, strict=True)})
            trees.append(Tree(folder, rels, named_from=folder))
    found = [FileJob(f, str(f), *where[f]) if f in where else FileJob(f, str(f)) for f in files]
    return found, trees


def _processes(jobs: int, files: int) -> int:
    from .batch import auto_jobs

    return auto_jobs(files) if jobs == 0 else jobs


JobsOption = Annotated[
    int,
    typer.Option(
        "--jobs", "-j", min=0, max=256, help="Worker processes [default: 0, one per core for 8+ files; 1: none]."
    ),
]


def _report_errors(results) -> int:
    errors = [r.error for r in results if r.error]
    for error in errors:
        typer.echo(f"error: {error}", err=True)
    return len(errors)


def lint(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to check.")],
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    format: Annotated[LintFormat, typer.Option("--format", help="Output format.")] = LintFormat.text,
    jobs: JobsOption = 0,
    target: TargetOption = "torch_xla",
) -> None:
    """Report migration problems. Exit 1 when there are findings, 0 when none, 2 on usage errors."""
    from .batch import TreeTask, run_files
    from .report_formats import as_json, as_sarif, as_text

    rules = _rules(select, ignore, target)
    files = _files(paths)
    found, trees = _jobs(paths, files)
    machine = format is not LintFormat.text  # JSON and SARIF carry each fix's edits; SARIF hashes the lines
    task = TreeTask(codes=tuple(r.code for r in rules), keep_source=format is LintFormat.sarif, edits=machine)
    results = run_files(found, trees, task, _processes(jobs, len(files)))
    findings = [f for r in results for f in r.findings]
    unanalysed = [(r.path, r.error) for r in results if r.error]
    if format is LintFormat.json:
        typer.echo(as_json(findings, unanalysed))
    elif format is LintFormat.sarif:
        sources = {r.path: r.source for r in results if r.source is not None}
        typer.echo(as_sarif(findings, unanalysed, sources, os.getcwd()))
    else:
        if findings:
            typer.echo(as_text(findings))
        fixable = sum(f.fixable for f in findings)
        typer.echo(
            f"{len(findings)} finding(s) in {len(results)} file(s); {fixable} fixable "
            f"([*] safe, [~] with --unsafe-fixes, [ ] manual)",
            err=True,
        )
    errors = _report_errors(results)
    raise typer.Exit(1 if findings or errors else 0)


def fix(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to rewrite in place.")],
    diff: Annotated[bool, typer.Option("--diff", help="Print a unified diff; write nothing.")] = False,
    unsafe_fixes: UnsafeFixesOption = False,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Rewrite files with uncommitted git changes (keeps a .xlaport.bak).")
    ] = False,
    jobs: JobsOption = 0,
    target: TargetOption = "torch_xla",
) -> None:
    """Apply the knowledge base's fixes in place (or show them with --diff)."""
    from .batch import TreeTask, run_files

    rules = _rules(select, ignore, target)
    files = _files(paths)
    for link in links_out_of(paths, files):
        typer.echo(f"note: {link}: a link to a file outside the folder given; not rewritten", err=True)
        files.remove(link)
    found, trees = _jobs(paths, files)
    task = TreeTask(fix=True, codes=tuple(r.code for r in rules), unsafe=unsafe_fixes)
    results = run_files(found, trees, task, _processes(jobs, len(files)))
    changed = [(p, r) for p, r in zip(files, results, strict=True) if r.changed]
    if diff:
        for path, r in changed:
            sys.stdout.writelines(
                difflib.unified_diff(
                    r.source.splitlines(keepends=True), r.fixed.splitlines(keepends=True), f"a/{path}", f"b/{path}"
                )
            )
    else:
        try:
            needs_backup = in_place_backups([p for p, _ in changed], force)
        except DirtyTree as exc:
            fail_usage(str(exc))
        for path, r in list(changed):
            try:  # not over an edit made while the tree was analysed (ChangedMeanwhile)
                write_with_backup(path, r.fixed, path in needs_backup, expected=r.source)
            except WriteFailed as exc:  # disk full, read-only or immutable file: report it, go on with the others
                r.error = str(exc)
                changed.remove((path, r))
    # what was written (or, with --diff, would be): a file whose write failed counts no fix
    applied = Counter(f.code for _, r in changed for f in r.applied)
    remaining = sum(len(r.findings) for r in results)
    verb = "would apply" if diff else "applied"
    typer.echo(
        f"{verb} {sum(applied.values())} fix(es) in {len(changed)} file(s); {remaining} finding(s) left", err=True
    )
    errors = _report_errors(results)
    raise typer.Exit(1 if errors else 0)


def kb_list(
    format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.text, target: TargetOption = "torch_xla"
) -> None:
    """Every entry of the target: code, category, fix applicability, title."""
    from .docs import entry_dict

    rules = _rules(None, None, target)
    if format is OutputFormat.json:
        typer.echo(json.dumps([entry_dict(r) for r in rules], indent=2))
        return
    for r in rules:
        typer.echo(f"{r.code}  {r.category}  {r.fix:<6}  {'auto' if r.autofix else '    '}  {r.title}")


def kb_show(code: Annotated[str, typer.Argument(help="A rule code such as XLA201.")]) -> None:
    """One entry in full: what it detects, why, example, fix safety, references."""
    from . import get_rule
    from .docs import render_markdown

    try:
        rule = get_rule(code)
    except KeyError as exc:
        fail_usage(str(exc.args[0]))
    typer.echo(render_markdown(rule))


def kb_docs(
    out: Annotated[Path, typer.Option("--out", help="Folder for the pages (created when missing).")],
    target: TargetOption = "torch_xla",
) -> None:
    """Write one HTML page per rule (what, why, before/after, fix safety) and an index.html into OUT; SARIF's
    helpUri points at these pages where they are published (XLAPORT_DOCS_URL)."""
    from .docs import write_docs

    rules = _rules(None, None, target)
    if out.exists() and not out.is_dir():
        fail_usage(f"not a folder: {out}")
    written = write_docs(out, rules)
    typer.echo(f"wrote {len(written) - 1} rule page(s) and {out / 'index.html'}", err=True)


def kb_search(
    text: Annotated[str, typer.Argument(help="Code, a finding or an error message; '-' reads standard input.")],
    k: Annotated[int, typer.Option("-k", min=1, max=50, help="How many entries.")] = 5,
    format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.text,
) -> None:
    """The kb entries closest to TEXT (semantic search over the fix knowledge base)."""
    from .retrieval import search_fixes

    query = sys.stdin.read() if text == "-" else text
    if not query.strip():
        fail_usage("the search text is empty")
    hits = search_fixes(query, k)
    if format is OutputFormat.json:
        typer.echo(json.dumps([h.model_dump() for h in hits], indent=2))
        return
    for rank, hit in enumerate(hits, 1):
        typer.echo(f"{rank}. {hit.code}  {hit.score:.3f}  {hit.fix:<6}  {hit.title}")
        typer.echo(f"     matched {hit.matched}")


def register(app: typer.Typer) -> None:
    """Adds `lint` and `fix`, and the `kb` group with `list`, `show` and `search`, to the root app."""
    app.command()(lint)
    app.command()(fix)
    kb_app = typer.Typer(no_args_is_help=True, help="Browse the fix knowledge base.")
    kb_app.command("list")(kb_list)
    kb_app.command("show")(kb_show)
    kb_app.command("search")(kb_search)
    kb_app.command("docs")(kb_docs)
    app.add_typer(kb_app, name="kb")
