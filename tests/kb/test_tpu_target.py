"""The target seam (xlaport/targets.py): `--target torch_tpu` selects the TorchTPU entries, torch_xla keeps its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner
from xlaport.kb import all_rules, fix_source, lint_source, select_rules
from xlaport.kb.batch import lint_file

from xlaport.cli import app
from xlaport.targets import evidence_note

FIXTURES = Path(__file__).parent / "tpu_fixtures"
TPU_RULES = all_rules("torch_tpu")


# torch_xla entries whose detection, message and fix hold on TorchTPU as they stand (read one by one: an entry whose
# message or fix names torch_xla, xm or the lazy graph stays torch_xla's, e.g. XLA111's per-package advice)
SHARED = {"XLA312", "XLA503", "XLA602", "XLA603", "XLA604", "XLA607"}


def test_targets_share_only_the_target_neutral_entries():
    xla = {r.code for r in all_rules()}
    tpu = {r.code for r in TPU_RULES}
    assert xla & tpu == SHARED
    assert all(code.startswith("TPU") for code in tpu - SHARED)
    assert not any(code.startswith("TPU") for code in xla)
    assert not any(r.category == "C4" for r in TPU_RULES)  # an eager device: no step-barrier entries
    with pytest.raises(KeyError, match="unknown target"):
        select_rules(target="cuda")


@pytest.mark.parametrize("rule", [r for r in TPU_RULES if r.code != "TPU101"], ids=lambda r: r.code)
def test_tpu_entry_examples(rule):
    assert lint_source(rule.before, rules=[rule])
    if rule.after:
        assert fix_source(rule.before, rules=[rule], unsafe=rule.fix == "unsafe").fixed == rule.after
    for valid in rule.valid:
        assert not lint_source(valid, rules=[rule])


def test_nanogpt_style_fixture_migrates_to_tpu():
    source = (FIXTURES / "nanogpt_style_train.py").read_text()
    result = fix_source(source, "train.py", TPU_RULES)
    assert result.fixed == (FIXTURES / "nanogpt_style_train.expected.py").read_text()
    assert [f.code for f in result.remaining] == ["TPU302"]  # the GradScaler is a human's call
    assert "cuda" not in result.fixed.replace("torch.cuda.amp.GradScaler", "")


def test_torch_xla_target_does_not_see_tpu_entries():
    source = (FIXTURES / "nanogpt_style_train.py").read_text()
    assert not any(f.code.startswith("TPU") for f in lint_source(source))


def test_library_pins_reported_only_for_torch_tpu(tmp_path):
    pins = tmp_path / "requirements.txt"
    pins.write_text("torch>=2.11\ntransformers==4.30.2  # old\naccelerate <0.21\npeft>=0.5\ntransformers>=4.40\n")
    found = lint_file(pins, select_rules(target="torch_tpu")).findings
    assert [(f.line, f.code) for f in found] == [(2, "TPU101"), (3, "TPU101")]
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["accelerate~=0.20.3", "torch"]\n')
    assert [f.line for f in lint_file(pyproject, select_rules(target="torch_tpu")).findings] == [2]
    assert not lint_file(pyproject, select_rules()).findings
    # report only: the torch-tpu wheel names no release that knows `tpu`, so no pin is raised (kb/tpu_pins.py)
    rule = select_rules(["TPU101"], target="torch_tpu")[0]
    assert rule.fix == "manual" and not rule.autofix and "names no transformers/accelerate release" in rule.why


def test_cli_target_option(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n")
    runner = CliRunner()
    tpu = runner.invoke(app, ["lint", "--target", "torch_tpu", "--format", "json", str(script)])
    assert '"TPU202"' in tpu.output
    xla = runner.invoke(app, ["lint", "--format", "json", str(script)])
    assert "TPU2" not in xla.output and xla.exit_code == 1
    assert runner.invoke(app, ["lint", "--target", "nope", str(script)]).exit_code == 2


def test_torch_tpu_is_never_validated_here():
    from xlaport.serve.pipeline import Pipeline
    from xlaport.serve.results import SuggestOptions

    assert evidence_note("torch_xla") is None
    source = "import torch\nx = torch.ones(2).cuda()\n"
    patch = Pipeline().suggest(source, "t.py", SuggestOptions(target="torch_tpu", validate_patch=True))
    assert 'to("tpu")' in patch.migrated
    assert patch.evidence.status == "unvalidated"
    assert "TorchTPU evidence needs a TPU host" in patch.evidence.reason


def test_migrate_tree_for_torch_tpu_is_unvalidated_and_reports_pins(tmp_path):
    from xlaport.serve.pipeline import MigrateOptions, Pipeline

    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text((FIXTURES / "nanogpt_style_train.py").read_text())
    (src / "requirements.txt").write_text("torch>=2.11\naccelerate==0.20.3\n")
    options = MigrateOptions(target="torch_tpu", validate_cmd="python train.py")
    result = Pipeline().migrate(src, tmp_path / "dst", options, may_execute=True).summary()
    assert (tmp_path / "dst" / "train.py").read_text() == (FIXTURES / "nanogpt_style_train.expected.py").read_text()
    assert result["validation"]["status"] == "unvalidated"
    assert "TorchTPU evidence needs a TPU host" in result["validation"]["reason"]
    assert any("requirements.txt:2: TPU101" in note for note in result["notes"])


@pytest.mark.parametrize(("command", "code"), [("check", 1), ("verify", 3)])
def test_check_and_verify_refuse_to_grade_torch_tpu(tmp_path, command, code):
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    args = [str(script)] if command == "check" else [str(tmp_path), str(tmp_path), "--", "python", "train.py"]
    result = CliRunner().invoke(app, [command, "--target", "torch_tpu", *args])
    assert result.exit_code == code
    assert "TorchTPU evidence needs a TPU host" in result.output
    assert "ran" not in result.output


def test_kb_list_and_http_request_take_the_target():
    from pydantic import ValidationError
    from xlaport.serve.http import SuggestRequest

    listed = CliRunner().invoke(app, ["kb", "list", "--target", "torch_tpu"]).output
    listed_codes = {line.split()[0] for line in listed.splitlines() if line.strip()}
    assert "TPU201" in listed_codes and {c for c in listed_codes if c.startswith("XLA")} == SHARED
    request = SuggestRequest.model_validate({"source": "x = 1\n", "options": {"target": "torch_tpu"}})
    assert request.options.target == "torch_tpu"
    with pytest.raises(ValidationError):
        SuggestRequest.model_validate({"source": "x = 1\n", "options": {"target": "cuda"}})


def test_device_values_guards_and_backends_made_far_from_their_use():
    """The nanoGPT idiom on TorchTPU: a config `device = 'cuda'`, a `'cuda' in device` test choosing autocast's
    device type, a per-rank f-string, a `backend` variable and a bf16 probe. Before, all of it stayed CUDA."""
    source = (
        "import torch\nimport torch.distributed as dist\n\n"
        "rank = 0\ndevice = 'cuda'\nbackend = 'nccl'\n"
        "dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'\n"
        "if rank >= 0:\n    dist.init_process_group(backend=backend)\n    device = f'cuda:{rank}'\n"
        "    torch.cuda.set_device(device)\n"
        "device_type = 'cuda' if 'cuda' in device else 'cpu'\n"
        "ctx = torch.autocast(device_type=device_type, dtype=torch.bfloat16)\n"
        "x = torch.zeros(2).to(device)\n"
    )
    result = fix_source(source, "train.py", TPU_RULES)
    assert "device = 'tpu'\nbackend = 'tpu'\n" in result.fixed
    assert "dtype = 'bfloat16' if torch.accelerator.is_available() else 'float16'\n" in result.fixed
    assert "device = f'tpu:{rank}'\n    torch.accelerator.set_device_index(device)" in result.fixed
    assert "device_type = 'tpu' if 'tpu' in device else 'cpu'" in result.fixed
    assert "cuda" not in result.fixed and not result.remaining


def test_cuda_only_apis_and_triton_kernels_are_reported_on_tpu():
    source = "import torch\nimport triton\n\nprint(torch.cuda.max_memory_allocated())\ntorch.cuda.manual_seed(0)\n"
    found = [(f.line, f.code) for f in lint_source(source, rules=TPU_RULES)]
    assert (2, "TPU208") in found and (4, "TPU208") in found and (5, "TPU203") in found
    assert (5, "TPU208") not in found


def test_a_checkpoint_mapped_to_cuda_is_loaded_on_the_cpu():
    source = "import torch\nstate = torch.load('ckpt.pt', map_location='cuda:0')\n"
    assert (
        fix_source(source, "t.py", TPU_RULES).fixed
        == "import torch\nstate = torch.load('ckpt.pt', map_location='cpu')\n"
    )


def test_lora_finetune_fixture_migrates_to_tpu():
    """The alpaca-lora review (bench/results/torchtpu_migrations_2026-12-04.md): before the shared entries and
    TPU102 the torch_tpu run said nothing of the 8-bit bitsandbytes load, the float16 weights or the device left to
    accelerate, and left the cache flush to a human (TPU208); the flush is a no-op without CUDA and goes, the
    rest stays for a human."""
    source = (FIXTURES / "lora_finetune_style.py").read_text()
    result = fix_source(source, "finetune.py", TPU_RULES)
    assert result.fixed == (FIXTURES / "lora_finetune_style.expected.py").read_text()
    assert [(f.line, f.code) for f in result.remaining] == [(15, "XLA312"), (15, "XLA503"), (15, "TPU102")]


def test_device_map_left_to_accelerate_is_reported_on_tpu_but_a_cpu_export_is_not():
    load = "from transformers import AutoModel, pipeline\nm = AutoModel.from_pretrained(name, device_map={})\n"
    for device_map, reported in (('"auto"', True), ('{"": 0}', True), ('{"": "cpu"}', False), ('"cpu"', False)):
        found = [f.code for f in lint_source(load.format(device_map), rules=TPU_RULES)]
        assert (found == ["TPU102"]) is reported, device_map
    on_gpu = lint_source(
        "from transformers import pipeline\np = pipeline('text-generation', device=0)\n", rules=TPU_RULES
    )
    assert [(f.code, "device='tpu'" in f.message) for f in on_gpu] == [("TPU102", True)]
    # torch_xla keeps XLA313 as it was, the CPU export included
    assert [f.code for f in lint_source(load.format('{"": "cpu"}'))] == ["XLA313"]


def test_lint_target_torch_tpu_reports_the_shared_entries(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader\nimport torch.distributed as dist\n\n"
        "dist.init_process_group('nccl')\nloader = DataLoader(ds, num_workers=16)\n"
        "model = model.half()\ntorch.cuda.empty_cache()\ntorch.cuda.set_per_process_memory_fraction(0.8)\n"
        "torch.cuda.reset_peak_memory_stats()\nm = AutoModel.from_pretrained('x', load_in_4bit=True)\n"
    )
    found = CliRunner().invoke(app, ["lint", "--target", "torch_tpu", "--format", "json", str(script)])
    codes = {f["code"] for f in json.loads(found.output)["findings"]}
    assert SHARED <= codes and "TPU701" in codes
    assert "TPU208" not in codes  # the allocator controls are the shared entries', reported once
