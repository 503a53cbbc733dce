"""The one HTML renderer behind xlaport's reports (the migration report in serve/report.py and verify's page in
eval/verify/page.py): a self-contained page (inline style, no external resources) and the pieces both build
their bodies from. Core, so that eval and serve can both use it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em} td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
table.summary td{border:none;padding:.2em 1em .2em 0;vertical-align:top}
code,pre{background:#f6f6f6;padding:.1em .3em;border-radius:3px} pre{padding:.6em;overflow-x:auto;font-size:.85em}
.add{color:#116329;background:#dafbe1}.del{color:#82071e;background:#ffebe9}.hunk{color:#0550ae}
.validated{color:#116329}.rejected{color:#82071e}.unvalidated{color:#9a6700}
.badge{display:inline-block;padding:.2em .7em;border-radius:.3em;color:#fff;font-weight:600}
.plots{display:grid;grid-template-columns:1fr 1fr;gap:1em} .plots img{width:100%;border:1px solid #eee}
li{margin:.2em 0} li.fail{color:#b71c1c} li.undecided{color:#e65100} li.good{color:#1b5e20}
.count{color:#555;font-size:.85em} .error{color:#b71c1c} .warning{color:#9a6700} .note{color:#555}
"""


def esc(value: object) -> str:
    """`value` as text safe inside HTML."""
    return html.escape(str(value))


_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_LINK = re.compile(r"\[([^\]\n]+)\]\(([^()\s]+)\)")


def markdown(text: str) -> str:
    """Inline Markdown as HTML: `code`, **bold** and [text](url) links (http, https or a relative address; any other
    scheme, `javascript:` included, stays text). Everything else is escaped, so no markup of the text gets through."""
    out, last = [], 0
    for match in _CODE_SPAN.finditer(text):
        out.append(_inline(text[last : match.start()]))
        out.append(f"<code>{esc(match.group(2).strip() or match.group(2))}</code>")
        last = match.end()
    out.append(_inline(text[last:]))
    return "".join(out)


def _inline(text: str) -> str:
    """Bold and links of text without code spans, escaped first: the patterns only see escaped text."""
    escaped = _BOLD.sub(r"<b>\1</b>", esc(text))
    return _LINK.sub(_link, escaped)


def _link(match: re.Match) -> str:
    label, address = match.group(1), match.group(2)
    if urlsplit(html.unescape(address)).scheme not in ("", "http", "https"):
        return match.group(0)
    return f'<a href="{address}">{label}</a>'


def fmt(value: object) -> str:
    """A table cell's text: floats to four significant digits, a missing value as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def row(cells: Iterable[object], header: bool = False) -> str:
    """One table row of escaped, formatted cells."""
    tag = "th" if header else "td"
    return "<tr>" + "".join(f"<{tag}>{esc(fmt(cell))}</{tag}>" for cell in cells) + "</tr>"


def bullets(items: Iterable[str], css: str = "") -> str:
    """An unordered list of escaped items."""
    attr = f' class="{css}"' if css else ""
    return f"<ul{attr}>" + "".join(f"<li>{esc(item)}</li>" for item in items) + "</ul>"


def diff_block(diff: str) -> str:
    """A unified diff with added, removed and hunk lines coloured."""
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            css = ""
        elif line.startswith("+"):
            css = "add"
        elif line.startswith("-"):
            css = "del"
        else:
            css = "hunk" if line.startswith("@@") else ""
        out.append(f'<span class="{css}">{esc(line)}</span>' if css else esc(line))
    return '<pre class="diff">' + "\n".join(out) + "</pre>"


def page(title: str, body: Iterable[str]) -> str:
    """The whole page: `body` is already HTML; `title` is text."""
    head = f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
    return "\n".join([head, f"<style>{STYLE}</style></head><body>", *body, "</body></html>"]) + "\n"
