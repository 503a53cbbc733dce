"""The `xlaport` command line: a thin front over the library; each area adds its commands here."""

from __future__ import annotations

import difflib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from xlaport.cliutil import LintFormat, OutputFormat, fail_usage, split_codes
from xlaport.files import DirtyTree, atomic_write, backup_path, check_in_place_allowed, iter_python_files

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
kb_app = typer.Typer(no_args_is_help=True, help="Browse the fix knowledge base.")
app.add_typer(kb_app, name="kb")

def _rules(select: list[str] | None, ignore: list[str] | None = None):
    from xlaport.kb import select_rules

    try:
        return select_rules(split_codes(select), split_codes(ignore))
    except KeyError as exc:
        fail_usage(str(exc.args[0]))


def _files(paths: list[Path]) -> list[Path]:
    """Python files, and the config files and run scripts that kb/configs.py reads."""
    from xlaport.kb.configs import CONFIG_KINDS

    try:
        return list(iter_python_files(paths, (".py", *CONFIG_KINDS)))
    except FileNotFoundError as exc:
        fail_usage(str(exc))


def _report_errors(results) -> int:
    errors = [r.error for r in results if r.error]
    for error in errors:
        typer.echo(f"error: {error}", err=True)
    return len(errors)


@app.command()
def lint(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to check.")],
    select: Annotated[list[str] | None, typer.Option(help="Codes, code prefixes or categories (C1..C7).")] = None,
    ignore: Annotated[list[str] | None, typer.Option(help="Codes, prefixes or categories to skip.")] = None,
    format: Annotated[LintFormat, typer.Option("--format", help="Output format.")] = LintFormat.text,
) -> None:
    """Report migration problems. Exit 1 when there are findings, 0 when none, 2 on usage errors."""
    from xlaport.kb.batch import lint_file
    from xlaport.kb.report_formats import as_json, as_sarif, as_text

    rules = _rules(select, ignore)
    results = [lint_file(p, rules) for p in _files(paths)]
    findings = [f for r in results for f in r.findings]
    if format is LintFormat.json:
        typer.echo(as_json(findings))
    elif format is LintFormat.sarif:
        typer.echo(as_sarif(findings))
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


@app.command()
def fix(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to rewrite in place.")],
    diff: Annotated[bool, typer.Option("--diff", help="Print a unified diff; write nothing.")] = False,
    unsafe_fixes: Annotated[bool, typer.Option("--unsafe-fixes", help="Also apply fixes that may change behaviour.")] = False,
    select: Annotated[list[str] | None, typer.Option(help="Codes, prefixes or categories.")] = None,
    ignore: Annotated[list[str] | None, typer.Option(help="Codes, prefixes or categories to skip.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rewrite files with uncommitted git changes (keeps a .xlaport.bak).")] = False,
) -> None:
    """Apply the knowledge base's fixes in place (or show them with --diff)."""
    from xlaport.kb.batch import fix_file

    rules = _rules(select, ignore)
    files = _files(paths)
    results = [fix_file(p, rules, unsafe=unsafe_fixes) for p in files]
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
            needs_backup = check_in_place_allowed([p for p, _ in changed], force)
        except DirtyTree as exc:
            fail_usage(str(exc))
        for path, r in changed:
            if needs_backup:
                atomic_write(backup_path(path), r.source)
            atomic_write(path, r.fixed)
    applied = Counter(f.code for r in results for f in r.applied)
    remaining = sum(len(r.findings) for r in results)
    verb = "would apply" if diff else "applied"
    typer.echo(
        f"{verb} {sum(applied.values())} fix(es) in {len(changed)} file(s); {remaining} finding(s) left", err=True
    )
    errors = _report_errors(results)
    raise typer.Exit(1 if errors else 0)


# `migrate` and `suggest` live in serve/cli.py (fronts of the migration pipeline).


@kb_app.command("list")
def kb_list(format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.text) -> None:
    """Every entry: code, category, fix applicability, title."""
    from xlaport.kb import all_rules
    from xlaport.kb.docs import entry_dict

    rules = all_rules()
    if format is OutputFormat.json:
        typer.echo(json.dumps([entry_dict(r) for r in rules], indent=2))
        return
    for r in rules:
        typer.echo(f"{r.code}  {r.category}  {r.fix:<6}  {'auto' if r.autofix else '    '}  {r.title}")


@kb_app.command("show")
def kb_show(code: Annotated[str, typer.Argument(help="A rule code such as XLA201.")]) -> None:
    """One entry in full: what it detects, why, example, fix safety, references."""
    from xlaport.kb import get_rule
    from xlaport.kb.docs import render_markdown

    try:
        rule = get_rule(code)
    except KeyError as exc:
        fail_usage(str(exc.args[0]))
    typer.echo(render_markdown(rule))


def _register_areas() -> None:
    # each area owns its commands; heavy imports stay inside the command functions
    from xlaport.eval.cli import register as register_eval
    from xlaport.serve.cli import register as register_serve
    from xlaport.training.cli import register as register_training

    for register in (register_eval, register_serve, register_training):
        register(app)


_register_areas()


def main() -> None:
    app()
