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
    ConfigOption,
    ConfiguredUnsafeOption,
    IgnoreOption,
    IsolatedOption,
    LintFormat,
    OutputFormat,
    SelectOption,
    TargetOption,
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


def _files(paths: list[Path], settings=None, force_exclude: bool = False) -> list[Path]:
    """Python files, and the config files and run scripts that kb/configs.py reads; without those the
    configuration excludes (a file named on the command line only with --force-exclude)."""
    from .configs import CONFIG_KINDS
    from .lint_config import is_excluded

    try:
        found = each_file_once(list(iter_python_files(paths, (".py", *CONFIG_KINDS))))  # a file reached twice: once
    except FileNotFoundError as exc:
        fail_usage(str(exc))
    if settings is None or not settings.exclude:
        return found
    named = set(paths)
    return [f for f in found if not is_excluded(f, settings) or (f in named and not force_exclude)]


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
        "--jobs", "-j", min=0, max=256, help="Worker processes \\[default: 0, one per core for 8+ files; 1: none]."
    ),
]


def _report_errors(results) -> int:
    errors = [r.error for r in results if r.error]
    for error in errors:
        typer.echo(f"error: {error}", err=True)
    return len(errors)


ExtendSelectOption = Annotated[
    list[str] | None, typer.Option("--extend-select", help="Codes, prefixes or categories to add to the selection.")
]
ForceExcludeOption = Annotated[
    bool, typer.Option("--force-exclude", help="Apply the configured exclude to files named on the command line too.")
]


def _configured(paths, select, extend_select, ignore, target, config, isolated):
    """(the lint settings, the rules they and the command line select): kb/lint_config.py has ruff's semantics."""
    from xlaport.targets import check_target

    from .engine import all_rules
    from .lint_config import ConfigError, Selection, check_per_file_selectors, choose_rules, load_settings

    try:
        settings = load_settings(paths, config, isolated)
    except ConfigError as exc:
        fail_usage(str(exc))
    given = Selection(
        select=None if select is None else tuple(split_codes(select) or ()),
        extend_select=tuple(split_codes(extend_select) or ()),
        ignore=tuple(split_codes(ignore) or ()),
    )
    try:
        available = all_rules(check_target(target))
    except KeyError as exc:
        fail_usage(str(exc.args[0]))
    try:  # a typo in the configuration is named with its file
        choose_rules(available, [settings.selection])
        check_per_file_selectors(settings, available)
    except KeyError as exc:
        fail_usage(f"{settings.source}: {exc.args[0]}")
    try:
        rules = choose_rules(available, [settings.selection, given])
    except KeyError as exc:
        fail_usage(str(exc.args[0]))
    return settings, rules


def _task(settings, rules, files: list[Path], **fields):
    """The batch task for `rules`, with the codes per-file-ignores turns off for each file."""
    from .batch import TreeTask
    from .lint_config import ignored_codes

    ignored = tuple((str(f), codes) for f in files if (codes := ignored_codes(f, settings, rules)))
    return TreeTask(codes=tuple(r.code for r in rules), ignored=ignored, **fields)


def _write_fixes(files: list[Path], results, force: bool) -> list:
    """Writes each fixed file in place (a backup where git is not the way back); the (path, result) pairs written.
    A file whose write failed gets its error and counts no fix."""
    changed = [(p, r) for p, r in zip(files, results, strict=True) if r.changed]
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
    return changed


def _fix_summary(verb: str, changed: list, remaining: int) -> str:
    applied = Counter(f.code for _, r in changed for f in r.applied)
    return f"{verb} {sum(applied.values())} fix(es) in {len(changed)} file(s); {remaining} finding(s) left"


def _statistics(findings, format: LintFormat) -> str:
    """One line per code, the most frequent first (ruff's --statistics): count, code, fix mark, title."""
    counts = Counter(f.code for f in findings)
    first = {}
    for f in findings:
        first.setdefault(f.code, f)
    order = sorted(counts, key=lambda code: (-counts[code], code))
    if format is LintFormat.json:
        rows = [
            {"code": c, "title": first[c].title, "count": counts[c], "fix": first[c].fix, "fixable": first[c].fixable}
            for c in order
        ]
        return json.dumps(rows, indent=2)
    marks = {"safe": "[*]", "unsafe": "[~]", "manual": "[ ]"}
    width = len(str(max(counts.values()))) if counts else 1
    return "\n".join(
        f"{counts[c]:>{width}}  {c}  {marks[first[c].fix] if first[c].fixable else '[ ]'} {first[c].title}"
        for c in order
    )


def _emit(text: str, output_file: Path | None) -> None:
    """The report on standard output, or in `output_file` (its folder made when missing)."""
    if output_file is None:
        if text:
            typer.echo(text)
        return
    try:
        output_file.parent.mkdir(parents=True, exist_ok=True)
        output_file.write_text(text + "\n" if text else "", encoding="utf-8")
    except OSError as exc:
        fail_usage(f"cannot write {output_file}: {exc.strerror or exc}")


