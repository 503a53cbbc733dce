"""Trees linted and fixed in one run (issue 27): the summary and each file's lint share one parse, worker
processes give the same results in the same order as one process, and a worker that dies takes only its file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.kb import batch
from xlaport.kb.batch import (
    WORD,
    FileJob,
    Tree,
    TreeTask,
    _names_any,
    fix_file,
    lint_file,
    run_files,
    summarize_project,
)

from xlaport.cli import app

PROJECTS = Path(__file__).parent.parent / "fixtures" / "project"
CASES = sorted(p for p in PROJECTS.iterdir() if p.is_dir())


def python_files(root: Path) -> tuple[Path, ...]:
    return tuple(sorted(p.relative_to(root) for p in root.rglob("*.py")))


def tree_jobs(root: Path) -> tuple[list[FileJob], list[Tree]]:
    rels = python_files(root)
    return [FileJob(root / rel, str(rel), 0, rel) for rel in rels], [Tree(root, rels)]


def as_data(results) -> list[tuple]:
    return [(r.path, list(r.findings), list(r.applied), r.fixed, r.error) for r in results]


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_a_tree_fixed_in_workers_is_fixed_as_file_by_file(case: Path):
    src, expected = case / "input", case / "expected"
    files, trees = tree_jobs(src)
    project = summarize_project(src, list(trees[0].rels))
    one_by_one = [fix_file(job.path, display=job.display, project=project) for job in files]
    in_workers = run_files(files, trees, TreeTask(fix=True), jobs=2)
    assert as_data(in_workers) == as_data(one_by_one)
    assert [r.fixed for r in in_workers] == [(expected / job.rel).read_text() for job in files]


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_a_lint_that_reuses_the_summarys_analysis_finds_what_a_fresh_lint_finds(case: Path):
    src = case / "input"
    files, trees = tree_jobs(src)
    project = summarize_project(src, list(trees[0].rels))
    fresh = [lint_file(job.path, display=job.display, project=project) for job in files]
    for jobs in (1, 2):
        assert as_data(run_files(files, trees, TreeTask(), jobs=jobs)) == as_data(fresh)


TREE = {
    "steps/helpers.py": "def train_step(model, batch, opt):\n    loss = model(batch)\n    loss.backward()\n    opt.step()\n",
    "loop.py": (
        "import torch\nfrom steps.helpers import train_step\n\n\ndef main(model, loader, opt):\n"
        "    for batch in loader:\n        train_step(model, batch.cuda(), opt)\n"
    ),
    "broken.py": "def oops(:\n",
    **{f"pkg/m{i}.py": f"import torch\n\n\ndef f{i}(x):\n    return x.cuda()\n" for i in range(9)},
}


def write_tree(root: Path) -> Path:
    for rel, text in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_worker_results_keep_the_files_order_and_report_the_unparsable_file(tmp_path: Path):
    root = write_tree(tmp_path)
    files, trees = tree_jobs(root)
    results = run_files(files, trees, TreeTask(), jobs=2)
    assert [r.path for r in results] == [str(job.rel) for job in files]
    by_path = {r.path: r for r in results}
    assert "cannot parse" in by_path["broken.py"].error
    assert "XLA406" in {f.code for f in by_path["loop.py"].findings}  # the step is in steps/helpers.py
    assert as_data(results) == as_data(run_files(files, trees, TreeTask(), jobs=1))


def test_a_worker_that_dies_fails_only_the_file_it_was_on(tmp_path: Path, monkeypatch):
    root = write_tree(tmp_path)
    files, trees = tree_jobs(root)
    expected = as_data(run_files(files, trees, TreeTask(), jobs=1))
    real_lint = batch.lint_file

    def crash_on_m3(path, *args, **kwargs):
        if Path(path).name == "m3.py" and os.getpid() != parent:
            os._exit(1)  # as a native crash of the parser would
        return real_lint(path, *args, **kwargs)

    parent = os.getpid()
    monkeypatch.setattr(batch, "lint_file", crash_on_m3)
    results = run_files(files, trees, TreeTask(), jobs=2, context=batch.default_context())
    crashed = [r for r in results if r.error and batch.DIED in r.error]
    assert [r.path for r in crashed] == ["pkg/m3.py"]
    assert [x for x in as_data(results) if x[0] != "pkg/m3.py"] == [x for x in expected if x[0] != "pkg/m3.py"]


@pytest.mark.parametrize("name", ["train_step", "x", "módulo", "my-module", "a.b"])
def test_the_word_index_answers_as_the_regex_search_did(name: str):
    text = "from my-module import train_step_2, x1\ncall(train_step)\n# módulo, a.b\n"
    words = frozenset(WORD.findall(text))
    assert bool(_names_any([name], words, text)) == bool(re.search(rf"\b{re.escape(name)}\b", text))


def test_lint_and_fix_commands_give_the_same_output_with_workers(tmp_path: Path):
    root = write_tree(tmp_path)
    runner = CliRunner()
    outputs = [runner.invoke(app, ["lint", str(root), "--format", "json", "-j", jobs]) for jobs in ("1", "2")]
    assert [o.exit_code for o in outputs] == [1, 1]
    assert outputs[0].stdout == outputs[1].stdout
    assert '"XLA406"' in outputs[0].stdout
    diffs = [runner.invoke(app, ["fix", str(root), "--diff", "-j", jobs]) for jobs in ("1", "2")]
    assert diffs[0].stdout == diffs[1].stdout and "torch_xla" in diffs[0].stdout
