"""`xlaport` commands of the knowledge base: `lint`, `fix` and the `kb` group (`list`, `show`, `search`);
`register` adds them to the root app.

Each command imports the engine inside its function: every `xlaport` invocation imports this module, and
libcst and the rules would slow `xlaport --help` down.
"""

from __future__ import annotations

import difflib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from xlaport.cliutil import (
    IgnoreOption,
    LintFormat,
    OutputFormat,
    SelectOption,
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

if TYPE_CHECKING:
    from .analysis.project import ProjectSteps


def _rules(select: list[str] | None, ignore: list[str] | None = None):
    from . import select_rules

    try:
        return select_rules(split_codes(select), split_codes(ignore))
    except KeyError as exc:
        fail_usage(str(exc.args[0]))


def _files(paths: list[Path]) -> list[Path]:
    """Python files, and the config files and run scripts that kb/configs.py reads."""
    from .configs import CONFIG_KINDS

    try:
        return each_file_once(list(iter_python_files(paths, (".py", *CONFIG_KINDS))))  # a file reached twice: once
    except FileNotFoundError as exc:
        fail_usage(str(exc))


def _projects(paths: list[Path], files: list[Path]) -> dict[Path, ProjectSteps]:
    """The tree summary (kb/analysis/project.py) of each folder given, for the Python files under it: a loop
    there that calls another module's stepping helper gets its barrier, as in `xlaport migrate`."""
    from .batch import summarize_project

    found: dict[Path, ProjectSteps] = {}
    for folder in (p for p in paths if p.is_dir()):
        inside = [f for f in files if f.suffix == ".py" and folder in f.parents and f not in found]
        if inside:
            project = summarize_project(folder, [f.relative_to(folder) for f in inside], named_from=folder)
            found.update(dict.fromkeys(inside, project))
    return found


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
) -> None:
    """Report migration problems. Exit 1 when there are findings, 0 when none, 2 on usage errors."""
    from .batch import lint_file
    from .report_formats import as_json, as_sarif, as_text

    rules = _rules(select, ignore)
    files = _files(paths)
    projects = _projects(paths, files)
    results = [lint_file(p, rules, project=projects.get(p)) for p in files]
    findings = [f for r in results for f in r.findings]
    if format is LintFormat.json:
        typer.echo(as_json(findings))
    elif format is LintFormat.sarif:
        typer.echo(as_sarif(findings, [(r.path, r.error) for r in results if r.error]))
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
) -> None:
    """Apply the knowledge base's fixes in place (or show them with --diff)."""
    from .batch import fix_file

    rules = _rules(select, ignore)
    files = _files(paths)
    for link in links_out_of(paths, files):
        typer.echo(f"note: {link}: a link to a file outside the folder given; not rewritten", err=True)
        files.remove(link)
    projects = _projects(paths, files)
    results = [fix_file(p, rules, unsafe=unsafe_fixes, project=projects.get(p)) for p in files]
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


def kb_list(format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.text) -> None:
    """Every entry: code, category, fix applicability, title."""
    from . import all_rules
    from .docs import entry_dict

    rules = all_rules()
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
    app.add_typer(kb_app, name="kb")
