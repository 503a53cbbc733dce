"""The one HTML renderer (xlaport/htmlpage.py) behind the migration report and verify's page."""

from xlaport.eval.verify.page import render_html
from xlaport.eval.verify.report import VerifyReport
from xlaport.serve.report import as_html, as_markdown
from xlaport.serve.results import CheckRun, FileOutcome, MigrationResult, Validation

from xlaport.htmlpage import diff_block, fmt, page, row


def test_page_is_self_contained_and_escapes_its_title():
    text = page("a <b> & c", ["<p>x</p>"])
    assert text.startswith("<!doctype html>") and "<title>a &lt;b&gt; &amp; c</title>" in text
    assert "<style>" in text and "src=" not in text and "href=" not in text and text.endswith("</body></html>\n")


def test_cells_are_formatted_and_escaped():
    assert row([None, 0.123456, "<x>"]) == "<tr><td>–</td><td>0.1235</td><td>&lt;x&gt;</td></tr>"
    assert row(["a"], header=True) == "<tr><th>a</th></tr>"
    assert fmt(3) == "3"


def test_diff_lines_are_coloured_but_file_headers_are_not():
    block = diff_block("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-old <\n+new\n same")
    assert '<span class="del">-old &lt;</span>' in block and '<span class="add">+new</span>' in block
    assert '<span class="hunk">@@ -1 +1 @@</span>' in block and '<pre class="diff">--- a/x.py\n+++ b/x.py\n' in block


def test_migration_report_uses_the_shared_page():
    migration = MigrationResult(
        run_id="r", src="src<1>", dst="dst", in_place=False, written=True, python_files=1, files_changed=1,
        other_files_copied=0, errors=["bad.py: syntax"], fixes_applied={"XLA101": 1}, findings_left={},
        files=[FileOutcome(path="train.py", status="changed", diff="+x = 1\n", codes_applied=["XLA101"])],
        validation=Validation(
            command="python train.py", status="rejected",
            checks=[CheckRun(name="xla_check", passed=False, level="L0", reasons=["crashed <oom>"])],
        ),
        report_dir="dst",
    )  # fmt: skip
    html_page, markdown = as_html(migration), as_markdown(migration)
    assert html_page.startswith("<!doctype html>") and "<title>xlaport migration report</title>" in html_page
    assert "src&lt;1&gt;" in html_page and "<li>crashed &lt;oom&gt;</li>" in html_page
    assert '<td class="rejected">rejected</td>' in html_page and '<span class="add">+x = 1</span>' in html_page
    assert "- **xla_check**: FAILED, level L0" in markdown and "<li>bad.py: syntax</li>" in html_page


def test_migration_report_lists_the_checks_performance_findings_and_time_split():
    finding = {
        "kind": "host_sync", "site": "train.py:9", "what": "`.item()` at train.py:9 waits <for> the device",
        "when": "every step", "every_step": True, "count": 8, "steps": list(range(8)), "cost_s": 0.05,
        "ms_per_step": 6.2, "share": 0.4, "fix": "read it in a step closure", "code": "XLA401",
    }  # fmt: skip
    split = {"scope": "after warm-up", "steps": 6, "wall_s": 0.09, "trace_s": 0.05, "compile_s": 0.0,
             "host_wait_s": 0.04, "execute_s": 0.002}  # fmt: skip
    migration = MigrationResult(
        run_id="r", src="src", dst="dst", in_place=False, written=True, python_files=1, files_changed=0,
        other_files_copied=0, errors=[], fixes_applied={}, findings_left={}, files=[],
        validation=Validation(
            command="python train.py", status="validated",
            checks=[CheckRun(name="xla_check", passed=True, level="L2", report={"performance": [finding],
                                                                                "time_split": [split]})],
        ),
        report_dir="dst",
    )  # fmt: skip
    html_page, markdown = as_html(migration), as_markdown(migration)
    verify_page = render_html(
        VerifyReport(
            "o", "m", ["python", "train.py"], "L3", "L3", "pass", [], [], check=migration.validation.checks[0].report
        )
    )
    assert "waits &lt;for&gt; the device. Fix (XLA401)" in verify_page
    line = "performance: host sync every step: `.item()` at train.py:9 waits <for> the device. Fix (XLA401): read"
    assert "- **xla_check**: passed, level L2" in markdown and f"  - {line}" in markdown
    assert "waits &lt;for&gt; the device. Fix (XLA401)" in html_page
    assert (
        "where the time goes (after warm-up, 6 step(s), 15.0 ms per step): tracing and dispatch 8.3 ms (56%)"
        in markdown
    )


