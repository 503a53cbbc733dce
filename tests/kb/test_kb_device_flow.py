"""Device values followed through a module (kb/analysis/devices.py), the rules built on it (XLA226–XLA231),
and the scan for CUDA references left silent after a migration (kb/analysis/leftovers.py)."""

from __future__ import annotations

import ast
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from xlaport.kb import fix_source, lint_source
from xlaport.kb.analysis.devices import DeviceAnalysis, key_of
from xlaport.kb.analysis.leftovers import silent_leftovers


def analysis_of(source: str) -> DeviceAnalysis:
    return DeviceAnalysis(cst.parse_module(textwrap.dedent(source)))


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def origins(source: str) -> list[str]:
    return [code(n) for n in analysis_of(source).facts.string_origins]


def fixed(source: str) -> str:
    return fix_source(textwrap.dedent(source)).fixed  # the default: safe fixes only


# --- origins -------------------------------------------------------------------------------------------
def test_config_variable_is_a_device_origin_when_it_reaches_a_consumer():
    src = """\
        import torch
        where = 'cuda'
        note = 'cuda'
        x = torch.zeros(2).to(where)
        """
    assert origins(src) == ["'cuda'"]  # `where` flows to .to(); `note` flows nowhere


def test_device_named_values_are_origins_without_a_consumer_in_sight():
    src = """\
        eval_device = "cuda:1"
        class Cfg:
            device: str = "cuda"
        def build(device="cuda:0"):
            pass
        opts = {"device": "cuda", "label": "cuda"}
        """
    assert origins(src) == ['"cuda:1"', '"cuda"', '"cuda:0"', '"cuda"']  # assignments, defaults, dicts


def test_fstring_format_and_concatenation_origins():
    src = """\
        def pick(rank):
            device = f"cuda:{rank}"
            dev = "cuda:{}".format(rank)
            device_name = "cuda:" + str(rank)
            return device
        """
    assert origins(src) == ['f"cuda:{rank}"', '"cuda:{}".format(rank)', '"cuda:" + str(rank)']


def test_argparse_default_and_choices_of_a_device_flag():
    src = """\
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
        p.add_argument('--run-name', default='cuda')
        """
    assert origins(src) == ["'cuda'", "'cuda'"]


def test_fallback_values_and_the_tests_around_them():
    src = """\
        import os
        device = os.environ.get("DEV", "cuda") or "cpu"
        device_type = "cuda" if "cuda" in device else "cpu"
        """
    # the `"cuda" in device` test is a guard, not an origin
    assert origins(src) == ['"cuda"', '"cuda"']


def test_key_of_reads_attributes_subscripts_and_str():
    exprs = ["args.device", "self.cfg.device", "cfg['device']", "str(device)", "device"]
    assert [key_of(cst.parse_expression(e)) for e in exprs] == ["device"] * 5


# --- ints and backends ------------------------------------------------------------------------------------
def test_ints_used_as_devices():
    src = """\
        import argparse, os, torch
        p = argparse.ArgumentParser()
        p.add_argument('--gpu', type=int)
        args = p.parse_args()
        class T:
            def __init__(self, model, gpu_id: int):
                self.model = model.to(gpu_id)
        local_rank = int(os.environ["LOCAL_RANK"])
        a = torch.zeros(1).to(args.gpu)
        b = torch.device(local_rank)
        c = torch.zeros(1).to(torch.float32)
        d = torch.zeros(1).to(0)
        """
    assert [code(n) for n in analysis_of(src).facts.int_devices] == ["gpu_id", "args.gpu", "local_rank", "0"]


def test_nccl_through_variables_defaults_and_flags():
    src = """\
        import argparse
        import torch.distributed as dist
        backend = 'nccl'
        def setup(backend='nccl'):
            dist.init_process_group(backend)
        argparse.ArgumentParser().add_argument('--dist-backend', default='nccl')
        """
    assert len(analysis_of(src).facts.nccl_origins) == 3


# --- guards ------------------------------------------------------------------------------------------------
def guards(source: str) -> list[tuple[str, bool, bool]]:
    return [(code(g.condition), g.flips, g.quiet) for g in analysis_of(source).facts.guards]


def test_guard_through_a_variable_flips_when_it_protects_the_device_choice():
    src = """\
        import torch
        use_cuda = not args.no_cuda and torch.cuda.is_available()
        device = torch.device("cuda" if use_cuda else "cpu")
        """
    assert guards(src) == [("not args.no_cuda and torch.cuda.is_available()", True, False)]


