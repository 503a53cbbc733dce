"""Config files and run scripts naming a CUDA device or NCCL: findings (path, line) and safe rewrites (issue 9, item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.kb.configs import config_kind, fix_config, lint_config
from xlaport.serve.pipeline import MigrateOptions, Pipeline

from xlaport.cli import app


def test_kinds_by_suffix():
    kinds = [config_kind(p) for p in ("a.yaml", "b.YML", "c.json", "d.toml", "run.sh", "x.py", "Makefile")]
    assert kinds == ["yaml", "yaml", "json", "toml", "shell", None, None]


def test_json_and_toml_are_reported_not_rewritten():
    text = '{\n  "device": "cuda:0",\n  "dist_backend": "nccl",\n  "note": "cuda_home"\n}\n'
    findings = lint_config(text, "cfg.json")
    assert [(f.line, f.code, f.fixable) for f in findings] == [(2, "XLA240", False), (3, "XLA740", False)]
    assert fix_config(text, "cfg.json").fixed == text
    toml = 'device = "cuda" # the GPU\ndeps = ["nvidia-cuda-runtime-cu12"]\n'
    assert [(f.line, f.code) for f in lint_config(toml, "pyproject.toml")] == [(1, "XLA240")]


def test_shell_flags_rewritten_other_mentions_reported():
    text = "python a.py --device=cuda:1 model.device=cuda\r\npython b.py cuda\r\n# cuda in a comment\r\n"
    result = fix_config(text, "run.sh")
    assert result.fixed == "python a.py --device=xla model.device=xla\r\npython b.py cuda\r\n# cuda in a comment\r\n"
    assert [(f.line, f.code) for f in result.applied] == [(1, "XLA240")]
    assert [(f.line, f.code, f.fixable) for f in result.remaining] == [(2, "XLA240", False)]


def test_selection_by_code():
    text = "device: cuda\nbackend: nccl\n"
    assert [f.code for f in lint_config(text, "c.yaml", {"XLA740"})] == ["XLA740"]
    assert fix_config(text, "c.yaml", {"XLA740"}).fixed == text


def test_lint_walks_config_files(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "train.yaml").write_text("model:\n  device: cuda:0\n")
    (tmp_path / "run.sh").write_text("python train.py --backend nccl\n")
    (tmp_path / "data.csv").write_text("device\ncuda\n")  # not a config kind: never read
    result = CliRunner().invoke(app, ["lint", str(tmp_path), "--format", "json"])
    assert result.exit_code == 1, result.output
    found = {(Path(f["path"]).name, f["line"], f["code"]) for f in json.loads(result.stdout)["findings"]}
    assert found == {("train.yaml", 2, "XLA240"), ("run.sh", 1, "XLA740")}


@pytest.fixture(autouse=True)
def global_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "global-traces.jsonl"))
    monkeypatch.setenv("XLAPORT_MODELS_DIR", str(tmp_path / "no-models"))


def test_migrate_rewrites_configs_and_reports_the_rest(tmp_path):
    src = tmp_path / "project"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    (src / "config.yaml").write_text("device: 'cuda'  # GPU\nlr: 0.1\n")
    (src / "launch.sh").write_text("CUDA_VISIBLE_DEVICES=0 python train.py --device cuda\n")
    (src / "weights.json").write_bytes(b"\xff\xfe not text")
    dst = tmp_path / "out"
    result = Pipeline().migrate(src, dst, MigrateOptions(k=0, keep_trace=True))
    assert (dst / "config.yaml").read_text() == "device: 'xla'  # GPU\nlr: 0.1\n"
    assert (dst / "launch.sh").read_text() == "CUDA_VISIBLE_DEVICES=0 python train.py --device xla\n"
    assert (dst / "weights.json").read_bytes() == b"\xff\xfe not text"  # unreadable: copied, not an error
    assert result.errors == []
    assert result.fixes_applied == {"XLA240": 2}
    outcome = {o.path: o for o in result.files}
    assert [(m.finding.line, m.finding.code) for m in outcome["launch.sh"].manual] == [(1, "XLA740")]
    assert outcome["config.yaml"].status == "changed"
    trace = [json.loads(line) for line in (dst / "xlaport-trace.jsonl").read_text().splitlines()]
    assert {r["path"] for r in trace if r["unit"] == "function"} <= {"train.py"}


def test_migrate_keeps_a_linked_config_a_link_and_never_writes_through_it(tmp_path):
    src = tmp_path / "project"
    (src / "conf").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "conf" / "base.yaml").write_text("device: cuda\n")
    (src / "config.yaml").symlink_to("conf/base.yaml")
    dst = tmp_path / "out"
    result = Pipeline().migrate(src, dst, MigrateOptions(k=0))
    assert (dst / "config.yaml").is_symlink() and (dst / "conf" / "base.yaml").read_text() == "device: xla\n"
    assert (src / "conf" / "base.yaml").read_text() == "device: cuda\n"
    assert [o.path for o in result.files if o.codes_applied] == ["conf/base.yaml"]
