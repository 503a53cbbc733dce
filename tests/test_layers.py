"""The layers hold on this repository, and the checker catches a backwards import (tests/layers.py)."""

import shutil
from pathlib import Path

import pytest
from layers import PACKAGE_DIRS, check_tree

REPO = Path(__file__).resolve().parent.parent


def test_the_repository_keeps_its_layers():
    assert [str(v) for v in check_tree(REPO)] == []


def test_a_backwards_import_added_to_a_copy_of_the_repository_fails(tmp_path):
    for folder in PACKAGE_DIRS:
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    assert check_tree(tmp_path) == []
    docs = tmp_path / "kb" / "docs.py"
    docs.write_text(
        docs.read_text()
        + "\n\ndef pipeline():\n    from xlaport.serve.pipeline import Pipeline\n\n    return Pipeline\n"
    )
    (violation,) = check_tree(tmp_path)
    assert (violation.file, violation.importer, violation.imported) == (
        "kb/docs.py",
        "xlaport.kb.docs",
        "xlaport.serve.pipeline",
    )
    assert "function-local" in violation.why  # a late import is reported first: it is how cycles hide


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("file", "text", "why"),
    [
        ("kb/engine.py", "from xlaport.serve.pipeline import Pipeline\n", "kb may not import serve"),
        ("xlaport/files.py", "import xlaport.kb\n", "core may not import kb"),
        ("model/proposer.py", "from xlaport.training.loop import train\n", "model may not import training"),
        ("model/proposer.py", "from ..serve import pipeline\n", "model may not import serve"),
        ("eval/check.py", "from xlaport.model.spans import function_spans\n", "eval may not import model"),
        ("eval/check.py", "from xlaport.kb.engine import lint_source\n", "eval may not import kb"),
        ("eval/check.py", "from xlaport.kb import Finding, lint_source\n", "eval may not import kb"),
        ("serve/pipeline.py", "from .cli import migrate\n", "serve may not import serve-front"),
        ("serve/pipeline.py", "from xlaport.training.traces import lint_many\n", "serve may not import training"),
        ("serve/pipeline.py", "def f():\n    import json\n", "function-local import of json"),
        ("serve/pipeline.py", "def f():\n    from xlaport.kb import lint_source\n", "function-local import of xlaport"),
    ],
)
def test_each_backwards_or_hidden_import_is_reported(tmp_path, file, text, why):
    (violation,) = check_tree(_tree(tmp_path, {file: text}))
    assert violation.file == file and why in violation.why


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("eval/verify.py", "from xlaport.kb import Finding\n"),  # finding types only
        (
            "serve/pipeline.py",
            "from xlaport.eval.check import run_check\nfrom xlaport.model.spans import function_spans\n",
        ),
        ("serve/http.py", "from .pipeline import Pipeline\n"),
        ("serve/cli.py", "def migrate():\n    from .pipeline import get_pipeline\n"),  # a command loads late
        ("training/loop.py", "def f():\n    import torch\n"),
        ("training/dataset.py", "from xlaport.model.prompts import edit_script\nfrom xlaport.eval import check\n"),
        ("xlaport/cli.py", "def f():\n    from xlaport.training.cli import register\n"),
        # a late import of an xlaport module that itself loads torch at import
        ("eval/worker.py", "def f():\n    from xlaport.eval import shim\n"),
    ],
)
def test_imports_that_point_down_are_allowed(tmp_path, file, text):
    files = {file: text}
    if file == "eval/worker.py":
        files["eval/shim.py"] = "import torch\n"
    assert check_tree(_tree(tmp_path, files)) == []
