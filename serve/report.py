"""The reports of a migration: JSON (everything), Markdown and a self-contained HTML page, plus verify's
HTML and JSON (rendered by xlaport.eval.verify.page) beside them. Both HTML pages are built with
xlaport/htmlpage.py, the one HTML renderer.

Both human forms show, per file, the diff, the findings left for a human with the kb entries retrieved
for them, and the validation evidence of the run. The HTML page has no external resources.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from xlaport.files import REPORT_MODE, atomic_write
from xlaport.htmlpage import bullets, diff_block, esc, page

from .results import MigrationResult

if TYPE_CHECKING:
    from xlaport.eval.verify.report import VerifyReport

JSON_NAME = "xlaport-report.json"
MARKDOWN_NAME = "xlaport-report.md"
HTML_NAME = "xlaport-report.html"
VERIFY_HTML_NAME = "xlaport-verify.html"
VERIFY_JSON_NAME = "xlaport-verify.json"


def write_reports(migration: MigrationResult, directory: Path, mode: int = REPORT_MODE) -> dict[str, str]:
    """Writes the three reports into `directory` with `mode` (`xlaport.files.quoting_mode` of the sources they
    quote); returns {"json"|"markdown"|"html": path}."""
    paths = {"json": directory / JSON_NAME, "markdown": directory / MARKDOWN_NAME, "html": directory / HTML_NAME}
    atomic_write(paths["json"], as_json(migration), mode=mode)
    atomic_write(paths["markdown"], as_markdown(migration), mode=mode)
    atomic_write(paths["html"], as_html(migration), mode=mode)
    return {kind: str(path) for kind, path in paths.items()}


def write_verify_reports(report: VerifyReport, directory: Path, mode: int = REPORT_MODE) -> dict[str, str]:
    """Writes verify's HTML page and JSON into `directory` with `mode`; returns {"html"|"json": path}."""
    # matplotlib draws its plots: imported only when there is a verify report (~2 s and ~40 MB otherwise)
    from xlaport.eval.verify.page import write_report as write_verify_report

    paths = {"html": directory / VERIFY_HTML_NAME, "json": directory / VERIFY_JSON_NAME}
    write_verify_report(report, html_path=paths["html"], json_path=paths["json"], mode=mode)
    return {kind: str(path) for kind, path in paths.items()}


def as_json(migration: MigrationResult) -> str:
    return migration.model_dump_json(indent=2) + "\n"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{code}×{n}" for code, n in counts.items()) or "none"


def _headline(migration: MigrationResult) -> list[tuple[str, str]]:
    v = migration.validation
    verdict = v.status + (f" (level {v.level})" if v.level else "") + (f": {v.reason}" if v.reason else "")
    target = migration.dst or f"{migration.src} (in place{'' if migration.written else ', not written'})"
    return [
        ("Source", migration.src),
        ("Migrated copy", target),
        (
            "Python files",
            f"{migration.python_files} ({migration.files_changed} changed, {len(migration.errors)} not migrated)",
        ),
        ("Other files copied", str(migration.other_files_copied)),
        ("Fixes applied", _counts(migration.fixes_applied)),
        ("Left for a human", _counts(migration.findings_left)),
        ("Validation", verdict),
        *_verify_line(migration),
        ("Wall time", f"{migration.wall_s:.1f} s"),
    ]


def _verify_line(migration: MigrationResult) -> list[tuple[str, str]]:
    v = migration.verification
    if v is None:
        return []
    where = f" (see {Path(v.reports['html']).name})" if v.reports.get("html") else ""
    return [("Verify", f"{v.status}, level {v.level}{where}")]


def _performance(check) -> list[str]:
    """The execution check's time split and performance findings (they never change its level)."""
    if check.name != "xla_check" or not check.report:
        return []
    from xlaport.eval.check import performance_lines  # evaluation code: only when the check ran

    return performance_lines(check.report)


def _state(passed: bool | None) -> str:
    return {True: "passed", False: "FAILED", None: "did not run"}[passed]


def as_markdown(migration: MigrationResult) -> str:
    lines = ["# xlaport migration report", ""]
    lines += [f"- **{name}:** {value}" for name, value in _headline(migration)]
    lines += [f"- {note}" for note in migration.notes]
    v = migration.validation
    if v.checks:
        lines += ["", "## Validation evidence", "", f"Command: `{v.command}`", ""]
        for check in v.checks:
            level = f", level {check.level}" if check.level else ""
            details = check.reasons + _performance(check)
            lines.append(f"- **{check.name}**: {_state(check.passed)}{level}" + "".join(f"\n  - {r}" for r in details))
    if migration.errors:
        lines += ["", "## Files not migrated (copied unchanged)", ""]
        lines += [f"- {error}" for error in migration.errors]
    for outcome in migration.files:
        if outcome.status != "changed" and not outcome.manual:
            continue
        lines += ["", f"## `{outcome.path}`", ""]
        if outcome.codes_applied:
            lines.append(f"Fixes applied: {', '.join(outcome.codes_applied)}")
        lines += [f"Note: {note}" for note in outcome.notes]
        if outcome.diff:
            lines += ["", "```diff", outcome.diff.rstrip("\n"), "```"]
        if outcome.manual:
            lines += ["", "Left for a human:", ""]
            for item in outcome.manual:
                f = item.finding
                lines.append(f"- line {f.line} ({item.function}): **{f.code}** {f.message}")
                lines += [f"  - related fix {h.code} ({h.score:.2f}): {h.title}" for h in item.retrieved]
    return "\n".join(lines) + "\n"


def as_html(migration: MigrationResult) -> str:
    v = migration.validation
    parts = ["<h1>xlaport migration report</h1>", '<table class="summary">']
    for name, value in _headline(migration):
        css = f' class="{v.status}"' if name == "Validation" else ""
        parts.append(f"<tr><td><b>{esc(name)}</b></td><td{css}>{esc(value)}</td></tr>")
    parts.append("</table>")
    parts += [f"<p>{esc(note)}</p>" for note in migration.notes]
    if v.checks:
        parts += ["<h2>Validation evidence</h2>", f"<p>Command: <code>{esc(v.command)}</code></p>", "<ul>"]
        for check in v.checks:
            level = f", level {esc(check.level)}" if check.level else ""
            details = bullets(check.reasons + _performance(check))
            parts.append(f"<li><b>{esc(check.name)}</b>: {_state(check.passed)}{level}{details}</li>")
        parts.append("</ul>")
    if migration.errors:
        parts += ["<h2>Files not migrated (copied unchanged)</h2>", bullets(migration.errors)]
    for outcome in migration.files:
        if outcome.status != "changed" and not outcome.manual:
            continue
        parts.append(f"<h2><code>{esc(outcome.path)}</code></h2>")
        if outcome.codes_applied:
            parts.append(f"<p>Fixes applied: {esc(', '.join(outcome.codes_applied))}</p>")
        parts += [f"<p>Note: {esc(note)}</p>" for note in outcome.notes]
        if outcome.diff:
            parts.append(diff_block(outcome.diff))
        if outcome.manual:
            parts += ["<h3>Left for a human</h3>", "<ul>"]
            for item in outcome.manual:
                f = item.finding
                hits = "".join(
                    f"<li>related fix <b>{esc(h.code)}</b> ({h.score:.2f}): {esc(h.title)}</li>" for h in item.retrieved
                )
                parts.append(
                    f"<li>line {f.line} (<code>{esc(item.function)}</code>): <b>{esc(f.code)}</b> {esc(f.message)}"
                    f"<ul>{hits}</ul></li>"
                )
            parts.append("</ul>")
    return page("xlaport migration report", parts)