def _report_with_repeats(tmp_path):
    from xlaport.kb import Finding
    from xlaport.kb.retrieval import FixHit
    from xlaport.serve.phases import PhaseTime
    from xlaport.serve.results import ManualItem, VerifyOutcome

    hit = FixHit(code="XLA404", title="`.cpu()` in the loop", category="C4", fix="manual", score=0.8, matched="x")
    manual = [
        ManualItem(
            finding=Finding("train.py", line, 5, "XLA401", "C4", "t", "`.item()` syncs **every** step", "manual"),
            function="train",
            retrieved=[hit],
        )
        for line in (12, 30, 41, 57)
    ]
    return MigrationResult(
        run_id="r", src="src", dst=str(tmp_path), in_place=False, written=True, python_files=1, files_changed=1,
        other_files_copied=0, errors=[], fixes_applied={"XLA202": 1, "XLA201": 3}, findings_left={"XLA401": 4},
        files=[FileOutcome(path="train.py", status="changed", diff="+x = 1\n", manual=manual,
                           codes_applied=["XLA202", "XLA201", "XLA201", "XLA201"])],
        validation=Validation(),
        verification=VerifyOutcome(command="python train.py", status="pass", level="L3", exit_code=0,
                                   reports={"html": str(tmp_path / "xlaport-verify.html")}),
        notes=["use `--related 3` <now>", "use `--related 3` <now>"],
        report_dir=str(tmp_path), wall_s=10.0,
        phases=[PhaseTime(name="rewrite", seconds=1.0), PhaseTime(name="verify", seconds=8.5),
                PhaseTime(name="the migrated run", seconds=3.0, phase="verify"),
                PhaseTime(name="the original's run", seconds=5.0, phase="verify")],
    )  # fmt: skip


def test_migration_report_folds_repeats_sorts_counts_renders_markdown_and_links(tmp_path):
    import re
    from pathlib import Path

    from xlaport.serve.report import write_reports

    paths = write_reports(_report_with_repeats(tmp_path), tmp_path)
    html_page = (tmp_path / "xlaport-report.html").read_text()
    # one finding on four lines is one item with its lines and count; its related fix is listed once
    assert html_page.count("syncs <b>every</b> step") == 1 and "lines 12, 30, 41, 57" in html_page
    assert '<span class="count">×4</span>' in html_page and html_page.count("related fix") == 1
    # codes sorted by count, linked to their section of the rules page written beside the report
    assert '<a href="xlaport-rules.html#XLA201">XLA201</a>×3, <a href="xlaport-rules.html#XLA202">XLA202</a>' in (
        html_page
    )
    rules_page = Path(paths["rules"]).read_text()
    for anchor in set(re.findall(r'href="xlaport-rules.html#(\w+)"', html_page)):
        assert f'id="{anchor}"' in rules_page
    assert {"XLA201", "XLA202", "XLA401", "XLA404"} <= set(re.findall(r'id="(XLA\d+)"', rules_page))
    # Markdown rendered, the rest escaped, a repeated note folded
    assert "use <code>--related 3</code> &lt;now&gt; <span" in html_page and html_page.count("--related 3") == 1
    assert 'href="xlaport-verify.html"' in html_page
    # where the time went, the steps inside verify, and what is not covered by a phase
    table = html_page.split("Where the time went", 1)[1]
    assert "<b>verify</b></td><td>8.50</td><td>85%" in table and "the original&#x27;s run" in table
    assert "other (planning, reading the tree)</td><td>0.50" in table
    markdown_text = (tmp_path / "xlaport-report.md").read_text()
    assert "Fixes applied: XLA201×3, XLA202" in markdown_text and "rewrite 1.0 s, verify 8.5 s" in markdown_text
    assert markdown_text.count("XLA401") == 2 and "- lines 12, 30, 41, 57 (train): **XLA401**" in markdown_text
