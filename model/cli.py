"""`xlaport suggest FILE [--model DIR]`: the code model's proposals for one file, with the pipeline's verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from xlaport.cliutil import OutputFormat, fail_usage


def suggest(
    file: Annotated[Path, typer.Argument(help="A Python file (only read).")],
    model: Annotated[Path | None, typer.Option("--model", help="Model directory (default: $XLAPORT_MODEL, else the newest LoRA model).")] = None,
    validate: Annotated[bool, typer.Option("--validate", help="Run the XLA execution check and generated tests on the result.")] = False,
    unsafe_fixes: Annotated[bool, typer.Option("--unsafe-fixes", help="Also apply rule fixes that may change behaviour.")] = False,
    args: Annotated[list[str] | None, typer.Option("--arg", help="An argument of FILE for the execution check (repeatable).")] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = OutputFormat.text,
) -> None:
    """Rules first, then the code model on the functions they left; every proposal goes through the pipeline."""
    from xlaport.kb import SourceError
    from xlaport.model.proposer import ModelNotUsable, load_proposer, no_model_message
    from xlaport.serve.pipeline import Pipeline, SuggestOptions

    from xlaport.files import UnreadableSource, read_source

    try:
        source = read_source(file)
    except (OSError, UnreadableSource) as exc:
        fail_usage(str(exc))
    try:
        proposer = load_proposer(model)
    except ModelNotUsable as exc:
        fail_usage(str(exc))
    if proposer is None:
        typer.echo(no_model_message(), err=True)
    options = SuggestOptions(unsafe_fixes=unsafe_fixes, validate_patch=validate, args=args or [])
    try:
        patch = Pipeline(proposer=proposer).suggest(source, str(file), options)
    except (SourceError, ValueError) as exc:
        fail_usage(str(exc))
    if format is OutputFormat.json:
        typer.echo(json.dumps({"model": proposer.name if proposer else None, **patch.model_dump()}, indent=2))
        return
    typer.echo(render(patch, proposer.name if proposer else None))


def render(patch, model_name: str | None) -> str:
    evidence = patch.evidence
    lines = [f"{patch.path}: model {model_name or 'none (rules-only)'}"]
    lines.append("  rules applied: " + (", ".join(evidence.codes_applied) or "none"))
    lines.append("  rewritten by the model: " + (", ".join(evidence.rewritten_functions) or "none"))
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


def register(app: typer.Typer) -> None:
    """Adds this area's commands to the root app (see xlaport/cli.py)."""
    app.command()(suggest)