def test_guard_around_housekeeping_is_quiet():
    src = """\
        import torch
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(1)
        """
    assert guards(src) == [("torch.cuda.is_available()", False, True)]


def test_guard_around_plain_code_is_neither_flipped_nor_quiet():
    src = """\
        import torch
        if torch.cuda.is_available():
            print("on the GPU")
        """
    assert guards(src) == [("torch.cuda.is_available()", False, False)]


def test_string_test_guards():
    src = """\
        device = 'cuda'
        device_type = 'cuda' if 'cuda' in device else 'cpu'
        def get(x):
            if device_type == 'cuda':
                return x.pin_memory().to(device, non_blocking=True)
            return x.to(device)
        """
    assert guards(src) == [("'cuda' in device", True, False), ("device_type == 'cuda'", False, True)]


def test_a_prefix_test_on_the_device_is_a_guard_and_flips_with_its_origin():
    src = """\
        import torch
        device = "cpu"
        if torch.cuda.is_available():
            device = "cuda"
        device_type = "cuda" if device.startswith("cuda") else "cpu"
        name = "cudnn" if backend.startswith("cuda") else "none"
        """
    assert ('device.startswith("cuda")', True, False) in guards(src)
    assert not any("backend" in g[0] for g in guards(src))  # not a device value
    out = fixed(src)
    # before: the origin became "xla" but the test stayed `startswith("cuda")`, so autocast got "cpu"
    assert 'device_type = "xla" if device.startswith("xla") else "cpu"' in out


def test_a_boolean_ifexp_is_its_own_test():
    # PyTorch-GAN style: `cuda = True if torch.cuda.is_available() else False`, then `if cuda: model.cuda()`
    src = """\
        import torch
        cuda = True if torch.cuda.is_available() else False
        off = False if torch.cuda.is_available() else True
        if cuda:
            model.cuda()
        """
    assert guards(src)[0] == ("True if torch.cuda.is_available() else False", True, False)
    out = fixed(src)
    assert "cuda = True\n" in out and "model.to(torch_xla.device())" in out


def test_an_or_is_not_a_guard():
    assert guards("import torch\nif torch.cuda.is_available() or force:\n    x.cuda()\n") == []


# --- rules, default migrate (safe fixes only) ----------------------------------------------------------------
def test_configurator_style_script_is_migrated_at_its_origins():
    out = fixed(
        """\
        import torch
        backend = 'nccl'
        device = 'cuda'
        dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'
        exec(open('override.py').read())
        device_type = 'cuda' if 'cuda' in device else 'cpu'
        ctx = torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
        def get_batch(x):
            if device_type == 'cuda':
                x = x.pin_memory().to(device, non_blocking=True)
            else:
                x = x.to(device)
            return x
        """
    )
    assert "backend = 'xla'" in out and "device = 'xla'" in out
    assert "dtype = 'bfloat16' if xr.is_bf16_supported() else 'float16'" in out
    assert "device_type = 'xla' if 'xla' in device else 'cpu'" in out
    # the pinned copy is CUDA-only and a TPU takes the other branch: left as written
    assert "if device_type == 'cuda':\n        x = x.pin_memory()" in out
    assert "import torch_xla  # noqa: F401\n" in out and "import torch_xla.distributed.xla_backend" in out


def test_accelerator_script_keeps_its_switch():
    out = fixed(
        """\
        import torch
        use_accel = not args.no_accel and torch.accelerator.is_available()
        if use_accel:
            device = torch.accelerator.current_accelerator()
        else:
            device = torch.device("cpu")
        """
    )
    assert "use_accel = not args.no_accel\n" in out
    assert "device = torch_xla.device()" in out and 'device = torch.device("cpu")' in out


def test_if_available_with_device_code_becomes_its_body():
    out = fixed(
        """\
        import torch
        # pick the device
        if torch.cuda.is_available():
            net = net.cuda()
        else:
            print("cpu only")
        """
    )
    assert out.endswith("# pick the device\nnet = net.to(torch_xla.device())\n")


def test_no_rewrite_and_no_finding_in_cuda_only_guarded_code():
    src = textwrap.dedent(
        """\
        import torch
        if torch.cuda.is_available():
            torch.cuda.manual_seed(0)
            torch.cuda.synchronize()
        """
    )
    assert lint_source(src) == []
    assert fix_source(src, unsafe=True).fixed == src


def test_rank_as_device_is_rewritten_at_the_use_and_the_rank_stays():
    out = fixed(
        """\
        import torch
        class Trainer:
            def __init__(self, model, gpu_id: int):
                self.gpu_id = gpu_id
                self.model = model.to(gpu_id)
            def save(self):
                if self.gpu_id == 0:
                    pass
        """
    )
    assert "self.model = model.to(torch_xla.device())" in out and "if self.gpu_id == 0:" in out


