"""Findings as text, JSON and SARIF 2.1.0.

JSON is a versioned object: `{"schema_version": 2, "tool": ..., "findings": [...], "errors": [...]}`; each finding
has its start and end (`line`/`column`, `end_line`/`end_column`: lines and columns from 1, the end exclusive) and,
when it has an automatic fix, `edits`: that fix alone as text replacements. Version 1 was the bare array that is now
`findings`.

SARIF follows the OASIS 2.1.0 schema (tests/fixtures/sarif/ checks it) and what GitHub code scanning
reads: each rule with its descriptions, help text and a help URI (its page from `xlaport kb docs`: where
XLAPORT_DOCS_URL says they are published, else the copy written into the cache, so the link opens on the machine
that wrote the log; xlaport has no public site to point at), levels by
severity (kb/rule.py `severity_of`), end positions, fixes as replacements, stable partial fingerprints (ours, and
GitHub's `primaryLocationLineHash` computed as its upload would), and the files that could not be read or parsed as
tool execution notifications.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import PurePosixPath
from urllib.parse import quote

from xlaport import __version__
from xlaport.targets import TARGETS

from .docs import FIX_SAFETY, local_docs, page_name, render_markdown
from .finding import Edit, Finding
from .registry import all_rules, get_rule
from .rule import CATEGORY_NAMES, Rule, severity_of

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
JSON_SCHEMA_VERSION = 2
# Where a team publishes the pages of `xlaport kb docs`: SARIF's helpUri is that URL + "XLA201.html". Unset, the
# helpUri is the page in the copy kb/docs.py writes into the cache (a file: URI).
DOCS_URL_ENV = "XLAPORT_DOCS_URL"
SRCROOT = "%SRCROOT%"  # the base of relative artifact URIs: the folder lint ran in
FINGERPRINT_KEY = "xlaportLineHash/v1"
# GitHub's own fingerprint, as the CodeQL action's upload computes it when a log has none (src/fingerprints.ts):
# a rolling hash (base 37, mod 2**64) of the first 100 characters from the line's start, spaces and tabs left out,
# line ends read as "\n", then a marker for the end of the file and zeros; in hex, with ":N" for the N-th line of
# the file with that hash. A log that carries a different value gets a warning on upload.
LINE_HASH_KEY = "primaryLocationLineHash"
_HASH_BLOCK = 100
_HASH_BASE = 37
_HASH_MASK = (1 << 64) - 1
_HASH_BASE_TO_BLOCK = pow(_HASH_BASE, _HASH_BLOCK, 1 << 64)
_END_OF_FILE = 0xFFFF


def as_text(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        marker = {"safe": "[*]", "unsafe": "[~]", "manual": "[ ]"}[f.fix] if f.fixable or f.fix == "manual" else "[ ]"
        lines.append(f"{f.path}:{f.line}:{f.column}: {f.code} {marker} {f.message}")
    return "\n".join(lines)


def as_json(findings: list[Finding], unanalysed: list[tuple[str, str]] | None = None) -> str:
    """The versioned JSON object; `unanalysed`: (path, reason) of each file that could not be read or parsed."""
    log = {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": {"name": "xlaport", "version": __version__},
        "findings": [{**f.to_dict(), "edits": [e.to_dict() for e in f.edits]} for f in findings],
        "errors": [{"path": path, "message": reason} for path, reason in unanalysed or []],
    }
    return json.dumps(log, indent=2)


def docs_url(rules: list[type[Rule]]) -> str | None:
    """The base URL of the pages of `rules` (ends with a slash): XLAPORT_DOCS_URL, else the folder of their local
    copy (kb/docs.py `local_docs`); None when neither exists (the log then has no helpUri: the help text and
    Markdown say the same)."""
    base = os.environ.get(DOCS_URL_ENV)
    if not base:
        folder = local_docs(rules)
        base = folder.as_uri() if folder else None
    return None if base is None else base if base.endswith("/") else base + "/"


def sarif_uri(path: str) -> str:
    """A file's path as a SARIF artifact URI: percent-encoded (a space, `#` or `%` in a name is not a URI
    character); an absolute path as a file:// URI, a relative one as a relative reference."""
    posix = PurePosixPath(path)
    return posix.as_uri() if posix.is_absolute() else quote(posix.as_posix())


