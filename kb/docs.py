"""Entry documentation: dict form (JSON, retrieval), a Ruff-style Markdown page, and HTML pages (one per rule and an
index: `xlaport kb docs --out DIR`, linked from SARIF's helpUri and the migration report)."""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import tempfile
from pathlib import Path

from xlaport.files import atomic_write
from xlaport.htmlpage import esc, markdown, page
from xlaport.paths import cache_root

from .rule import CATEGORY_NAMES, Rule, severity_of

KB_FOLDER = Path(__file__).resolve().parent

FIX_SAFETY = {
    "safe": "Safe: keeps the program's meaning; applied by `xlaport fix` by default.",
    "unsafe": "Unsafe: may change behaviour; applied only with `--unsafe-fixes`. Review the diff.",
    "manual": "Manual: no automatic fix; the message says what to do.",
}


def entry_dict(rule: type[Rule]) -> dict:
    return {
        "code": rule.code,
        "title": rule.title,
        "category": rule.category,
        "category_name": CATEGORY_NAMES[rule.category],
        "fix": rule.fix,
        "autofix": rule.autofix,
        "detects": rule.detects,
        "why": rule.why,
        "before": rule.before,
        "after": rule.after,
        "symptoms": list(rule.symptoms),
        "references": list(rule.references),
    }


def source_of(rule: type[Rule]) -> str:
    """Where the rule is defined, as its repository path and line: `kb/rules/c4_barriers.py:40 (MissingStepBarrier)`.
    Its docstring there says what the short `detects` leaves out."""
    path = Path(inspect.getsourcefile(rule) or "").resolve()
    shown = f"kb/{path.relative_to(KB_FOLDER).as_posix()}" if path.is_relative_to(KB_FOLDER) else str(path)
    return f"{shown}:{inspect.getsourcelines(rule)[1]} ({rule.__name__})"


def render_markdown(rule: type[Rule]) -> str:
    parts = [
        f"# {rule.code}: {rule.title}",
        f"Category: {rule.category} ({CATEGORY_NAMES[rule.category]})",
        f"Source: {source_of(rule)}",
        "## What it detects",
        rule.detects,
        "## Why it matters on TPU",
        rule.why,
    ]
    if rule.symptoms:
        parts += ["## Symptoms", "\n".join(f"- `{s}`" for s in rule.symptoms)]
    parts += ["## Example", "```python", rule.before.rstrip(), "```"]
    if rule.after:
        parts += ["Use instead:", "```python", rule.after.rstrip(), "```"]
    parts += ["## Fix safety", FIX_SAFETY[rule.fix]]
    if rule.references:
        parts += ["## References", "\n".join(f"- {r}" for r in rule.references)]
    return "\n\n".join(parts)


# --- HTML pages (`xlaport kb docs --out DIR`; the migration report links to them) -------------------------------

INDEX_NAME = "index.html"


def page_name(code: str) -> str:
    """The file name of a rule's page; SARIF's helpUri and the migration report use the same name."""
    return f"{code}.html"


def render_html(rule: type[Rule]) -> str:
    """A rule's page: what it detects, why, before/after, fix safety, severity, symptoms, references."""
    body = [f'<p><a href="{INDEX_NAME}">All rules</a></p>', f"<h1>{esc(rule.code)}: {markdown(rule.title)}</h1>"]
    return page(f"{rule.code}: {rule.title}", body + _sections(rule, "h2"))


def render_rules_page(rules: list[type[Rule]], title: str = "xlaport rules") -> str:
    """Several rules on one page, each under an anchor named by its code (`page.html#XLA201`): the page a migration
    report writes beside itself for the rules it names."""
    body = [f"<h1>{esc(title)}</h1>", "<ul>"]
    body += [f'<li><a href="#{r.code}">{esc(r.code)}</a>: {markdown(r.title)}</li>' for r in rules]
    body.append("</ul>")
    for rule in rules:
        body.append(f'<h2 id="{rule.code}">{esc(rule.code)}: {markdown(rule.title)}</h2>')
        body += _sections(rule, "h3")
    return page(title, body)


