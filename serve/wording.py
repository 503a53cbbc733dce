"""Messages in the terms of the API they are read through: the HTTP service and the MCP tools take parameters,
not command-line options, so a reason written for the CLI (`--unsafe-fixes`, `--workdir DIR`) is said with the
parameter a caller of the API would set. Light: every front imports it."""

from __future__ import annotations

import re
from typing import TypeVar

from pydantic import BaseModel

T = TypeVar("T")
# fields that hold the user's code or a program's own output: never rewritten
_VERBATIM = frozenset({"diff", "migrated", "source", "original", "stdout_tail", "error", "replacement", "example"})

# CLI wording -> the API's, first match first (longer forms before their prefixes)
_API_TERMS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"`?xlaport migrate --unsafe-fixes`?"), "`unsafe_fixes: true`"),
    (re.compile(r"`?--unsafe-fixes`?"), "`unsafe_fixes: true`"),
    (re.compile(r"run it with `?--workdir DIR`? \(workdir= in the API\)"), "give the folder it runs from as `cwd`"),
    (re.compile(r"`?--workdir(?: DIR)?`?"), "`cwd`"),
    (re.compile(r"; discarded with the run \(--keep-outputs DIR keeps them\)"), "; discarded with the run"),
    (re.compile(r"`--related 3` lists 3 per finding left"), "`k` sets how many per finding left"),
    (re.compile(r" \(use --all to test every public one\)"), ""),
    (re.compile(r"\(--validate\)"), "(`validate`)"),
    (re.compile(r"\(--reference-log, repeated\)"), "(`reference_log_repeats` in the project's xlaport.toml)"),
    (re.compile(r"`?--reference-log`?"), "`reference_log` in the project's xlaport.toml"),
    (re.compile(r"a stated claim \(--claim\)"), "a stated claim (`claim` in the project's xlaport.toml)"),
    (re.compile(r"`xlaport verify --migrated-arg`"), "`migrated_args` in the project's xlaport.toml"),
    (re.compile(r"--migrated-arg=\S+(?: --migrated-arg=\S+)?"), "`migrated_args` in the project's xlaport.toml"),
    (re.compile(r"\(`?--allow-unsandboxed`?[^)]*\)"), "(only the command line may allow an unsandboxed run)"),
    (re.compile(r"\(xlaport verify\)"), "(verify_migration)"),
    (re.compile(r"\(e\.g\. --loss-pattern '([^']*)'\)"), r"(e.g. `\1`)"),
    (re.compile(r"\(--max-steps\)"), "(max_steps)"),
]


def api_wording(text: str) -> str:
    """`text` with command-line options replaced by the API parameters that do the same."""
    if "-" not in text and "xlaport verify" not in text:
        return text
    for pattern, replacement in _API_TERMS:
        text = pattern.sub(replacement, text)
    return text


def in_api_wording(value: T) -> T:
    """Every string of a result (a pydantic model, a dict, a list) in the API's wording; the same type back."""
    if isinstance(value, BaseModel):
        return type(value).model_validate(in_api_wording(value.model_dump()))
    if isinstance(value, str):
        return api_wording(value)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {k: v if k in _VERBATIM else in_api_wording(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list):
        return [in_api_wording(v) for v in value]  # type: ignore[return-value]
    return value
