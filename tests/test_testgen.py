"""Generated differential tests (xlaport.eval.testgen) and the CUDA→CPU shim they run the original with."""

import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from xlaport.eval import cuda_to_cpu
from xlaport.eval.sandbox import run_sandboxed
from xlaport.eval.testgen import (
    TOLERANCES,
    DifferentialResult,
    SourcePair,
    Target,
    TestgenError,
    compare_values,
    find_targets,
    generate_tests,
    randn,
    render_test_file,
    run_generated_tests,
)
from xlaport.eval.testgen.generate import _write
from xlaport.eval.testgen.worker.probe import probe_function, probe_module

from xlaport.cli import app

PROGRAMS = Path(__file__).parent / "programs"
ORIGINAL = PROGRAMS / "testgen_original"
MIGRATED = PROGRAMS / "testgen_migrated"
FAULTY = PROGRAMS / "testgen_faulty"

ORIGINAL_SOURCE = '''
import torch.nn as nn

def same(x):
    """Doc."""
    return x + 1

def changed(x):
    return x.cuda() * 2

async def fetch():
    return 1

class Net(nn.Module):
    def forward(self, x):
        return x.cuda()

class Deeper(Net):
    def forward(self, x):
        return x.half()

class Config:
    device = "cuda"

def _private(x):
    return x
'''

MIGRATED_SOURCE = '''
import torch.nn as nn
import torch_xla

def same(x):
    """A different docstring is not a change."""
    return x + 1

def changed(x):
    return x.to(torch_xla.device()) * 2

async def fetch():
    return 2

class Net(nn.Module):
    def forward(self, x):
        return x.to(torch_xla.device())

class Deeper(Net):
    def forward(self, x):
        return x.to(torch.bfloat16)

class Config:
    device = "xla"

def _private(x):
    return x
'''


def test_find_targets_lists_changed_functions_and_modules():
    targets = {t.name: t for t in find_targets(ORIGINAL_SOURCE, MIGRATED_SOURCE)}
    assert set(targets) == {"changed", "fetch", "Net", "Deeper", "Config"}
    assert targets["changed"].kind == "function"
    assert targets["Net"].kind == "module" and targets["Deeper"].kind == "module"  # a module through its base
    assert targets["Deeper"].precision == "bfloat16" and targets["Net"].precision == "float32"
    assert targets["fetch"].kind == "other" and "async" in targets["fetch"].reason
    assert targets["Config"].kind == "other" and "not an nn.Module" in targets["Config"].reason


def test_find_targets_all_public_includes_unchanged_and_skips_private():
    names = {t.name for t in find_targets(ORIGINAL_SOURCE, MIGRATED_SOURCE, all_public=True)}
    assert "same" in names and "_private" not in names


def test_compare_values_is_dtype_aware_and_says_what_differs():
    x = torch.linspace(-3, 3, 50)
    assert compare_values(x, x.to(torch.bfloat16), TOLERANCES) is None  # bf16 rounding is within bf16 tolerance
    assert compare_values(x, x * (1 + 1e-3), TOLERANCES) is not None  # the same error at fp32 is not
    message = compare_values(x, x.clone().index_fill_(0, torch.tensor([7]), 9.0), TOLERANCES)
    assert "1 of 50 values" in message and "at (7,)" in message and "9 (migrated)" in message
    assert "shape (50,) (original) vs (49,) (migrated)" in compare_values(x, x[1:], TOLERANCES)
    assert "integer values differ" in compare_values(torch.arange(4), torch.tensor([0, 1, 2, 4]), TOLERANCES)
    # a declared bf16 computation loosens an fp32 comparison
    assert compare_values(x, x * (1 + 1e-3), TOLERANCES, precision="bfloat16") is None


def test_compare_values_holds_small_values_to_the_tensors_scale():
    # a gradient summed over a batch: a near-zero entry carries the rounding of the large terms it came from
    x = torch.tensor([54.3354, -12.0, 0.004])
    assert compare_values(x, x + torch.tensor([3e-5, 1e-5, 3e-5]), TOLERANCES) is None
    # a value off by about its own size still fails, and the message points at it, not at the largest diff
    wrong = x + torch.tensor([3e-4, 0.0, 0.9])
    message = compare_values(x, wrong, TOLERANCES)
    assert "1 of 3 values" in message and "worst at (2,)" in message, message
    # NaN and infinities in the same places agree
    special = torch.tensor([float("nan"), float("inf"), 1.0])
    assert compare_values(special, special.clone(), TOLERANCES) is None


def test_differential_result_names_each_differing_value():
    original = {
        "outputs": {"output[0]": torch.ones(3), "output[1]": 2.0},
        "grads": {"grad[w]": torch.ones(2)},
        "error": None,
    }
    migrated = {"outputs": {"output[0]": torch.ones(3), "output[1]": 2.5}, "grads": {}, "error": None}
    result = DifferentialResult("f", original, migrated)
    problems = result.mismatches()
    assert problems == ["output[1]: 2.0 (original) vs 2.5 (migrated)", "grad[w]: only the original produced it"]
    with pytest.raises(AssertionError, match=r"differs from the original in 2 value"):
        result.assert_close()
    crashed = DifferentialResult("f", original, {"outputs": {}, "grads": {}, "error": "RuntimeError: boom"})
    assert crashed.mismatches() == ["MIGRATED raised RuntimeError: boom"]
    DifferentialResult("f", original, original).assert_close()