def _sections(rule: type[Rule], heading: str) -> list[str]:
    """The body of a rule's documentation, its headings at `heading` (h2, h3)."""
    level = severity_of(rule)

    def h(text: str) -> str:
        return f"<{heading}>{text}</{heading}>"

    parts = [
        f"<p>Category {esc(rule.category)} ({esc(CATEGORY_NAMES[rule.category])}) · "
        f'severity <span class="{level}">{level}</span> · fix {esc(rule.fix)}'
        f"{' (automatic)' if rule.autofix else ''}</p>",
        h("What it detects"),
        f"<p>{markdown(rule.detects)}</p>",
        h("Why it matters on TPU"),
        f"<p>{markdown(rule.why)}</p>",
    ]
    if rule.symptoms:
        parts += [h("Symptoms"), "<ul>", *(f"<li><code>{esc(s)}</code></li>" for s in rule.symptoms), "</ul>"]
    parts += [h("Example"), f"<pre><code>{esc(rule.before.rstrip())}</code></pre>"]
    if rule.after:
        parts += ["<p>Use instead:</p>", f"<pre><code>{esc(rule.after.rstrip())}</code></pre>"]
    parts += [h("Fix safety"), f"<p>{markdown(FIX_SAFETY[rule.fix])}</p>"]
    if rule.references:
        parts += [h("References"), "<ul>", *(f"<li>{markdown(r)}</li>" for r in rule.references), "</ul>"]
    return parts


def render_index(rules: list[type[Rule]]) -> str:
    """The list of rules by category, each linking to its page."""
    parts = ["<h1>xlaport rules</h1>"]
    for category, name in CATEGORY_NAMES.items():
        chosen = [r for r in rules if r.category == category]
        if not chosen:
            continue
        parts += [f"<h2>{esc(category)}: {esc(name)}</h2>", "<table>"]
        parts.append("<tr><th>Code</th><th>Title</th><th>Severity</th><th>Fix</th></tr>")
        for r in chosen:
            level = severity_of(r)
            parts.append(
                f'<tr><td><a href="{page_name(r.code)}">{esc(r.code)}</a></td><td>{markdown(r.title)}</td>'
                f'<td class="{level}">{level}</td><td>{esc(r.fix)}</td></tr>'
            )
        parts.append("</table>")
    return page("xlaport rules", parts)


def _pages(rules: list[type[Rule]], index: bool = True) -> dict[str, str]:
    """File name -> HTML of each rule's page (and the index)."""
    pages = {page_name(r.code): render_html(r) for r in rules}
    if index:
        pages[INDEX_NAME] = render_index(rules)
    return pages


def write_docs(directory: Path, rules: list[type[Rule]], index: bool = True, mode: int | None = None) -> list[Path]:
    """Writes one page per rule of `rules` (and the index) into `directory`; returns the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pages = _pages(rules, index)
    written = []
    for name, text in pages.items():
        path = directory / name
        atomic_write(path, text, mode=mode)
        written.append(path)
    return written


LOCAL_DOCS_FOLDER = "rule-docs"  # under the cache root: the pages a SARIF log's helpUri opens where no site is set


def local_docs(rules: list[type[Rule]]) -> Path | None:
    """The folder that holds the pages of `rules` and their index, written once into the cache under a hash of
    their text (a changed rule gets a new folder, never a stale page); None when the cache cannot be written.
    Rendering the kb's ~130 pages takes ~50 ms; writing them happens once per kb version."""
    pages = _pages(rules)
    digest = hashlib.sha256("\0".join(f"{name}\0{text}" for name, text in sorted(pages.items())).encode())
    folder = cache_root() / LOCAL_DOCS_FOLDER / digest.hexdigest()[:16]
    if (folder / INDEX_NAME).is_file():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".pages-", dir=folder.parent))
        try:
            for name, text in pages.items():
                (scratch / name).write_text(text, encoding="utf-8")
            os.rename(scratch, folder)  # whole or not at all: a reader never sees half of the pages
        except OSError:
            if not (folder / INDEX_NAME).is_file():  # not another process that got there first
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    except OSError:
        return None
    return folder