def _artifact(path: str) -> dict:
    """An artifactLocation: relative paths are resolved against %SRCROOT% (the run's working folder)."""
    uri = sarif_uri(path)
    return {"uri": uri} if PurePosixPath(path).is_absolute() else {"uri": uri, "uriBaseId": SRCROOT}


def _rule(rule: type[Rule], docs: str | None) -> dict:
    level = severity_of(rule)
    described = {
        "id": rule.code,
        "name": rule.__name__,
        "shortDescription": {"text": rule.title},
        "fullDescription": {"text": rule.detects},
        "help": {"text": f"{rule.why}\n\n{FIX_SAFETY[rule.fix]}", "markdown": render_markdown(rule)},
        "helpUri": f"{docs}{page_name(rule.code)}" if docs else None,
        "defaultConfiguration": {"level": level},
        "properties": {
            "category": rule.category,
            "fix": rule.fix,
            "tags": [rule.category, CATEGORY_NAMES[rule.category], f"fix:{rule.fix}"],
            "precision": "high" if rule.fix == "safe" else "medium",
        },
    }
    return {key: value for key, value in described.items() if value is not None}


def _region(line: int, column: int, end_line: int | None = None, end_column: int | None = None) -> dict:
    region = {"startLine": line, "startColumn": column}
    if end_line is not None and end_column is not None:
        region |= {"endLine": end_line, "endColumn": end_column}
    return region


def _replacement(edit: Edit) -> dict:
    return {
        "deletedRegion": _region(edit.line, edit.column, edit.end_line, edit.end_column),
        "insertedContent": {"text": edit.content},
    }


def _fingerprints(findings: list[Finding], sources: dict[str, str]) -> list[str]:
    """Per finding, a hash of what it is about that survives edits elsewhere in the file: the rule, the path and
    the reported line's text (stripped), with the occurrence count of that same triple; the line number itself
    only when the file's text is not known."""
    seen: Counter[tuple[str, str, str]] = Counter()
    hashes = []
    for f in findings:
        lines = sources[f.path].splitlines() if f.path in sources else None
        text = lines[f.line - 1].strip() if lines and 0 < f.line <= len(lines) else f"line {f.line}"
        key = (f.code, f.path, text)
        seen[key] += 1
        digest = hashlib.sha256("\0".join([*key, str(seen[key])]).encode("utf-8", "surrogatepass")).hexdigest()
        hashes.append(digest[:32])
    return hashes


def line_hashes(text: str) -> dict[int, str]:
    """Line number (from 1) -> GitHub's `primaryLocationLineHash` of that line of `text`. The characters are
    UTF-16 code units, as JavaScript reads them."""
    data = text.encode("utf-16-le", "surrogatepass")
    units = [int.from_bytes(data[i : i + 2], "little") for i in range(0, len(data), 2)]
    window = [0] * _HASH_BLOCK  # the last 100 characters hashed, a ring
    starts = [0] * _HASH_BLOCK  # the line that starts at each of them (0: none)
    value, at = 0, 0
    seen: Counter[str] = Counter()
    hashes: dict[int, str] = {}

    def push(unit: int, starts_line: int) -> None:
        nonlocal value, at
        if starts[at]:  # the line that started 100 characters ago: its hash is the value now
            digest = format(value, "x")
            seen[digest] += 1
            hashes[starts[at]] = f"{digest}:{seen[digest]}"
        starts[at] = starts_line
        value = (value * _HASH_BASE + unit - _HASH_BASE_TO_BLOCK * window[at]) & _HASH_MASK
        window[at] = unit
        at = (at + 1) % _HASH_BLOCK

    line, at_line_start, after_cr = 0, True, False
    for unit in [*units, _END_OF_FILE]:
        if unit in (0x20, 0x09) or (after_cr and unit == 0x0A):  # spaces, tabs, the "\n" of a "\r\n"
            after_cr = False
            continue
        after_cr = unit == 0x0D
        unit = 0x0A if after_cr else unit
        line += at_line_start
        push(unit, line if at_line_start else 0)
        at_line_start = unit == 0x0A
    for _ in range(_HASH_BLOCK):  # zeros after the end, so that the last lines have 100 characters too
        push(0, 0)
    return hashes