def test_rendered_test_file_is_valid_python_with_inputs_and_tolerances_visible(tmp_path):
    pair = SourcePair("model.py", ORIGINAL / "model.py", MIGRATED / "model.py", ORIGINAL, MIGRATED, "model", "model")
    text = render_test_file(
        pair,
        tmp_path,
        [("test_MLP", Target("MLP", "module", precision="bfloat16"), {"args": [randn(4, 16)]}, "first layer")],
        [],
        seed=0,
    )
    compile(text, "test_generated.py", "exec")
    assert "Inputs(args=[randn(4, 16)])" in text and "TOLERANCES = {" in text
    assert 'precision="bfloat16"' in text and "def test_MLP(results):" in text


def test_module_with_required_constructor_arguments_is_not_drivable():
    class Head(torch.nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.fc = torch.nn.Linear(cfg.n, 2)

    assert "constructor needs argument(s) cfg" in probe_module(Head, 0)["reason"]


def test_probe_synthesizes_module_inputs_from_the_first_layer():
    class Tagger(torch.nn.Module):
        def __init__(self, vocab: int = 50):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, 8)
            self.out = torch.nn.Linear(8, 3)

        def forward(self, ids, labels):
            return torch.nn.functional.cross_entropy(self.out(self.emb(ids)).flatten(0, 1), labels.flatten())

    found = probe_module(Tagger, 0)
    assert [(a["__xlaport__"], a["high"], a["shape"]) for a in found["inputs"]["args"]] == [
        ("randint", 50, [2, 8]),
        ("randint", 3, [2, 8]),
    ]


