"""The reports of a migration: JSON (everything), Markdown and a self-contained HTML page, plus verify's
HTML and JSON (rendered by xlaport.eval.verify.page) beside them. Both HTML pages are built with
xlaport/htmlpage.py, the one HTML renderer.

Both human forms show, per file, the diff, the findings left for a human with the kb entries retrieved
for them, and the validation evidence of the run. The HTML page has no external resources.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from xlaport.kb import get_rule
from xlaport.kb.docs import render_rules_page

from xlaport.files import REPORT_MODE, atomic_write
from xlaport.htmlpage import diff_block, esc, markdown, page

from .results import FileOutcome, ManualItem, MigrationResult

if TYPE_CHECKING:
    from xlaport.eval.verify.report import VerifyReport

JSON_NAME = "xlaport-report.json"
MARKDOWN_NAME = "xlaport-report.md"
HTML_NAME = "xlaport-report.html"
VERIFY_HTML_NAME = "xlaport-verify.html"
VERIFY_JSON_NAME = "xlaport-verify.json"
RULES_HTML_NAME = "xlaport-rules.html"  # the docs of the rules the report names, linked as RULES_HTML_NAME#CODE


def write_reports(migration: MigrationResult, directory: Path, mode: int = REPORT_MODE) -> dict[str, str]:
    """Writes the three reports into `directory` with `mode` (`xlaport.files.quoting_mode` of the sources they
    quote), and the page of the rules they name; returns {"json"|"markdown"|"html"|"rules": path}."""
    paths = {"json": directory / JSON_NAME, "markdown": directory / MARKDOWN_NAME, "html": directory / HTML_NAME}
    codes = _codes_named(migration)
    if codes:
        paths["rules"] = directory / RULES_HTML_NAME
        rules = [get_rule(code) for code in codes]
        atomic_write(paths["rules"], render_rules_page(rules, "xlaport rules named in the migration report"), mode=mode)
    atomic_write(paths["json"], as_json(migration), mode=mode)
    atomic_write(paths["markdown"], as_markdown(migration), mode=mode)
    atomic_write(paths["html"], as_html(migration), mode=mode)
    return {kind: str(path) for kind, path in paths.items()}


def _codes_named(migration: MigrationResult) -> list[str]:
    """The kb codes the report names: fixes applied, findings left, related fixes retrieved."""
    codes = set(migration.fixes_applied) | set(migration.findings_left)
    codes |= {hit.code for o in migration.files for item in o.manual for hit in item.retrieved}
    known = []
    for code in sorted(codes):
        try:
            get_rule(code)
        except KeyError:  # a code no rule of this version has (a report of another version's run): no link
            continue
        known.append(code)
    return known


def write_verify_reports(report: VerifyReport, directory: Path, mode: int = REPORT_MODE) -> dict[str, str]:
    """Writes verify's HTML page and JSON into `directory` with `mode`; returns {"html"|"json": path}."""
    # matplotlib draws its plots: imported only when there is a verify report (~2 s and ~40 MB otherwise)
    from xlaport.eval.verify.page import write_report as write_verify_report

    paths = {"html": directory / VERIFY_HTML_NAME, "json": directory / VERIFY_JSON_NAME}
    write_verify_report(report, html_path=paths["html"], json_path=paths["json"], mode=mode)
    return {kind: str(path) for kind, path in paths.items()}


def as_json(migration: MigrationResult) -> str:
    return migration.model_dump_json(indent=2) + "\n"


def _by_count(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Codes with their counts, the most frequent first, then by code."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{code}×{n}" if n > 1 else code for code, n in _by_count(counts)) or "none"


def _rule_link(code: str, linked: set[str]) -> str:
    """A code as a link to its section of the rules page beside the report (only codes that page has)."""
    return f'<a href="{RULES_HTML_NAME}#{esc(code)}">{esc(code)}</a>' if code in linked else esc(code)


def _linked_counts(counts: dict[str, int], linked: set[str]) -> str:
    shown = [_rule_link(code, linked) + (f"×{n}" if n > 1 else "") for code, n in _by_count(counts)]
    return ", ".join(shown) or "none"


def _folded(items: list[str]) -> list[tuple[str, int]]:
    """Identical items once each, in first-seen order, with how many times each came."""
    return list(Counter(items).items())


def _times(n: int) -> str:
    return f' <span class="count">×{n}</span>' if n > 1 else ""


def _time_table(migration: MigrationResult) -> list[str]:
    """Where the migration's time went: each phase (and the steps inside one) with its seconds and share."""
    shown = [t for t in migration.phases if t.name != "reports"]  # still running while this page is written
    if not shown:
        return []
    total = migration.wall_s or sum(t.seconds for t in shown if t.phase is None) or 1.0
    rows = ["<h2>Where the time went</h2>", "<table>", "<tr><th>Phase</th><th>Seconds</th><th>Share</th></tr>"]
    for t in shown:
        name = f"&nbsp;&nbsp;&nbsp;&nbsp;{esc(t.name)}" if t.phase else f"<b>{esc(t.name)}</b>"
        rows.append(f"<tr><td>{name}</td><td>{t.seconds:.2f}</td><td>{100 * t.seconds / total:.0f}%</td></tr>")
    rest = total - sum(t.seconds for t in shown if t.phase is None)
    if rest > 0.05:
        rows.append(
            f"<tr><td>other (planning, reading the tree)</td><td>{rest:.2f}</td><td>{100 * rest / total:.0f}%</td></tr>"
        )
    rows.append(f"<tr><td><b>total</b></td><td>{total:.2f}</td><td>100%</td></tr></table>")
    return rows


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
    phases = [t for t in migration.phases if t.phase is None and t.name != "reports"]
    if phases:
        lines.append("- **Time:** " + ", ".join(f"{t.name} {t.seconds:.1f} s" for t in phases))
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
            lines.append(f"Fixes applied: {_counts(Counter(outcome.codes_applied))}")
        lines += [f"Note: {note}" for note in outcome.notes]
        if outcome.diff:
            lines += ["", "```diff", outcome.diff.rstrip("\n"), "```"]
        if outcome.manual:
            lines += ["", "Left for a human:", ""]
            for item, where in _manual_groups(outcome):
                f = item.finding
                count = f" ×{len(where)}" if len(where) > 1 else ""
                lines.append(f"- {_lines(where)} ({item.function}): **{f.code}** {f.message}{count}")
                lines += [f"  - related fix {h.code} ({h.score:.2f}): {h.title}" for h in item.retrieved]
    return "\n".join(lines) + "\n"


