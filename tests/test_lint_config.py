"""`[tool.xlaport]` (kb/lint_config.py) with ruff's semantics, and lint's workflow flags: --fix, --exit-zero,
--statistics, --output-file, --config, --isolated, --force-exclude, --unsafe-fixes/--no-unsafe-fixes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.kb import all_rules
from xlaport.kb.lint_config import (
    ConfigError,
    Selection,
    choose_rules,
    find_config,
    glob_matches,
    load_settings,
    read_settings,
)

from xlaport.cli import app

# two safe XLA201 fixes (`.cuda()`), one unsafe XLA701 (`torch.save` of device tensors)
SOURCE = (
    "import torch\n\n\n"
    "def train(model, batch):\n"
    "    model = model.cuda()\n"
    "    out = model(batch.cuda())\n"
    '    torch.save(model.state_dict(), "ckpt.pt")\n'
    "    return out\n"
)


def run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def codes(*layers: Selection) -> set[str]:
    return {r.code for r in choose_rules(all_rules(), list(layers))}


EVERY = {r.code for r in all_rules()}
XLA2 = {c for c in EVERY if c.startswith("XLA2")}


def test_rule_selection_follows_ruff():
    assert codes() == EVERY
    assert codes(Selection(select=("XLA2",))) == XLA2
    assert codes(Selection(select=("XLA",), ignore=("XLA2",))) == EVERY - XLA2
    # the more specific selector decides, whichever list it is in
    assert codes(Selection(select=("XLA2",), ignore=("XLA",))) == XLA2
    assert codes(Selection(select=("XLA201",), ignore=("XLA2",))) == {"XLA201"}
    assert codes(Selection(select=("XLA2", "XLA201"), ignore=("XLA201",))) == XLA2 - {"XLA201"}  # a tie: ignore
    # a category is narrower than the XLA family, wider than a code prefix
    c4 = {r.code for r in all_rules() if r.category == "C4"}
    assert codes(Selection(select=("c4",))) == c4  # any case
    assert codes(Selection(select=("XLA",), ignore=("C4",))) == EVERY - c4
    assert codes(Selection(ignore=("ALL",), extend_select=("XLA201",))) == {"XLA201"}


def test_the_command_line_is_a_layer_over_the_configuration():
    configured = Selection(select=("XLA2", "XLA7"), ignore=("XLA201",))
    # --extend-select and --ignore build on the configured selection ...
    assert codes(configured, Selection(extend_select=("XLA101",))) == codes(configured) | {"XLA101"}
    assert "XLA202" not in codes(configured, Selection(ignore=("XLA202",)))
    # ... --select starts again: the configured ignore is gone too (ruff: `--select F401` enforces F401 only)
    assert codes(configured, Selection(select=("XLA201",))) == {"XLA201"}
    with pytest.raises(KeyError, match="no rule matches XLA999"):
        codes(Selection(ignore=("XLA999",)))


@pytest.mark.parametrize(
    ("glob", "path", "matches"),
    [
        ("legacy", "legacy/old.py", True),  # a name: a folder of that name anywhere
        ("legacy", "src/legacy/old.py", True),
        ("legacy", "src/legacy_v2.py", False),
        ("conftest.py", "tests/unit/conftest.py", True),
        ("test_*.py", "tests/test_a.py", True),
        ("tests/*", "tests/unit/test_a.py", True),  # `*` crosses `/` (globset's default)
        ("tests/*.py", "src/tests/a.py", False),  # a path: from the config's folder
        ("./scripts/", "scripts/run.py", True),
        ("src/a.py", "src/a.py", True),
        ("src/a.py", "src/ab.py", False),
    ],
)
def test_globs_name_a_file_or_a_folder_above_it(tmp_path, glob, path, matches):
    assert glob_matches(glob, tmp_path / path, tmp_path) is matches


def _project(root: Path, config: str, name: str = "pyproject.toml") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(config)
    return root


def test_the_nearest_config_file_governs_and_a_pyproject_counts_only_with_the_table(tmp_path):
    outer = _project(tmp_path / "outer", "[tool.xlaport]\nignore = ['XLA2']\n")
    inner = _project(outer / "inner", "[project]\nname = 'x'\n")  # no [tool.xlaport]: not a config
    assert find_config(inner) == outer / "pyproject.toml"
    _project(inner, "select = ['XLA7']\n[verify]\nrequire = 'L2'\n", "xlaport.toml")  # top-level keys; verify's own
    assert find_config(inner) == inner / "xlaport.toml"
    assert read_settings(inner / "xlaport.toml").selection == Selection(select=("XLA7",))
    _project(inner, "[tool.xlaport]\nselect = ['XLA1']\n", ".xlaport.toml")  # ruff's order: the dotted file first
    assert load_settings([inner / "a.py"]).selection.select == ("XLA1",)
    assert load_settings([inner], isolated=True).source is None
    assert load_settings([inner], config=outer / "pyproject.toml").selection.ignore == ("XLA2",)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[tool.xlaport]\nselct = ['XLA2']\n", "unknown key 'selct'"),
        ("[tool.xlaport]\nselect = 'XLA2'\n", "select must be a list of strings"),
        ("[tool.xlaport]\nunsafe-fixes = 'yes'\n", "unsafe-fixes must be true or false"),
        ("[tool.xlaport]\nper-file-ignores = {'a.py' = 'XLA2'}\n", "per-file-ignores must map globs"),
        ("[tool.xlaport\n", "cannot be read as TOML"),
    ],
)
def test_a_bad_configuration_is_an_error_that_names_the_file(tmp_path, config, message):
    project = _project(tmp_path, config)
    with pytest.raises(ConfigError, match=message):
        read_settings(project / "pyproject.toml")
    (project / "a.py").write_text(SOURCE)
    result = run("lint", project / "a.py")
    assert result.exit_code == 2 and message in result.output and "pyproject.toml" in result.output


def test_a_configured_code_that_matches_no_rule_is_a_usage_error(tmp_path):
    project = _project(tmp_path, "[tool.xlaport]\nper-file-ignores = {'a.py' = ['XLA9']}\n")
    (project / "a.py").write_text(SOURCE)
    result = run("lint", project / "a.py")
    assert result.exit_code == 2 and "per-file-ignores: no rule matches XLA9" in result.output


def _lint_codes(*args) -> tuple[int, list[tuple[str, str]]]:
    result = run("lint", "--format", "json", *args)
    return result.exit_code, sorted((Path(f["path"]).name, f["code"]) for f in json.loads(result.stdout)["findings"])


def test_lint_reads_select_exclude_and_per_file_ignores(tmp_path):
    project = _project(
        tmp_path / "p",
        "[tool.xlaport]\nselect = ['XLA2', 'XLA7']\nexclude = ['legacy']\nper-file-ignores = {'tests/*' = ['XLA2']}\n",
    )
    for rel in ("train.py", "legacy/old.py", "tests/test_train.py"):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(SOURCE)
    code, found = _lint_codes(project)
    assert code == 1
    assert found == [
        ("test_train.py", "XLA701"),  # XLA2 off under tests/
        ("train.py", "XLA201"),
        ("train.py", "XLA201"),
        ("train.py", "XLA701"),
    ]  # legacy/ excluded; nothing outside the selection (the file's imports would raise XLA4xx ones otherwise)
    # a file named on the command line is linted anyway, unless --force-exclude (pre-commit's hooks pass it)
    assert _lint_codes(project / "legacy" / "old.py")[1] == [("old.py", "XLA201")] * 2 + [("old.py", "XLA701")]
    assert _lint_codes("--force-exclude", project / "legacy" / "old.py") == (0, [])
    # the command line on top: --select replaces, --isolated reads no configuration
    assert _lint_codes("--select", "XLA701", project / "train.py")[1] == [("train.py", "XLA701")]
    assert _lint_codes(project / "legacy") == (0, [])  # a folder named: the files found in it are walked ones
    assert len(_lint_codes("--isolated", project / "legacy")[1]) == 3


def test_fix_honours_per_file_ignores_and_configured_unsafe_fixes(tmp_path):
    project = _project(
        tmp_path / "p", "[tool.xlaport]\nunsafe-fixes = true\nper-file-ignores = {'keep.py' = ['XLA201']}\n"
    )
    for name in ("train.py", "keep.py"):
        (project / name).write_text(SOURCE)
    assert run("fix", project).exit_code == 0
    train, keep = (project / "train.py").read_text(), (project / "keep.py").read_text()
    assert ".cuda()" not in train and "xm.save" in train  # the unsafe fix too: configured
    assert ".cuda()" in keep and "xm.save" in keep  # XLA201 off in keep.py: not fixed there
    (project / "train.py").write_text(SOURCE)
    assert run("fix", "--no-unsafe-fixes", project / "train.py").exit_code == 0
    assert "torch.save(" in (project / "train.py").read_text()  # the command line overrides the configuration


def test_exit_zero_statistics_and_output_file(tmp_path):
    source = tmp_path / "a.py"
    source.write_text(SOURCE)
    assert run("lint", source).exit_code == 1
    assert run("lint", "--exit-zero", source).exit_code == 0

    stats = run("lint", "--statistics", "--isolated", source)
    assert stats.exit_code == 1
    lines = stats.stdout.splitlines()
    assert lines[0].split()[:3] == ["2", "XLA201", "[*]"]  # the most frequent first, with its fix mark
    assert ["1", "XLA701", "[~]"] in [line.split()[:3] for line in lines]
    rows = json.loads(run("lint", "--statistics", "--format", "json", source).stdout)
    assert rows[0] == {
        "code": "XLA201",
        "title": rows[0]["title"],
        "count": 2,
        "fix": "safe",
        "fixable": True,
    }
    assert run("lint", "--statistics", "--format", "sarif", source).exit_code == 2

    out = tmp_path / "reports" / "lint.json"
    written = run("lint", "--format", "json", "--output-file", out, source)
    assert written.exit_code == 1 and written.stdout == ""
    assert [f["code"] for f in json.loads(out.read_text())["findings"]].count("XLA201") == 2


def test_lint_fix_rewrites_then_reports_what_is_left(tmp_path):
    source = tmp_path / "a.py"
    source.write_text(SOURCE)
    result = run("lint", "--fix", "--format", "json", source)
    left = json.loads(result.stdout)["findings"]
    assert result.exit_code == 1  # the unsafe fix was not applied: a finding is left
    assert [f["code"] for f in left if f["code"] in ("XLA201", "XLA701")] == ["XLA701"]
    assert ".cuda()" not in source.read_text() and (tmp_path / "a.py.xlaport.bak").read_text() == SOURCE
    assert "applied 2 fix(es) in 1 file(s)" in result.stderr


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True)


def test_fix_rewrites_a_staged_file_as_pre_commit_hands_it(tmp_path):
    """pre-commit runs hooks on staged files (unstaged edits stashed): the index is the way back, so no refusal and
    no backup; an edit that is not staged is still refused."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-qm", "init")
    (tmp_path / "a.py").write_text(SOURCE)
    assert run("fix", tmp_path / "a.py").exit_code == 2  # unstaged: refused
    _git(tmp_path, "add", "a.py")
    assert run("fix", tmp_path / "a.py").exit_code == 0
    assert ".cuda()" not in (tmp_path / "a.py").read_text()
    assert not (tmp_path / "a.py.xlaport.bak").exists()
    _git(tmp_path, "restore", "a.py")
    assert (tmp_path / "a.py").read_text() == SOURCE
