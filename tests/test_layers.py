"""The layers hold on this repository, and the checker catches a backwards import (tests/layers.py)."""

import shutil
from pathlib import Path

import pytest
from layers import check_tree, package_dirs

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = (REPO / "pyproject.toml").read_text()


def test_the_repository_keeps_its_layers():
    assert [str(v) for v in check_tree(REPO)] == []


def test_a_backwards_import_added_to_a_copy_of_the_repository_fails(tmp_path):
    for folder in package_dirs(REPO):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
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
    """A synthetic tree: the repository's pyproject.toml and package folders (empty but for what `files` adds)."""
    files = {"pyproject.toml": PYPROJECT, **{f"{folder}/__init__.py": "" for folder in package_dirs(REPO)}, **files}
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
    ("file", "text", "targets"),
    [
        ("eval/verify.py", "from xlaport.kb import Finding\n", []),  # finding types only
        (
            "serve/pipeline.py",
            "from xlaport.eval.check import run_check\nfrom xlaport.model.spans import function_spans\n",
            ["eval/check.py", "model/spans.py"],
        ),
        ("serve/http.py", "from .pipeline import Pipeline\n", ["serve/pipeline.py"]),
        ("serve/cli.py", "def migrate():\n    from .pipeline import get_pipeline\n", ["serve/pipeline.py"]),
        ("training/loop.py", "def f():\n    import torch\n", []),
        (
            "training/dataset.py",
            "from xlaport.model.prompts import edit_script\nfrom xlaport.eval import check\n",
            ["model/prompts.py", "eval/check.py"],
        ),
        ("xlaport/cli.py", "def f():\n    from xlaport.training.cli import register\n", ["training/cli.py"]),
        # a late import of an xlaport module that itself loads torch at import
        ("eval/worker.py", "def f():\n    from xlaport.eval import shim\n", []),
    ],
)
def test_imports_that_point_down_are_allowed(tmp_path, file, text, targets):
    files = {file: text, **dict.fromkeys(targets, "")}
    if file == "eval/worker.py":
        files["eval/shim.py"] = "import torch\n"
    assert check_tree(_tree(tmp_path, files)) == []


# --- the loopholes a checker can pass by (issue 29, item 4): each tree below passed before -----------------
def test_an_empty_tree_or_one_without_packages_fails(tmp_path):
    (violation,) = check_tree(tmp_path)
    assert "no [tool.setuptools.package-dir]" in violation.why
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)  # declared, but no folder is there
    assert {v.file for v in check_tree(tmp_path)} == set(package_dirs(REPO))


def test_the_folders_are_the_ones_pyproject_declares(tmp_path):
    """A package kept in another folder is checked there; a declared package with no layer is an error."""
    moved = PYPROJECT.replace('"xlaport.kb" = "kb"', '"xlaport.kb" = "src/kb"')
    root = _tree(tmp_path, {"pyproject.toml": moved, "src/kb/engine.py": "from xlaport.serve import pipeline\n"})
    (tmp_path / "kb" / "__init__.py").unlink()
    (tmp_path / "kb").rmdir()
    (violation,) = check_tree(root)
    assert violation.file == "src/kb/engine.py" and "kb may not import serve" in violation.why
    plugin = PYPROJECT.replace('"xlaport.kb" = "kb"', '"xlaport.kb" = "kb"\n"xlaport.plugins" = "plugins"')
    (violation,) = check_tree(_tree(tmp_path, {"pyproject.toml": plugin, "plugins/__init__.py": ""}))
    assert violation.importer == "xlaport.plugins" and "no layer" in violation.why


@pytest.mark.parametrize(
    ("text", "imported"),
    [
        ("import xlaport.serving\n", "xlaport.serving"),  # no such module: it counted as core
        ("from xlaport import serve\n", "xlaport.serve"),  # a module imported as a name of xlaport
    ],
)
def test_an_unknown_module_or_a_module_imported_as_a_name_is_not_core(tmp_path, text, imported):
    files = {"serve/__init__.py": "", "kb/engine.py": text}
    (violation,) = check_tree(_tree(tmp_path, files))
    assert violation.imported == imported


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('import importlib\nSERVE = importlib.import_module("xlaport.serve")\n', "kb may not import serve"),
        ('SERVE = __import__("xlaport.serve")\n', "kb may not import serve"),
        ('from importlib import import_module\nSERVE = import_module("..serve", __name__)\n', "kb may not import"),
        ('import importlib\nname = "xlaport.serve"\nSERVE = importlib.import_module(name)\n', "computed"),
    ],
)
def test_imports_through_importlib_or_dunder_import_are_checked(tmp_path, text, why):
    (violation,) = check_tree(_tree(tmp_path, {"serve/__init__.py": "", "kb/engine.py": text}))
    assert violation.file == "kb/engine.py" and why in violation.why
