"""The precision benchmark's own logic: label matching, the summary, and the labels data file."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "precision.py"
_spec = importlib.util.spec_from_file_location("precision_bench", BENCH)
precision = importlib.util.module_from_spec(_spec)
sys.modules["precision_bench"] = precision  # dataclasses resolve their module by name
_spec.loader.exec_module(precision)

Label, Finding = precision.Label, precision.Finding


def label(line: int, anchor: str, code: str = "XLA401", truth: bool = True, path: str = "train.py") -> Label:
    return Label("o/r", "c" * 40, path, line, code, truth, "why", anchor, None if truth else "not-on-device")


def finding(line: int, anchor: str, code: str = "XLA401", path: str = "train.py") -> Finding:
    return Finding(path, line, code, "msg", anchor)


def test_exact_line_and_anchor():
    matches, new, left = precision.match([label(10, "a = x.item()")], [finding(10, "a = x.item()")])
    assert [m.how for m in matches] == ["line+anchor"] and not new and not left


def test_label_follows_its_line_when_code_above_moves():
    labels = [label(10, "a = x.item()"), label(20, "b = y.item()")]
    findings = [finding(23, "b = y.item()"), finding(13, "a = x.item()")]
    matches, new, left = precision.match(labels, findings)
    assert {(m.label.line, m.finding.line, m.how) for m in matches} == {(10, 13, "anchor"), (20, 23, "anchor")}
    assert not new and not left


def test_same_anchor_twice_pairs_nearest_lines():
    labels = [label(10, "loss.item()", truth=True), label(50, "loss.item()", truth=False)]
    matches, _, _ = precision.match(labels, [finding(52, "loss.item()"), finding(12, "loss.item()")])
    assert {(m.finding.line, m.label.label) for m in matches} == {(12, True), (52, False)}


def test_two_findings_on_one_line_use_two_labels():
    labels = [label(7, "f(a.item(), b.item())"), label(7, "f(a.item(), b.item())", truth=False)]
    findings = [finding(7, "f(a.item(), b.item())"), finding(7, "f(a.item(), b.item())")]
    matches, new, left = precision.match(labels, findings)
    assert len(matches) == 2 and not new and not left


def test_line_fallback_when_the_text_changed():
    matches, _, _ = precision.match([label(5, "x = t.item()")], [finding(5, "x = t.item()  # noted")])
    assert [m.how for m in matches] == ["line"]


def test_code_and_path_must_agree():
    labels = [label(5, "x = t.item()"), label(6, "y", path="other.py")]
    matches, new, left = precision.match(labels, [finding(5, "x = t.item()", code="XLA402"), finding(6, "y")])
    assert not matches and len(new) == 2 and len(left) == 2


def test_summary_counts_precision_new_lost_and_gone():
    result = precision.RepoResult("o/r", "c" * 40, "c" * 40, 0.0)
    t, f = label(1, "a"), label(2, "b", truth=False)
    result.matches = [precision.Match(t, finding(1, "a"), "line+anchor"), precision.Match(f, finding(2, "b"), "line")]
    result.unlabelled = [finding(3, "c", code="XLA999")]
    result.lost = [label(4, "d")]
    result.gone = [label(5, "e", truth=False)]
    summary = precision.summarize([result])
    assert (summary["tp"], summary["fp"], summary["precision"]) == (1, 1, 0.5)
    assert (summary["unlabelled"], summary["lost"], summary["gone"]) == (1, 1, 1)
    assert summary["recall_vs_labels"] == 0.5
    assert summary["fp_by_class"] == {"not-on-device": 1}
    assert summary["rules"]["XLA999"]["precision"] is None


def test_bad_label_line_is_an_error(tmp_path):
    bad = tmp_path / "labels.jsonl"
    bad.write_text('{"repo": "o/r"}\n')
    with pytest.raises(precision.BenchError, match="labels.jsonl:1"):
        precision.load_labels(bad)


def test_labels_file_is_complete_and_consistent():
    rows = [json.loads(line) for line in precision.DEFAULT_LABELS.read_text().splitlines() if line.strip()]
    labels = precision.load_labels(precision.DEFAULT_LABELS)
    assert len(labels) == len(rows) >= 200
    assert len({lab.repo for lab in labels}) >= 8
    for lab in labels:
        assert lab.anchor and lab.reason and lab.code.startswith("XLA") and len(lab.commit) == 40, lab
        assert (lab.fp_class is None) == lab.label, f"false labels (only) carry a class: {lab}"
    # one commit per repository
    commits = {(lab.repo, lab.commit) for lab in labels}
    assert len(commits) == len({lab.repo for lab in labels})
    # duplicates are allowed only as separate findings on one line (two `.item()` calls)
    counts = Counter((lab.repo, lab.path, lab.line, lab.code) for lab in labels)
    assert max(counts.values()) <= 2


def test_evaluate_repo_reads_anchors_and_keeps_notes_apart(tmp_path):
    """End to end through a stand-in CLI: line shift, a note, a new finding, a lost label."""
    tree = tmp_path / "o__r"
    tree.mkdir()
    (tree / "train.py").write_text("import torch\n\na = x.item()\nb = y.item()\nc = z.item()\n")
    reported = [
        {"path": "train.py", "line": 3, "code": "XLA401", "message": "m"},  # labelled at line 2: moved
        {"path": "train.py", "line": 4, "code": "XLA401", "message": "m", "severity": "note"},
        {"path": "train.py", "line": 5, "code": "XLA402", "message": "m"},  # no label
    ]
    fake = tmp_path / "fake_xlaport.py"
    lint_json = {"schema_version": 2, "findings": reported, "errors": []}  # lint's JSON object (schema 2)
    fake.write_text(f"import sys\nprint({json.dumps(lint_json)!r})\nsys.exit(1)\n")
    labels = [label(2, "a = x.item()"), label(4, "b = y.item()", truth=False), label(7, "gone = w.item()")]
    result = precision.evaluate_repo("o/r", labels, tree, [sys.executable, str(fake)])
    assert [(m.label.line, m.finding.line, m.how) for m in result.matches] == [(2, 3, "anchor")]
    assert [(m.label.line, m.label.label) for m in result.demoted] == [(4, False)]
    assert [f.code for f in result.unlabelled] == ["XLA402"] and result.notes == 1
    assert [lab.line for lab in result.lost] == [7] and [lab.line for lab in result.gone] == [4]


def test_lint_usage_error_is_a_bench_error(tmp_path):
    fake = tmp_path / "fake_xlaport.py"
    fake.write_text("import sys\nsys.exit(2)\n")
    with pytest.raises(precision.BenchError, match="exited 2"):
        precision.run_lint([sys.executable, str(fake)], ["."], tmp_path)