def lint(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to check.")],
    select: SelectOption = None,
    extend_select: ExtendSelectOption = None,
    ignore: IgnoreOption = None,
    format: Annotated[LintFormat, typer.Option("--format", help="Output format.")] = LintFormat.text,
    fix: Annotated[
        bool, typer.Option("--fix", help="Apply the fixes in place first (as `xlaport fix`), then report what is left.")
    ] = False,
    unsafe_fixes: ConfiguredUnsafeOption = None,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even when there are findings.")] = False,
    statistics: Annotated[
        bool, typer.Option("--statistics", help="Count the findings per code instead of listing them.")
    ] = False,
    output_file: Annotated[
        Path | None, typer.Option("--output-file", "-o", help="Write the report to this file, not standard output.")
    ] = None,
    config: ConfigOption = None,
    isolated: IsolatedOption = False,
    force_exclude: ForceExcludeOption = False,
    jobs: JobsOption = 0,
    target: TargetOption = "torch_xla",
) -> None:
    """Report migration problems. Exit 1 when there are findings, 0 when none, 2 on usage errors.

    Settings: the tool.xlaport table of pyproject.toml, or xlaport.toml (select, extend-select, ignore, exclude,
    per-file-ignores, unsafe-fixes); the command line's options come on top, as in ruff."""
    from .batch import run_files
    from .report_formats import as_json, as_sarif, as_text

    if statistics and format is LintFormat.sarif:
        fail_usage("--statistics is text or json, not sarif")
    settings, rules = _configured(paths, select, extend_select, ignore, target, config, isolated)
    files = _files(paths, settings, force_exclude)
    if fix:
        for link in links_out_of(paths, files):
            files.remove(link)  # as `xlaport fix` (which says so): a folder is never rewritten outside itself
    found, trees = _jobs(paths, files)
    unsafe = settings.unsafe_fixes if unsafe_fixes is None else unsafe_fixes
    # JSON and SARIF carry each fix's edits (of a lint: with --fix the findings left are of the rewritten text, and
    # carry none); SARIF hashes the lines
    machine = format is not LintFormat.text and not statistics
    keep_source = fix or format is LintFormat.sarif
    task = _task(settings, rules, files, fix=fix, unsafe=unsafe, keep_source=keep_source, edits=machine and not fix)
    results = run_files(found, trees, task, _processes(jobs, len(files)))
    findings = [f for r in results for f in r.findings]  # with --fix: what the fixes left
    unanalysed = [(r.path, r.error) for r in results if r.error]
    if fix:
        changed = _write_fixes(files, results, force=False)
        typer.echo(_fix_summary("applied", changed, len(findings)), err=True)
    if statistics:
        _emit(_statistics(findings, format), output_file)
    elif format is LintFormat.json:
        _emit(as_json(findings, unanalysed), output_file)
    elif format is LintFormat.sarif:
        texts = {r.path: r.fixed if fix and r.fixed is not None else r.source for r in results}
        _emit(
            as_sarif(findings, unanalysed, {p: t for p, t in texts.items() if t is not None}, os.getcwd()), output_file
        )
    else:
        _emit(as_text(findings), output_file)
    if format is LintFormat.text or statistics:
        fixable = sum(f.fixable for f in findings)
        typer.echo(
            f"{len(findings)} finding(s) in {len(results)} file(s); {fixable} fixable "
            f"([*] safe, [~] with --unsafe-fixes, [ ] manual)",
            err=True,
        )
    errors = _report_errors(results)
    raise typer.Exit(0 if exit_zero else 1 if findings or errors else 0)


def fix(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to rewrite in place.")],
    diff: Annotated[bool, typer.Option("--diff", help="Print a unified diff; write nothing.")] = False,
    unsafe_fixes: ConfiguredUnsafeOption = None,
    select: SelectOption = None,
    extend_select: ExtendSelectOption = None,
    ignore: IgnoreOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Rewrite files with uncommitted git changes (keeps a .xlaport.bak).")
    ] = False,
    config: ConfigOption = None,
    isolated: IsolatedOption = False,
    force_exclude: ForceExcludeOption = False,
    jobs: JobsOption = 0,
    target: TargetOption = "torch_xla",
) -> None:
    """Apply the knowledge base's fixes in place (or show them with --diff). Settings as for `lint`."""
    from .batch import run_files

    settings, rules = _configured(paths, select, extend_select, ignore, target, config, isolated)
    files = _files(paths, settings, force_exclude)
    for link in links_out_of(paths, files):
        typer.echo(f"note: {link}: a link to a file outside the folder given; not rewritten", err=True)
        files.remove(link)
    found, trees = _jobs(paths, files)
    unsafe = settings.unsafe_fixes if unsafe_fixes is None else unsafe_fixes
    results = run_files(
        found, trees, _task(settings, rules, files, fix=True, unsafe=unsafe), _processes(jobs, len(files))
    )
    if diff:
        changed = [(p, r) for p, r in zip(files, results, strict=True) if r.changed]
        for path, r in changed:
            sys.stdout.writelines(
                difflib.unified_diff(
                    r.source.splitlines(keepends=True), r.fixed.splitlines(keepends=True), f"a/{path}", f"b/{path}"
                )
            )
    else:
        changed = _write_fixes(files, results, force)
    # what was written (or, with --diff, would be): a file whose write failed counts no fix
    remaining = sum(len(r.findings) for r in results)
    typer.echo(_fix_summary("would apply" if diff else "applied", changed, remaining), err=True)
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
    helpUri points at these pages where they are published (XLAPORT_DOCS_URL), else at a copy in the cache."""
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
