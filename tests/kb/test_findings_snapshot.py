"""Speed work must not cost findings: `lint_source` over a fixed sample of real and fixture files gives exactly the
findings recorded in tests/fixtures/findings_snapshot.json (path, line, column, code, fix, fixable, message).

The snapshot was written from main before the detection path was optimised (issue #12). A change that means to
alter findings regenerates it and shows the difference in review:

    .venv/bin/python tests/kb/test_findings_snapshot.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from xlaport.kb import lint_source

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "fixtures" / "findings_snapshot.json"
TORCH = Path(next(iter(importlib.util.find_spec("torch").submodule_search_locations)))
TORCH_VERSION = "2.9.0"  # the sample is torch's own source: another version has other files


def torch_sample() -> list[Path]:
    """perf.py's corpus (torch/nn, optim, distributed): every 10th file, and every file under 30 KB that mentions
    `cuda` (where findings are; most of torch's own files have none)."""
    files = [p for d in ("nn", "optim", "distributed") for p in sorted((TORCH / d).rglob("*.py"))]
    every_tenth = set(files[::10])
    return [p for p in files if p in every_tenth or p.stat().st_size < 30_000 and "cuda" in p.read_text()]


def repo_sample() -> list[Path]:
    """Our own inputs: the examples and every fixture program."""
    return sorted(ROOT.glob("examples/**/*.py")) + sorted((ROOT / "tests" / "fixtures").glob("**/*.py"))


def findings_of(paths: list[Path], root: Path) -> dict[str, list[list]]:
    found = {}
    for path in paths:
        name = str(path.relative_to(root))
        findings = lint_source(path.read_text(encoding="utf-8"), name)
        found[name] = [[f.line, f.column, f.code, f.fix, f.fixable, f.message] for f in findings]
    return found


def _one_finding_a_line(snapshot: dict[str, dict[str, list[list]]]) -> str:
    groups = []
    for group, found in snapshot.items():
        files = [
            f"  {json.dumps(name)}: [" + ",".join(f"\n   {json.dumps(f)}" for f in findings) + "]"
            for name, findings in sorted(found.items())
        ]
        groups.append(f" {json.dumps(group)}: {{\n" + ",\n".join(files) + "\n }")
    return "{\n" + ",\n".join(groups) + "\n}\n"


def _expected(group: str) -> dict[str, list[list]]:
    return json.loads(SNAPSHOT.read_text())[group]


def _compare(found: dict[str, list[list]], expected: dict[str, list[list]]) -> None:
    assert sorted(found) == sorted(expected), "the sample's files changed: regenerate the snapshot"
    differences = {
        name: {
            "missing": [f for f in expected[name] if f not in found[name]],
            "new": [f for f in found[name] if f not in expected[name]],
        }
        for name in found
        if found[name] != expected[name]
    }
    assert not differences, json.dumps(differences, indent=1)


def test_the_snapshot_has_findings_to_lose():
    snapshot = json.loads(SNAPSHOT.read_text())
    assert sum(map(len, snapshot["torch"].values())) > 50
    assert sum(map(len, snapshot["repo"].values())) > 300


def test_same_findings_on_our_examples_and_fixtures():
    _compare(findings_of(repo_sample(), ROOT), _expected("repo"))


@pytest.mark.slow
def test_same_findings_on_a_torch_sample():
    import torch

    assert torch.__version__.startswith(TORCH_VERSION), f"the snapshot is of torch {TORCH_VERSION}'s source"
    _compare(findings_of(torch_sample(), TORCH), _expected("torch"))


if __name__ == "__main__":  # regenerate the snapshot
    snapshot = {"torch": findings_of(torch_sample(), TORCH), "repo": findings_of(repo_sample(), ROOT)}
    SNAPSHOT.write_text(_one_finding_a_line(snapshot))
    counts = {group: sum(map(len, found.values())) for group, found in snapshot.items()}
    print(f"wrote {SNAPSHOT}: {counts}", file=sys.stderr)
