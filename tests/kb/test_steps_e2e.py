"""End to end: CUDA training scripts whose step goes through a loss scaler or a helper method, migrated with
the default (safe) fixes, run on the XLA device (PJRT_DEVICE=CPU): a barrier per step, so after the
warm-up steps nothing compiles again (issue 9, items 3 and 5)."""

from __future__ import annotations

from pathlib import Path

import pytest
from xlaport.eval.check import run_check
from xlaport.kb import fix_source

PROGRAMS = Path(__file__).parent.parent / "programs" / "steps"


def migrate_default(name: str, tmp_path: Path) -> Path:
    result = fix_source((PROGRAMS / f"{name}.py").read_text(), f"{name}.py")  # no unsafe fixes
    assert result.fixed.count("torch_xla.sync()") == 1, result.fixed
    assert not [f for f in result.remaining if f.code == "XLA406"]
    script = tmp_path / f"{name}.py"
    script.write_text(result.fixed)
    return script


@pytest.mark.slow
@pytest.mark.parametrize(("name", "steps"), [("cuda_scaler_loop", 12), ("cuda_trainer_helper", 24)])
def test_migrated_program_compiles_only_during_warm_up(name, steps, tmp_path):
    report = run_check(migrate_default(name, tmp_path), timeout_s=300)
    assert report.error is None, report.error
    assert report.steps == steps
    assert report.compiles_after_warmup == 0, report.recompile_sources
    assert report.level == "L2", report.reasons


@pytest.mark.slow
def test_migrated_tree_with_the_step_in_another_module_compiles_only_during_warm_up(tmp_path):
    from xlaport.serve.tree import plan_tree, rewrite_files

    src = PROGRAMS.parent / "project_steps"
    python, _ = plan_tree(src)
    results = rewrite_files(src, python, None, False)  # the default (safe) fixes, the tree analysed as one
    for rel, result in zip(python, results, strict=True):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(result.fixed)
    syncs = {str(rel): (tmp_path / rel).read_text().count("torch_xla.sync()") for rel in python}
    assert syncs == {"loop.py": 1, "support/__init__.py": 0, "support/updates.py": 0, "train.py": 0}
    report = run_check(tmp_path / "train.py", timeout_s=300, workdir=tmp_path)
    assert report.error is None, report.error
    assert report.steps == 16
    assert report.compiles_after_warmup == 0, report.recompile_sources
    assert report.level == "L2", report.reasons


@pytest.mark.slow
def test_kept_grad_scaler_runs_on_xla_and_the_check_says_what_removes_its_syncs(tmp_path):
    # the default migration of a float16 AMP script keeps its GradScaler (dropping loss scaling changes the
    # numbers): it runs on the XLA device and compiles only while warming up, so it is L2; it reads the
    # scaler's inf check on the host every step, a performance finding that says which unsafe fixes remove it
    source = (PROGRAMS / "cuda_amp_scaler.py").read_text()
    script = tmp_path / "train.py"
    script.write_text(fix_source(source, "train.py").fixed)
    report = run_check(script, timeout_s=300)
    assert report.error is None, report.error
    assert report.steps == 32
    assert report.compiles_after_warmup == 0, report.recompile_sources
    assert report.level == "L2", report.reasons
    (finding,) = [f for f in report.performance if f.code == "XLA502"]
    assert finding.every_step and finding.share > 0 and "--unsafe-fixes" in finding.fix
    script.write_text(fix_source(source, "train.py", unsafe=True).fixed)
    report = run_check(script, timeout_s=300)
    assert report.level == "L2", report.reasons
    assert not [f for f in report.performance if f.code == "XLA502"]