def _html_list(items: list[str], css: str = "") -> str:
    """Items as Markdown, identical ones folded with their count."""
    attr = f' class="{css}"' if css else ""
    return f"<ul{attr}>" + "".join(f"<li>{markdown(item)}{_times(n)}</li>" for item, n in _folded(items)) + "</ul>"


def _manual_groups(outcome: FileOutcome) -> list[tuple[ManualItem, list[int]]]:
    """A file's findings left for a human, the same finding (code, message, function, related fixes) on several
    lines once, with its lines."""
    groups: dict[tuple, tuple[ManualItem, list[int]]] = {}
    for item in outcome.manual:
        f = item.finding
        key = (f.code, f.message, item.function, tuple((h.code, h.title) for h in item.retrieved))
        groups.setdefault(key, (item, []))[1].append(f.line)
    return list(groups.values())


def _lines(numbers: list[int]) -> str:
    return f"line{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def _manual_html(outcome: FileOutcome, linked: set[str]) -> list[str]:
    """A file's findings left for a human, repeats folded (`_manual_groups`) with their lines and count."""
    parts = ["<h3>Left for a human</h3>", "<ul>"]
    for item, lines in _manual_groups(outcome):
        f = item.finding
        where = _lines(lines)
        hits = "".join(
            f"<li>related fix {_rule_link(h.code, linked)} ({h.score:.2f}): {markdown(h.title)}</li>"
            for h in item.retrieved
        )
        parts.append(
            f"<li>{where} (<code>{esc(item.function)}</code>): <b>{_rule_link(f.code, linked)}</b> "
            f"{markdown(f.message)}{_times(len(lines))}" + (f"<ul>{hits}</ul>" if hits else "") + "</li>"
        )
    parts.append("</ul>")
    return parts


def as_html(migration: MigrationResult) -> str:
    v = migration.validation
    linked = set(_codes_named(migration))
    links = {
        "Fixes applied": _linked_counts(migration.fixes_applied, linked),
        "Left for a human": _linked_counts(migration.findings_left, linked),
    }
    verify_page = (migration.verification.reports.get("html") if migration.verification else None) or ""
    parts = ["<h1>xlaport migration report</h1>", '<table class="summary">']
    for name, value in _headline(migration):
        css = f' class="{v.status}"' if name == "Validation" else ""
        shown = links.get(name) or markdown(value)
        if name == "Verify" and verify_page:
            shown = f'<a href="{esc(Path(verify_page).name)}">{esc(value.split(" (see ")[0])}</a>'
        parts.append(f"<tr><td><b>{esc(name)}</b></td><td{css}>{shown}</td></tr>")
    parts.append("</table>")
    parts += [f"<p>{markdown(note)}{_times(n)}</p>" for note, n in _folded(migration.notes)]
    if linked:
        parts.append(f'<p>The rules named here: <a href="{RULES_HTML_NAME}">{RULES_HTML_NAME}</a>.</p>')
    if v.checks:
        parts += ["<h2>Validation evidence</h2>", f"<p>Command: <code>{esc(v.command)}</code></p>", "<ul>"]
        for check in v.checks:
            level = f", level {esc(check.level)}" if check.level else ""
            details = _html_list(check.reasons + _performance(check))
            parts.append(f"<li><b>{esc(check.name)}</b>: {_state(check.passed)}{level}{details}</li>")
        parts.append("</ul>")
    if verify_page:
        parts += ["<h2>Verify</h2>", f'<p>The full assessment: <a href="{esc(Path(verify_page).name)}">'
                  f"{esc(Path(verify_page).name)}</a>.</p>"]  # fmt: skip
    parts += _time_table(migration)
    if migration.errors:
        parts += ["<h2>Files not migrated (copied unchanged)</h2>", _html_list(migration.errors)]
    for outcome in migration.files:
        if outcome.status != "changed" and not outcome.manual:
            continue
        parts.append(f"<h2><code>{esc(outcome.path)}</code></h2>")
        if outcome.codes_applied:
            applied = _linked_counts(Counter(outcome.codes_applied), linked)
            parts.append(f"<p>Fixes applied: {applied}</p>")
        parts += [f"<p>Note: {markdown(note)}{_times(n)}</p>" for note, n in _folded(outcome.notes)]
        if outcome.diff:
            parts.append(diff_block(outcome.diff))
        if outcome.manual:
            parts += _manual_html(outcome, linked)
    return page("xlaport migration report", parts)