# --- silent leftovers -------------------------------------------------------------------------------------
def test_leftover_scan_sees_unowned_references_and_skips_reported_and_dead_ones():
    src = textwrap.dedent(
        """\
        import torch
        x = torch.zeros(1).to(rank)
        y = torch.cuda.memory_allocated()
        z = torch.cuda.max_memory_allocated()
        if torch.cuda.is_available():
            torch.cuda.manual_seed(0)
        """
    )
    from xlaport.kb.finding import Finding

    reported = [Finding("f.py", 4, 1, "XLA999", "C2", "t", "m", "manual")]
    left = silent_leftovers(src, reported)
    assert [(x.line, x.what) for x in left] == [(2, "int used as a device"), (3, "torch.cuda.memory_allocated")]


@pytest.mark.parametrize("name", ["XLA226", "XLA227", "XLA228", "XLA229", "XLA230", "XLA231"])
def test_fixture_has_no_silent_leftover_after_default_fix(name):
    source = (Path(__file__).parent.parent / "fixtures" / "kb" / name / "input.py").read_text()
    result = fix_source(source)
    assert [str(x) for x in silent_leftovers(result.fixed, result.remaining)] == []


# --- end to end: migrated programs run on the XLA device (PJRT_DEVICE=CPU) --------------------------------
PROGRAMS = Path(__file__).parent.parent / "programs" / "devices"


def run_migrated(tmp_path: Path, name: str, *args: str) -> dict[str, str]:
    """Migrates programs/devices/NAME.py with the default (safe) fixes, runs it, returns its `key value` lines."""
    result = fix_source((PROGRAMS / f"{name}.py").read_text())
    assert silent_leftovers(result.fixed, result.remaining) == []
    script = tmp_path / f"{name}.py"
    script.write_text(result.fixed)
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


@pytest.mark.slow
def test_config_variable_script_trains_on_xla_with_bf16_autocast_and_keeps_its_override(tmp_path):
    out = run_migrated(tmp_path, "config_vars")
    assert out["device"] == "xla:0 dtype bfloat16 autocast xla"
    assert run_migrated(tmp_path, "config_vars", "--device=cpu")["device"] == "cpu dtype bfloat16 autocast cpu"


@pytest.mark.slow
def test_accelerator_script_trains_on_xla_and_its_switch_still_selects_the_cpu(tmp_path):
    assert run_migrated(tmp_path, "accel_flag")["device"] == "xla:0"
    assert run_migrated(tmp_path, "accel_flag", "--no-accel")["device"] == "cpu"


@pytest.mark.slow
def test_rank_as_device_trainer_and_its_device_flag(tmp_path):
    out = run_migrated(tmp_path, "rank_device")
    assert out["device"] == "xla:0" and out["eval"] == "xla:0"
    assert run_migrated(tmp_path, "rank_device", "--eval-device", "cpu")["eval"] == "cpu"


@pytest.mark.slow
def test_spawned_nccl_program_runs_under_torch_xla_launch_with_the_xla_process_group(tmp_path):
    out = run_migrated(tmp_path, "spawn_ddp")
    assert out["device"] == "xla:0" and out["world"] == "1"


