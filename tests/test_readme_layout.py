"""README's layout section matches the tree: every folder it has a row for exists, every module or file it names in
a row is in that folder, every top-level folder and every package folder is named, and pyproject.toml installs every
package folder (a package left out of `[tool.setuptools] packages` is missing from `pip install .`)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# backticked words of the layout that are not files: commands, the sandbox user
NOT_FILES = frozenset({"xlaport", "lint", "fix", "check", "nobody"})
FILE_EXTENSIONS = (".py", ".jsonl", ".toml", ".md", ".sh")
FILE_NAME = re.compile(r"^[a-z_][a-z0-9_-]*(\.py|\.jsonl|\.toml|\.md|\.sh|/)?$")


def layout_rows(readme: str) -> dict[str, str]:
    """folder (as written, with its slash) -> the text of its row ("package" and "what" columns)."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`[^`]+/`", cells[0]):
            rows[cells[0].strip("`")] = " | ".join(cells[1:])
    return rows


def named_files(text: str) -> list[str]:
    """The backticked words of a row that name a module, a package folder or a file."""
    return [word for word in re.findall(r"`([^`]+)`", text) if FILE_NAME.match(word) and word not in NOT_FILES]


def found_under(folder: Path, word: str) -> bool:
    names = {word.rstrip("/")} if word.endswith(("/", *FILE_EXTENSIONS)) else {word, f"{word}.py"}
    return any(path.name in names and "__pycache__" not in path.parts for path in [folder, *folder.rglob("*")])


def tracked_top_folders() -> set[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {f.split("/", 1)[0] for f in files if "/" in f and not f.startswith(".")}


def package_folders() -> list[Path]:
    """Every folder of the installed packages (one with an __init__.py), tests' fixtures aside."""
    return sorted(
        p.parent.relative_to(ROOT) for p in ROOT.glob("*/**/__init__.py") if p.parts[len(ROOT.parts)] in PACKAGE_DIRS
    )


PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS = {folder: package for package, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}
ROWS = layout_rows((ROOT / "README.md").read_text())


def test_the_layout_is_read():
    """The checks below see the table: its rows and the names in them."""
    assert {"kb/", "eval/", "serve/", "tests/"} <= ROWS.keys()
    assert "registry" in named_files(ROWS["kb/"]) and "analysis/" in named_files(ROWS["kb/"])


@pytest.mark.parametrize("folder", sorted(ROWS))
def test_every_name_in_a_row_is_in_its_folder(folder: str):
    assert (ROOT / folder).is_dir(), f"README's layout has a row for {folder}, which does not exist"
    missing = [word for word in named_files(ROWS[folder]) if not found_under(ROOT / folder, word)]
    assert not missing, f"README's layout names in {folder} what is not there: {missing}"


def test_every_top_level_folder_has_a_row():
    assert sorted(tracked_top_folders() - {f.rstrip("/") for f in ROWS}) == []


def test_every_package_folder_is_named_in_its_row():
    unnamed = []
    for folder in package_folders():
        top, *inner = folder.parts
        if inner and f"{inner[-1]}/" not in named_files(ROWS[f"{top}/"]):
            unnamed.append(str(folder))
    assert unnamed == [], f"package folders the layout does not name: {unnamed}"


def test_pyproject_installs_every_package_folder():
    declared = set(PYPROJECT["tool"]["setuptools"]["packages"])
    wanted = {".".join([PACKAGE_DIRS[folder.parts[0]], *folder.parts[1:]]) for folder in package_folders()}
    assert sorted(wanted - declared) == [], "add them to [tool.setuptools] packages in pyproject.toml"


def test_the_core_row_names_every_core_module():
    """The core is small and its row lists it: a core module the row leaves out is one a reader cannot find."""
    modules = {p.stem for p in (ROOT / "xlaport").glob("*.py")} - {"__init__", "__main__"}
    unnamed = sorted(m for m in modules if not found_in_row(ROWS["xlaport/"], m))
    assert unnamed == [], f"core modules README's xlaport/ row does not name: {unnamed}"


def found_in_row(row: str, module: str) -> bool:
    return f"`{module}`" in row or f"`{module}.py`" in row