def _line_hashes(findings: list[Finding], sources: dict[str, str]) -> list[str | None]:
    """Per finding, GitHub's hash of its line; None when the file's text is not known (GitHub's upload then
    computes it from the checkout)."""
    files: dict[str, dict[int, str]] = {}
    out = []
    for f in findings:
        if f.path not in sources:
            out.append(None)
            continue
        if f.path not in files:
            files[f.path] = line_hashes(sources[f.path])
        out.append(files[f.path].get(f.line))
    return out


def _result(f: Finding, fingerprint: str, line_hash: str | None, levels: dict[str, str]) -> dict:
    result = {
        "ruleId": f.code,
        "level": levels.get(f.code, "warning"),
        "message": {"text": f.message},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": _artifact(f.path),
                    "region": _region(f.line, f.column, f.end_line, f.end_column),
                }
            }
        ],
        "partialFingerprints": {FINGERPRINT_KEY: fingerprint} | ({LINE_HASH_KEY: line_hash} if line_hash else {}),
        "properties": {"category": f.category, "fix": f.fix, "fixable": f.fixable},
    }
    if f.edits:
        result["fixes"] = [
            {
                "description": {"text": f"{f.title} ({f.fix} fix)"},
                "artifactChanges": [
                    {"artifactLocation": _artifact(f.path), "replacements": [_replacement(e) for e in f.edits]}
                ],
            }
        ]
    return result


def as_sarif(
    findings: list[Finding],
    unanalysed: list[tuple[str, str]] | None = None,
    sources: dict[str, str] | None = None,
    working_folder: str | None = None,
) -> str:
    """The SARIF log of `findings`; `unanalysed`: (path, reason) of each file that could not be read or parsed,
    reported as tool execution notifications (an unparsable file is not a clean one); `sources`: path -> text of
    the files linted (for the fingerprints); `working_folder`: what relative paths are relative to (%SRCROOT%)."""
    rules = all_rules()
    known = {r.code for r in rules}
    # findings of another target's rules (--target torch_tpu) are described too
    rules += [get_rule(code) for code in sorted({f.code for f in findings} - known)]
    levels = {r.code: severity_of(r) for r in rules}
    docs = docs_url(sorted({r for target in TARGETS for r in all_rules(target)}, key=lambda r: r.code))
    notifications = [
        {
            "level": "error",
            "message": {"text": reason},
            "locations": [{"physicalLocation": {"artifactLocation": _artifact(path)}}],
            "descriptor": {"id": "unanalysed-file"},
        }
        for path, reason in unanalysed or []
    ]
    fingerprints = _fingerprints(findings, sources or {})
    line_hashes_of = _line_hashes(findings, sources or {})
    run: dict = {
        "tool": {
            "driver": {
                "name": "xlaport",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": [_rule(r, docs) for r in rules],
            }
        },
        "invocations": [{"executionSuccessful": not notifications, "toolExecutionNotifications": notifications}],
        "columnKind": "unicodeCodePoints",
        "results": [
            _result(f, h, line, levels) for f, h, line in zip(findings, fingerprints, line_hashes_of, strict=True)
        ],
    }
    if working_folder is not None:
        root = PurePosixPath(working_folder).as_uri().rstrip("/") + "/"
        run["originalUriBaseIds"] = {SRCROOT: {"uri": root}}
    log = {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(log, indent=2)