# --- no silent leftovers on real repositories (read-only checkouts; skipped where they are absent) ----------
CORPUS = Path("/work/corpus")
REAL_TREES = {
    "nanoGPT": ["karpathy__nanoGPT"],
    "minGPT": ["karpathy__minGPT"],
    "examples": [
        f"pytorch__examples/{d}"
        for d in ("mnist", "word_language_model", "dcgan", "imagenet", "mnist_hogwild",
                  "distributed/ddp-tutorial-series", "distributed/minGPT-ddp")
    ],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("repo", sorted(REAL_TREES))
def test_default_migration_of_real_repositories_leaves_no_silent_cuda_reference(repo):
    roots = [CORPUS / r for r in REAL_TREES[repo]]
    if not all(r.is_dir() for r in roots):
        pytest.skip("public checkouts not present")
    silent = []
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        result = fix_source(path.read_text(), str(path))
        ast.parse(result.fixed)
        assert fix_source(result.fixed, str(path)).fixed == result.fixed, f"not idempotent: {path}"
        silent += [f"{path}:{x}" for x in silent_leftovers(result.fixed, result.remaining)]
    assert silent == []


def write_tiny_mnist(root: Path, train: int = 256, test: int = 128) -> None:
    """Random images in the raw idx files torchvision's MNIST reads, so nothing is downloaded."""
    import numpy as np

    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        (raw / f"{name}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        (raw / f"{name}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())


@pytest.mark.slow
def test_pytorch_examples_mnist_migrated_by_default_reaches_l2(tmp_path):
    source = CORPUS / "pytorch__examples" / "mnist" / "main.py"
    if not source.is_file():
        pytest.skip("public checkout not present")
    pytest.importorskip("torchvision")
    work = tmp_path / "mnist"
    work.mkdir()
    result = fix_source(source.read_text())
    assert silent_leftovers(result.fixed, result.remaining) == []
    (work / "main.py").write_text(result.fixed)
    write_tiny_mnist(tmp_path / "data")
    xlaport = Path(sys.executable).with_name("xlaport")
    argv = [str(xlaport), "check", "main.py", "--workdir", str(work), "--format", "json", "--timeout", "400"]
    argv += ["--", "--epochs", "1", "--batch-size", "64", "--test-batch-size", "64"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=work, env={**os.environ, "PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout)
    # on the XLA device: graphs compiled, nothing fell back to or stayed on the CPU
    assert report["exit_code"] == 0 and report["compiles_total"] > 0, report
    assert report["fallback_ops"] == {} and report["params_off_device"] == []
    # with the barrier the step analysis places (issue 9 item 3): really runs on the XLA device
    assert report["level"] == "L2", report["reasons"]


# --- distributed: certain where the module launches one process per device ---------------------------------
def test_spawn_with_the_gpu_count_becomes_torch_xla_launch_by_default_with_the_xla_backend():
    src = """\
        import torch
        import torch.multiprocessing as mp
        from torch.distributed import init_process_group
        def worker(rank, world_size):
            init_process_group(backend="nccl", rank=rank, world_size=world_size)
        if __name__ == "__main__":
            world_size = torch.cuda.device_count()
            mp.spawn(worker, args=(world_size,), nprocs=world_size)
        """
    out = fixed(src)
    assert 'init_process_group(backend="xla", rank=rank, world_size=world_size, init_method="xla://")' in out
    # counting before the launch would start the runtime too early: the launched worker reads the world size
    assert "torch_xla.launch(worker, args=())" in out
    assert "def worker(rank):\n    world_size = xr.world_size()\n" in out
    assert "device_count" not in out and lint_source(out) == []


def test_spawn_with_a_user_count_stays_an_unsafe_fix():
    src = """\
        import torch.multiprocessing as mp
        from torch.distributed import init_process_group
        def worker(rank):
            init_process_group("nccl")
        mp.spawn(worker, nprocs=args.procs)
        """
    assert fixed(src) == textwrap.dedent(src)
    assert {(f.code, f.fix, f.fixable) for f in lint_source(textwrap.dedent(src))} == {
        ("XLA223", "unsafe", True),
        ("XLA225", "unsafe", True),
    }


def test_checkpoint_loaded_onto_the_device_held_by_a_variable_is_moved_after_a_cpu_load():
    src = """\
        import torch
        device = 'cuda'
        state = torch.load('ckpt.pt', map_location=device)
        """
    out = fixed(src)
    assert "device = 'xla'" in out
    # loaded on the CPU, every tensor moved to the device the name holds (XLA is no map_location)
    assert (
        "state = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), "
        "torch.load('ckpt.pt', map_location=\"cpu\"))" in out
    )
    assert not [f for f in lint_source(out) if f.code == "XLA711"]


def test_string_fallback_stays_a_string():
    src = "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\nkind = 'cuda' if 'cuda' in device else 'cpu'\n"
    # `kind` is no device name and flows to no consumer: its test keeps asking for CUDA (False on a TPU host)
    assert "device = 'xla'\nkind = 'cuda' if 'cuda' in device else 'cpu'\n" in fixed(src)
    src = src.replace("kind =", "device_type =")
    assert "device = 'xla'\ndevice_type = 'xla' if 'xla' in device else 'cpu'\n" in fixed(src)


def test_backend_fallback_to_gloo_flips_and_plain_fstring_device_is_an_origin():
    out = fixed(
        """\
        import torch as th
        import torch.distributed as dist
        backend = "gloo" if not th.cuda.is_available() else "nccl"
        dist.init_process_group(backend=backend)
        def dev():
            if th.cuda.is_available():
                return th.device(f"cuda")
            return th.device("cpu")
        """
    )
    assert 'backend = "xla"\n' in out and 'return th.device("xla")' in out
