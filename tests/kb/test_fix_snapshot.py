"""Fix output on real trees and the examples stays what it was: speed work must not change a byte.

The snapshot (tests/fixtures/fix_snapshot/snapshot.json) holds, per file, a hash of the fixed text and the
codes applied and left, for the repositories under /work/corpus (their code is not committed, only hashes)
at the commit recorded for each, and for examples/. Each tree is fixed as `migrate` does (serve/tree.py
`rewrite_files`: the project summary, then every file). Rewrite it after an intended change of the rules:

    .venv/bin/python tests/kb/test_fix_snapshot.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from xlaport.serve.tree import plan_tree, rewrite_files

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "fixtures" / "fix_snapshot" / "snapshot.json"
CORPUS = Path("/work/corpus")
TREES = (
    "karpathy__nanoGPT",
    "karpathy__minGPT",
    "kuangliu__pytorch-cifar",
    "HobbitLong__SupContrast",
    "facebookresearch__mae",
    "facebookresearch__DiT",
    "openai__guided-diffusion",
)


def _tree_dir(name: str) -> Path:
    return ROOT / "examples" if name == "examples" else CORPUS / name


def _commit(name: str) -> str | None:
    marker = _tree_dir(name) / ".corpus_commit"
    return marker.read_text().split()[-1] if marker.is_file() else None


def fixed_tree(name: str) -> dict[str, list]:
    """rel path -> [sha256 of the fixed text (12 hex), codes applied, `code:line` left, error]."""
    src = _tree_dir(name)
    python, _ = plan_tree(src)
    out = {}
    for result in rewrite_files(src, python, None, unsafe=False, jobs=1):
        fixed = result.fixed if result.fixed is not None else ""
        out[result.path] = [
            hashlib.sha256(fixed.encode("utf-8", "surrogatepass")).hexdigest()[:12],
            [f.code for f in result.applied],
            [f"{f.code}:{f.line}" for f in result.findings],
            result.error,
        ]
    return out


def _snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["examples", *TREES])
def test_fix_output_unchanged(name):
    expected = _snapshot()[name]
    if not _tree_dir(name).is_dir():
        pytest.skip(f"{name} is not checked out under {CORPUS}")
    if _commit(name) != expected["commit"]:
        pytest.skip(f"{name} is at another commit than the snapshot's")
    got = fixed_tree(name)
    changed = {rel: (expected["files"].get(rel), got.get(rel)) for rel in {*got, *expected["files"]}}
    changed = {rel: pair for rel, pair in changed.items() if pair[0] != pair[1]}
    assert not changed, json.dumps(changed, indent=1)


if __name__ == "__main__":
    names = sys.argv[1:] or ["examples", *TREES]
    snapshot = _snapshot() if SNAPSHOT.is_file() else {}
    for name in names:
        if _tree_dir(name).is_dir():
            snapshot[name] = {"commit": _commit(name), "files": fixed_tree(name)}
            print(name, len(snapshot[name]["files"]), "files", flush=True)
    SNAPSHOT.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
