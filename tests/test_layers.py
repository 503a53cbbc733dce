"""The layers hold on this repository, and the checker catches a backwards import (tests/layers.py)."""

import ast
import re
import shutil
import sys
import tomllib
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
    violation, circle = check_tree(tmp_path)
    assert (violation.file, violation.importer, violation.imported) == (
        "kb/docs.py",
        "xlaport.kb.docs",
        "xlaport.serve.pipeline",
    )
    assert "function-local" in violation.why  # a late import is reported first: it is how cycles hide
    assert "import circle" in circle.why and "xlaport.kb.docs" in circle.why  # and the circle it hid


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


# --- kb from the bottom up (issue 29, item 2): helpers < analysis < rule bases < rules, and no import circle ------
@pytest.mark.parametrize(
    ("files", "why"),
    [
        (  # the circle the analysis had: a module's facts typed with the project, the project with the module
            {
                "kb/analysis/module.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .project import P\n",
                "kb/analysis/project.py": "from .module import walk\n",
            },
            "import circle: xlaport.kb.analysis.module, xlaport.kb.analysis.project",
        ),
        (
            {"kb/analysis/steps.py": "from ..rule import Rule\n", "kb/rule.py": ""},
            "kb analysis may not import kb rule bases",
        ),
        (
            {"kb/cst_helpers.py": "from .analysis.module import children_of\n", "kb/analysis/module.py": ""},
            "kb helpers may not import kb analysis",
        ),
        (
            {"kb/scoped_rule.py": "from .rules.c1 import X\n", "kb/rules/c1.py": ""},
            "kb rule bases may not import kb rules",
        ),
    ],
)
def test_a_planted_kb_circle_or_upward_import_fails(tmp_path, files, why):
    (violation,) = check_tree(_tree(tmp_path, files))
    assert why in violation.why


# kb's modules that make a search: numpy and the embedding model, the [search] extra (pyproject.toml)
SEARCH_MODULES = {"kb/retrieval.py", "kb/minilm.py"}


def _core_dependencies() -> set[str]:
    """The import names of pyproject.toml's [project] dependencies: what `pip install xlaport` brings."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {re.match(r"[A-Za-z0-9_.-]+", d).group().lower().replace("-", "_") for d in project["dependencies"]}


def _third_party_imports(folder: Path) -> dict[str, set[str]]:
    """Top-level third-party module -> the files of `folder` that import it (anywhere: late imports count)."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for top in {name.split(".")[0] for name in names} - set(sys.stdlib_module_names) - {"xlaport"}:
                found.setdefault(top, set()).add(str(path.relative_to(folder.parent)))
    return found


def test_kb_and_the_core_import_only_the_core_dependencies_and_the_standard_library():
    """`pip install xlaport` (libcst, typer, rich, pydantic) is enough for lint, fix and kb list/show: only the
    search modules use the [search] extra, and the rest of kb imports them late (only `kb search` does)."""
    core = _core_dependencies()
    assert core == {"libcst", "typer", "rich", "pydantic"}
    for folder in ("kb", "xlaport"):
        beyond = {
            module: files - SEARCH_MODULES
            for module, files in _third_party_imports(REPO / folder).items()
            if module not in core and files - SEARCH_MODULES
        }
        assert beyond == {}, f"{folder} imports what the core install lacks"
    at_import = [(file, imported) for file, imported, is_local in _search_imports() if not is_local]
    assert at_import == [], "a search module imported at module level: `import xlaport.kb` would need numpy"
    assert ("kb/cli.py", "xlaport.kb.retrieval", True) in _search_imports()  # `kb search`: the checker sees it


def _search_imports() -> list[tuple[str, str, bool]]:
    """(file, search module, function-local) for each import of a search module by another kb module."""
    from layers import imports_of, module_name

    names = {module_name(REPO / f, REPO / "kb", "xlaport.kb") for f in SEARCH_MODULES}
    found = []
    for path in sorted((REPO / "kb").rglob("*.py")):
        if str(path.relative_to(REPO)) in SEARCH_MODULES:
            continue
        module = module_name(path, REPO / "kb", "xlaport.kb")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for _, imported, _, is_local in imports_of(tree, module, path.name == "__init__.py"):
            if imported in names:
                found.append((str(path.relative_to(REPO)), imported, is_local))
    return found
