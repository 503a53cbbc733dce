"""`xlaport kb docs --out DIR`: one HTML page per rule and an index, whose links all resolve, with the rule's Markdown
rendered and nothing of its text taken as markup; the inline Markdown renderer the pages and the report share."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner
from xlaport.kb import all_rules
from xlaport.kb.docs import page_name, render_html

from xlaport.cli import app
from xlaport.htmlpage import markdown


def test_kb_docs_writes_a_page_per_rule_and_an_index_whose_links_resolve(tmp_path: Path):
    out = tmp_path / "site" / "rules"
    result = CliRunner().invoke(app, ["kb", "docs", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rules = all_rules()
    assert sorted(p.name for p in out.iterdir()) == sorted([*(page_name(r.code) for r in rules), "index.html"])
    index = (out / "index.html").read_text()
    targets = re.findall(r'href="([^"]+)"', index)
    assert len(targets) == len(rules) and all((out / t).is_file() for t in targets)
    page = (out / "XLA201.html").read_text()
    for heading in ("What it detects", "Why it matters on TPU", "Example", "Use instead", "Fix safety"):
        assert heading in page
    assert "<code>.cuda()</code>" in page  # the title's backticks rendered
    assert 'href="index.html"' in page and "severity" in page


def test_a_page_escapes_the_rule_text(tmp_path: Path):
    rule = next(r for r in all_rules() if "<" in r.before or '"' in r.before)
    html = render_html(rule)
    code = html.split("<h2>Example</h2>", 1)[1]
    assert "&quot;" in code or "&lt;" in code


def test_kb_docs_refuses_a_file_as_the_folder(tmp_path: Path):
    (tmp_path / "f").write_text("")
    assert CliRunner().invoke(app, ["kb", "docs", "--out", str(tmp_path / "f")]).exit_code == 2


def test_markdown_renders_code_bold_and_safe_links_and_escapes_everything_else():
    assert markdown("use `x.to(dev)` **now**") == "use <code>x.to(dev)</code> <b>now</b>"
    assert markdown("see [XLA201](rules/XLA201.html)") == 'see <a href="rules/XLA201.html">XLA201</a>'
    assert markdown("[a](https://x.org/?a=1&b=2)") == '<a href="https://x.org/?a=1&amp;b=2">a</a>'
    assert markdown("<script>alert(1)</script>") == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert markdown("`<b>` and **<i>**") == "<code>&lt;b&gt;</code> and <b>&lt;i&gt;</b>"
    assert "<a" not in markdown("[x](javascript:alert(1))") and "<a" not in markdown("[x](data:text/html,hi)")
    assert markdown('[q](http://a"onclick="b)') == '<a href="http://a&quot;onclick=&quot;b">q</a>'
    assert markdown("a ** b ** c and `unclosed") == "a ** b ** c and `unclosed"
    assert markdown("`**not bold**`") == "<code>**not bold**</code>"
