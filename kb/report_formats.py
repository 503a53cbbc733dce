"""Findings as text, JSON and SARIF 2.1.0."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from urllib.parse import quote

from .finding import Finding
from .registry import all_rules

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def as_text(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        marker = {"safe": "[*]", "unsafe": "[~]", "manual": "[ ]"}[f.fix] if f.fixable or f.fix == "manual" else "[ ]"
        lines.append(f"{f.path}:{f.line}:{f.column}: {f.code} {marker} {f.message}")
    return "\n".join(lines)


def as_json(findings: list[Finding]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=2)


def sarif_uri(path: str) -> str:
    """A file's path as a SARIF artifact URI: percent-encoded (a space, `#` or `%` in a name is not a URI
    character); an absolute path as a file:// URI, a relative one as a relative reference."""
    posix = PurePosixPath(path)
    return posix.as_uri() if posix.is_absolute() else quote(posix.as_posix())


def as_sarif(findings: list[Finding], unanalysed: list[tuple[str, str]] | None = None) -> str:
    """The SARIF log of `findings`; `unanalysed`: (path, reason) of each file that could not be read or parsed,
    reported as tool execution notifications (an unparsable file is not a clean one)."""
    notifications = [
        {
            "level": "error",
            "message": {"text": reason},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": sarif_uri(path)}}}],
            "descriptor": {"id": "unanalysed-file"},
        }
        for path, reason in unanalysed or []
    ]
    rules = [
        {
            "id": r.code,
            "name": r.__name__,
            "shortDescription": {"text": r.title},
            "fullDescription": {"text": r.why},
            "properties": {"category": r.category, "fix": r.fix},
        }
        for r in all_rules()
    ]
    results = [
        {
            "ruleId": f.code,
            "level": "warning",
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": sarif_uri(f.path)},
                        "region": {"startLine": f.line, "startColumn": f.column},
                    }
                }
            ],
            "properties": {"category": f.category, "fix": f.fix},
        }
        for f in findings
    ]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "xlaport", "rules": rules}},
                "invocations": [
                    {"executionSuccessful": not notifications, "toolExecutionNotifications": notifications}
                ],
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2)