def test_probe_says_which_call_on_synthesized_inputs_raised():
    def needs_a_pair(x):
        raise ValueError("wants a pair")

    class Picky(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("wrong shape")

    assert probe_function(needs_a_pair) == {
        "reason": "calling it with synthesized inputs (randn(4, 8)) raised ValueError: wants a pair "
        "(record a real run with --record)"
    }
    assert probe_module(Picky, 0) == {
        "reason": "forward(randn(4, 8)) on synthesized inputs raised RuntimeError: wrong shape "
        "(record a real run with --record)"
    }


def test_shim_maps_cuda_to_the_cpu_in_process():
    cuda_to_cpu.install()
    try:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.ones(2).cuda().device.type == "cpu" and torch.ones(2).to("cuda:0").device.type == "cpu"
        model = torch.nn.Linear(3, 3).cuda()
        with torch.autocast("cuda", dtype=torch.float16):  # fp16 autocast → fp32 on the CPU
            assert model(torch.randn(2, 3)).dtype == torch.float32
        with torch.autocast("cuda", dtype=torch.bfloat16):  # bf16 autocast → CPU bf16 autocast
            assert model(torch.randn(2, 3)).dtype == torch.bfloat16
        scaler = torch.cuda.amp.GradScaler()
        loss = model(torch.randn(2, 3)).sum()
        assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
        assert torch.device("cuda", 0) == torch.device("cpu", 0)  # a name and an index (DataParallel's form)
        parallel = torch.nn.DataParallel(model, device_ids=range(torch.cuda.device_count()))
        assert parallel(torch.randn(2, 3)).shape == (2, 3) and parallel.module is model
    finally:
        cuda_to_cpu.uninstall()
    assert torch.zeros(1).device.type == "cpu" and not torch.cuda.is_available()


def test_shim_builds_legacy_cuda_tensor_types_on_the_cpu():
    """`Tensor = torch.cuda.FloatTensor if CUDA else torch.FloatTensor` (sequence-labelling and GAN code of the
    0.4 era): the shim said CUDA is available, then the legacy type raised for want of a driver, so such an
    original could never be the reference."""
    cuda_to_cpu.install()
    try:
        rows = torch.cuda.LongTensor([[1, 2], [3, 4]])
        assert rows.dtype == torch.int64 and rows.device.type == "cpu"
        assert torch.cuda.FloatTensor(3).fill_(0.5).tolist() == [0.5, 0.5, 0.5]
        assert torch.ones(2, dtype=torch.int32).type(torch.cuda.FloatTensor).dtype == torch.float32
    finally:
        cuda_to_cpu.uninstall()
    assert torch.cuda.FloatTensor is not torch.FloatTensor  # undone


def test_shim_runs_a_data_parallel_model():
    """`nn.DataParallel(model).cuda()` (CIFAR trainers): DataParallel builds `torch.device("cuda", 0)` and checks the
    GPUs' memory balance; under the shim both are the CPU's (a reference run died of TypeError, then of
    ZeroDivisionError)."""
    cuda_to_cpu.install()
    try:
        model = torch.nn.DataParallel(torch.nn.Linear(3, 2)).cuda()
        assert model(torch.randn(4, 3).cuda()).shape == (4, 2)
        assert torch.device("cuda", 0).type == "cpu"
    finally:
        cuda_to_cpu.uninstall()


def test_bad_input_gets_a_clear_error(tmp_path):
    with pytest.raises(TestgenError, match="no such file"):
        generate_tests(tmp_path / "missing.py", MIGRATED, tmp_path / "out")
    with pytest.raises(TestgenError, match="--record must be"):
        generate_tests(ORIGINAL, MIGRATED, tmp_path / "out", record="bash train.sh")
    result = CliRunner().invoke(
        app, ["testgen", str(tmp_path / "missing"), str(MIGRATED), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "no such file" in result.output


def test_rewriting_a_generated_file_keeps_a_backup(tmp_path):
    written = []
    path = tmp_path / "test_xlaport_model.py"
    _write(path, "first\n", written)
    _write(path, "second\n", written)
    assert path.read_text() == "second\n" and (tmp_path / "test_xlaport_model.py.xlaport.bak").read_text() == "first\n"
    _write(path, "third\n", written)  # a later rewrite keeps the first backup and adds another
    assert (tmp_path / "test_xlaport_model.py.xlaport.bak").read_text() == "first\n"
    assert (tmp_path / "test_xlaport_model.py.xlaport.1.bak").read_text() == "second\n"


@pytest.mark.slow
def test_shim_runs_a_cuda_script_on_the_cpu():
    run = run_sandboxed(
        [sys.executable, "-m", "xlaport.eval.cuda_to_cpu", str(PROGRAMS / "testgen_cuda_script.py"), "--steps", "2"],
        timeout_s=300,
        env={"USE_TORCH_XLA": "0", "OMP_NUM_THREADS": "1"},
    )
    assert run.ok, run.describe_failure()
    assert "step 1 loss" in run.stdout and "step 2" not in run.stdout  # sys.argv reached the script
    assert "dtype torch.float32 device cpu" in run.stdout  # fp16 autocast ran as fp32 on the CPU
    assert "scale 1.0" in run.stdout  # the GradScaler is disabled


@pytest.mark.slow
def test_correct_migration_with_recorded_inputs_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "generated"
    result = generate_tests(ORIGINAL, MIGRATED, out, record="python train.py --steps 1")
    inputs_from = {t.target: t.inputs_from for t in result.tests}
    assert inputs_from == {"MLP": "recorded", "loss_fn": "recorded", "scale_": "synthesized"}
    reasons = {u.target: u.reason for u in result.undrivable}
    assert "cannot synthesize argument 'path'" in reasons["load_shard"]  # listed, never skipped silently
    assert "not an nn.Module" in reasons["Config"]
    text = (out / "test_xlaport_model.py").read_text()
    assert "load_shard: cannot synthesize" in text and "load_shard" in (out / "README.md").read_text()
    assert (out / "testgen_inputs" / "model.MLP.pt").exists()
    assert not (ORIGINAL / "last_loss.txt").exists()  # the recorded run ran on a copy of the tree
    run = run_generated_tests(out)
    assert (run.passed, run.failed, run.errors) == (3, 0, 0), run.output_tail
    assert run.ok


@pytest.mark.slow
def test_planted_faults_fail_and_say_which_value_differed(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "generated"
    generate_tests(ORIGINAL, FAULTY, out)
    run = run_generated_tests(out)
    assert (run.passed, run.failed) == (0, 3), run.output_tail
    messages = {f.test.rsplit("::", 1)[-1]: f.message for f in run.failures}
    assert "output: 20 of 20 values outside" in messages["test_MLP"]  # the cast to int
    assert "grad[fc2.weight]" in messages["test_MLP"]
    assert "output: 1 of 1 values outside rtol=0.0001" in messages["test_loss_fn"]  # the dropped term
    assert "args[0] after the call" in messages["test_scale_"]  # the changed constant of an in-place update


@pytest.mark.slow
def test_script_objects_are_recorded_and_replayed_from_the_project_root(tmp_path, monkeypatch):
    """The model and step function of a script run as __main__ (its model and optimizer are arguments),
    a module-level file read relative to the project root, and a module that downloads while imported."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "generated"
    original, migrated = PROGRAMS / "testgen_script_original", PROGRAMS / "testgen_script_migrated"
    result = generate_tests(original, migrated, out, record="python run.py --steps 2", changed_files=True)
    assert {t.target: t.inputs_from for t in result.tests} == {"Net": "recorded", "train_step": "recorded"}
    reasons = {u.target: u.reason for u in result.undrivable}
    assert "network access is blocked" in reasons["normalize"]
    assert any(n.startswith("module fetch_data could not be imported") for n in result.notes), result.notes
    text = (out / "test_xlaport_run.py").read_text()
    assert "argv=('run.py', '--steps', '2')" in text
    run = run_generated_tests(out)
    assert (run.passed, run.failed, run.errors) == (2, 0, 0), run.output_tail
    assert sorted(p.name for p in original.iterdir()) == ["fetch_data.py", "run.py", "scale.txt"]  # nothing written
