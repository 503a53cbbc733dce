"""Training data, batches and the XLA training loop (tiny sizes; real torch_xla on PJRT_DEVICE=CPU)."""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from xlaport.model.prompts import join_target, split_target
from xlaport.model.spans import imports_used
from xlaport.training.configs import get_size
from xlaport.training.corpus import Function, extract_functions, split_of
from xlaport.training.dataset import (
    IGNORE_INDEX,
    build_dataset,
    encode_trace,
    load_dataset,
    lora_batches,
    pretrain_batches,
    save_dataset,
)
from xlaport.training.loop import LoopConfig
from xlaport.training.traces import (
    INJECTIONS,
    Trace,
    injected_trace,
    lint_many,
    recorded_traces,
    rule_trace,
)

CORPUS = Path(__file__).parent / "fixtures" / "training_corpus" / "corpus"
TINY = get_size("tiny")


def _fn(source: str, imports: str = "import torch\n", file: str = "pkg/mod.py") -> Function:
    return Function(file=file, name="f", source=textwrap.dedent(source), imports=imports)


# --- corpus -----------------------------------------------------------------------------------------
def test_extract_functions_dedents_methods_keeps_decorators_and_used_imports():
    source = textwrap.dedent(
        """
        from __future__ import annotations
        import os
        import torch
        from torch import nn
        from .local import helper


        class Net(nn.Module):
            @torch.no_grad()
            def forward(self, x):
                y = torch.relu(x)
                return helper(y)


        def short(x):
            return x
        """
    )
    functions = extract_functions(source, "pkg/net.py")
    assert [f.name for f in functions] == ["Net.forward"]  # `short` has fewer than 3 lines
    method = functions[0]
    assert method.source.startswith("@torch.no_grad()\ndef forward(self, x):\n    y = torch.relu(x)")
    # only imports the function uses; never relative or __future__ imports
    assert method.imports == "import torch\n"
    assert imports_used(source, method.source) == "import torch\n"


def test_split_is_fixed_by_file_name():
    assert split_of("corpus/augment.py") == "test"
    assert split_of("corpus/train_loop.py") == "val"
    assert split_of("corpus/layers.py") == "train"
    splits = [split_of(f"pkg/file_{i}.py") for i in range(2000)]
    assert 0.75 < splits.count("train") / 2000 < 0.85
    assert 0.07 < splits.count("test") / 2000 < 0.13


# --- traces -----------------------------------------------------------------------------------------
CLEAN = '''
def step(model, batch, optimizer):
    """One step."""
    x = torch.zeros(4, 8)
    loss = model(x + batch).sum()
    loss.backward()
    return loss
'''

EXPECTED_TEXT = {
    "cuda_method": "torch.zeros(4, 8).cuda()",
    "device_string": 'device="cuda"',
    "synchronize": "torch.cuda.synchronize()\n    return loss",
    "cudnn_benchmark": '"""One step."""\n    torch.backends.cudnn.benchmark = True',
    "autocast": "with ",
    "grad_scaler": "scaler.scale(loss).backward()",
    "memory_report": "torch.cuda.",
    "empty_cache": "torch.cuda.empty_cache()",
    "set_device": "torch.cuda.set_device(0)",
}


@pytest.mark.parametrize("kind", sorted(INJECTIONS))
def test_each_injection_adds_its_cuda_ism_and_still_parses(kind):
    import libcst as cst

    module = cst.parse_module(textwrap.dedent(CLEAN))
    injected = INJECTIONS[kind](module, random.Random(0))
    assert injected is not None
    code = injected.code
    compile(code, "<injected>", "exec")
    assert EXPECTED_TEXT[kind] in code
    assert code != module.code


def test_injected_trace_targets_the_clean_function_and_carries_the_kb_codes():
    fn = _fn(CLEAN, imports="")
    trace = injected_trace(fn, random.Random(3))
    assert trace is not None and trace.kind == "injected"
    assert trace.target == fn.source
    assert trace.original != fn.source and "cuda" in trace.original
    assert trace.imports.startswith("import torch\n")  # the injected code needs it
    assert trace.codes, "the kb detects the injected CUDA-isms"


def test_rule_trace_is_the_rules_migration_with_the_imports_it_added():
    fn = _fn(
        """
        def to_device(batch):
            inputs = batch["inputs"].cuda()
            return inputs
        """
    )
    trace = rule_trace(fn)
    assert trace is not None and trace.codes == ["XLA201"]
    imports, function = split_target(trace.target)
    assert imports == ["import torch_xla"]
    assert 'batch["inputs"].to(torch_xla.device())' in function
    assert function.startswith("def to_device(batch):")
    # a clean function gives no rule trace
    assert rule_trace(_fn("def f(x):\n    y = torch.relu(x)\n    return y\n")) is None


def test_lint_many_gives_each_module_its_own_findings_with_its_own_lines():
    from xlaport.kb import lint_source

    modules = [
        "import torch\n\ndef a(x):\n    return x.cuda()\n",
        "import torch\n\ndef b(x):\n    y = x + 1\n    return y\n",
        "import torch\n\ndef c(x):\n    torch.cuda.synchronize()\n    return torch.zeros(2, device='cuda')\n",
    ]
    together = lint_many(modules)
    alone = [lint_source(m) for m in modules]
    assert [[(f.code, f.line, f.column) for f in fs] for fs in together] == [
        [(f.code, f.line, f.column) for f in fs] for fs in alone
    ]
    assert together[1] == [] and together[0] and together[2]
    assert lint_many(["def broken(:\n"]) == [None]


def test_lint_many_labels_a_function_without_its_neighbours():
    # Linted in one module, `torch.nonzero` after a function that moves data to "cuda" got XLA411
    # (data-dependent shape on the device); alone it has no finding, and its label must not depend
    # on which functions happen to be linted with it.
    to_cuda = 'import torch\n\ndef a(x):\n    return x.to("cuda")\n'
    nonzero = "import torch\n\ndef b(x):\n    return torch.nonzero(x)\n"
    assert lint_many([nonzero]) == [[]]
    assert lint_many([to_cuda, nonzero])[1] == []
    assert [f.code for f in lint_many([to_cuda, nonzero])[0]] == ["XLA202"]


def test_edit_scripts_round_trip_and_refuse_what_does_not_fit():
    from xlaport.model.prompts import EditError, apply_edit_script, edit_script

    original = "def f(x):\n    torch.cuda.synchronize()\n    y = x.cuda()\n    return y\n"
    migrated = "def f(x):\n    y = x.to(torch_xla.device())\n    z = 1\n    return y\n"
    target = join_target(["import torch_xla"], migrated)
    script = edit_script(original, target)
    assert script == (
        "import torch_xla\n-    torch.cuda.synchronize()\n-    y = x.cuda()\n+    y = x.to(torch_xla.device())\n+    z = 1\n"
    )
    assert apply_edit_script(original, script) == (["import torch_xla"], migrated)
    inserted = "def f(x):\n    setup()\n    torch.cuda.synchronize()\n    y = x.cuda()\n    return y\n"
    assert apply_edit_script(original, edit_script(original, inserted))[1] == inserted
    assert apply_edit_script(original, "")[1] == original
    with pytest.raises(EditError, match="does not match"):
        apply_edit_script(original, "-    y = x.cpu()\n+    y = x\n")
    with pytest.raises(EditError, match="before any"):
        apply_edit_script(original, "+    y = x\n")
    with pytest.raises(EditError, match="neither an edit nor an import"):
        apply_edit_script(original, "-    y = x.cuda()\n+    y = x\nreturn y\n")


def test_target_join_and_split_round_trip():
    target = join_target(["import torch_xla", "import torch_xla.core.xla_model as xm"], "def f():\n    pass\n")
    assert split_target(target) == (
        ["import torch_xla", "import torch_xla.core.xla_model as xm"],
        "def f():\n    pass\n",
    )
    assert split_target("@dec\ndef g():\n    pass\n") == ([], "@dec\ndef g():\n    pass\n")


def test_recorded_traces_read_the_records_migrate_writes(tmp_path):
    from xlaport.trace import TraceRecord, TraceValidation, append_records

    def record(unit, function, original, migrated, status="validated", **extra):
        return TraceRecord(
            run_id="r1",
            time="2026-01-01T00:00:00+00:00",
            src="/proj",
            path="train.py",
            unit=unit,
            function=function,
            original=original,
            migrated=migrated,
            patch="",
            codes_applied=extra.get("codes", []),
            codes_left=[],
            proposed_by=["rules"],
            validation=TraceValidation(status=status, level="L2"),
        )

    original = "    def step(self, x):\n        return x.cuda()\n"
    migrated = "    def step(self, x):\n        return x.to(torch_xla.device())\n"
    records = [
        record("file", None, "import torch\n", "import torch_xla\n"),
        record("function", "Net.step", original, migrated, codes=["XLA201"]),
        record("function", "bad", original.replace("step", "bad"), migrated.replace("step", "bad"), "rejected"),
        record("function", "<module>", "x = 1\n", "x = 2\n"),
        record("function", "gone", "def gone():\n    return 1\n", ""),
        record("function", "unvalidated", "def g():\n    return 1\n", "def g():\n    return 2\n", "unvalidated"),
    ]
    path = tmp_path / "traces.jsonl"
    append_records(records, path)
    with path.open("a", encoding="utf-8") as handle:  # a torn line and an older schema are skipped
        handle.write('{"schema": "xlaport.trace/0", "unit": "function"}\n{broken json\n')
    traces = list(recorded_traces(path))
    assert [t.name for t in traces] == ["Net.step", "unvalidated"]
    step = traces[0]
    assert step.kind == "recorded" and step.validated is True and step.codes == ["XLA201"]
    assert step.original == "def step(self, x):\n    return x.cuda()\n"  # dedented
    assert traces[1].target == "def g():\n    return 2\n" and traces[1].validated is None
    assert list(recorded_traces(tmp_path / "missing.jsonl")) == []


def test_train_data_takes_accepted_candidates_and_says_what_they_added(tmp_path, monkeypatch):
    """The flywheel: model rewrites that a program run accepted (bench/model_evidence.py --accepted) become
    training traces of their own kind, in the train split; rules' records and unvalidated or rejected proposals
    in the same file do not."""
    from xlaport.cli import app
    from xlaport.trace import TraceRecord, TraceValidation, append_records

    def record(function, proposed_by, status):
        original = (
            f"def {function}(model, x, log):\n    loss = model(x)\n    log.append(loss.item())\n    return loss\n"
        )
        migrated = (
            f"def {function}(model, x, log):\n    loss = model(x)\n    log.append(loss.detach())\n    return loss\n"
        )
        return TraceRecord(
            run_id="r",
            time="2026-12-03T00:00:00Z",
            src="owner/repo@0123456789ab",
            path="train.py",
            unit="function",
            function=function,
            original=original,
            migrated=migrated,
            patch="",
            codes_applied=["XLA401"],
            codes_left=[],
            proposed_by=proposed_by,
            validation=TraceValidation(status=status, level="L2", command="python train.py"),
        )

    accepted = tmp_path / "accepted.jsonl"
    append_records(
        [
            record("kept_step", ["model:lora-cpu"], "validated"),
            record("rules_step", ["rules"], "validated"),
            record("unjudged_step", ["model:lora-cpu"], "unvalidated"),
            record("failed_step", ["model:lora-cpu"], "rejected"),
        ],
        accepted,
    )
    monkeypatch.setenv("XLAPORT_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "no-traces.jsonl"))
    out = tmp_path / "data"
    args = ["train", "data", "--size", "tiny", "--corpus", str(CORPUS), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--accepted", str(accepted)])
    assert result.exit_code == 0, result.output
    assert "accepted candidates added: 1" in result.output
    assert "kept_step (XLA401; train)" in result.output
    dataset = load_dataset(out)
    kept = [t for t in dataset.traces if t.kind == "accepted"]
    assert [(t.name, t.split, t.validated) for t in kept] == [("kept_step", "train", True)]
    assert "loss.detach()" in kept[0].target and ".item()" in kept[0].original
    assert dataset.meta["accepted_sources"] == [str(accepted)]

    result = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "again"), "--accepted", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2 and "no such trace file" in result.output


# --- tokenizer and batches -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    from xlaport.training.tokenizer import train_tokenizer

    texts = [p.read_text() for p in sorted(CORPUS.glob("*.py"))]
    return train_tokenizer(texts, vocab_size=400)


def _trace(original: str, target: str, codes=("XLA201",)) -> Trace:
    return Trace(kind="injected", file="x.py", name="f", original=original, target=target, codes=list(codes))


def test_encode_trace_trains_only_on_the_target(tokenizer):
    trace = _trace("def f(x):\n    return x.cuda()\n", "def f(x):\n    return x\n")
    ids, prompt_len = encode_trace(tokenizer, trace, 512)
    assert ids[-1] == tokenizer.eos_token_id
    target = tokenizer.decode(ids[prompt_len:], skip_special_tokens=True)
    assert target == "-    return x.cuda()\n+    return x\n"  # the edit script, not the whole function
    assert "XLA201" in tokenizer.decode(ids[:prompt_len])  # the kb entry is in the prompt
    # a budget too small for the fixes drops them before dropping the example
    short = encode_trace(tokenizer, trace, prompt_len - 1 + len(ids) - prompt_len)
    assert short is not None and "XLA201" not in tokenizer.decode(short[0][: short[1]])
    assert encode_trace(tokenizer, trace, 8) is None


def test_lora_batches_have_fixed_shapes_and_warm_up_every_bucket_first(tokenizer):
    short = _trace("def f(x):\n    return x.cuda()\n", "def f(x):\n    return x\n")
    body = "".join(f"    y{i} = torch.zeros({i}, device='cuda')\n" for i in range(12))
    long = _trace(
        f"def g(x):\n{body}    return x\n", f"def g(x):\n{body.replace(', device=' + repr('cuda'), '')}    return x\n"
    )
    lengths = [len(encode_trace(tokenizer, t, 1024)[0]) for t in (short, long)]
    buckets = (max(lengths[0], 64), max(lengths) + 8)
    assert lengths[1] > buckets[0], "the long trace needs the second bucket"
    batches = lora_batches(tokenizer, [short, long], buckets, batch_size=3, steps=9, seed=1)
    assert len(batches) == 9
    shapes = [tuple(t.shape) for t in batches.input_ids]
    assert set(shapes) == {(3, buckets[0]), (3, buckets[1])}
    # step 0 compiles without optimizer state; then each bucket once with it
    assert batches.warmup_steps == 3
    assert shapes[:3] == [(3, buckets[0]), (3, buckets[0]), (3, buckets[1])]
    for ids, labels in zip(batches.input_ids, batches.labels, strict=True):
        pad = ids == tokenizer.pad_token_id
        assert (labels[pad] == IGNORE_INDEX).all()
        assert (labels != IGNORE_INDEX).any(dim=1).all()
    # a longer job starts with the same batches (a resumed job with more --steps prepares them again)
    longer = lora_batches(tokenizer, [short, long], buckets, batch_size=3, steps=14, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(batches.input_ids, longer.input_ids[:9], strict=True))


def test_pretrain_batches_are_full_blocks(tokenizer):
    texts = [p.read_text() for p in sorted(CORPUS.glob("*.py"))]
    batches = pretrain_batches(tokenizer, texts, block=64, batch_size=2, steps=5)
    assert [tuple(t.shape) for t in batches.input_ids] == [(2, 64)] * 5
    assert batches.labels == [None] * 5 and batches.warmup_steps == 2
    with pytest.raises(ValueError, match="too small"):
        pretrain_batches(tokenizer, ["x = 1"], block=64, batch_size=2, steps=1)


def test_learning_rate_schedule_stays_positive_and_bounded():
    config = LoopConfig(steps=100, lr=1e-3, warmup_steps=10)
    rates = [config.lr_at(s) for s in range(100)]
    assert all(0 < r <= 1e-3 for r in rates)
    assert rates[0] < rates[9] and rates[-1] == pytest.approx(1e-4, rel=0.05)


# --- the dataset ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_dataset_is_deduplicated_split_by_file_and_keeps_test_functions_out_of_training(tmp_path):
    dataset = build_dataset([CORPUS], TINY)
    assert dataset.meta["traces"]["train"]["rules"] >= 3 and dataset.meta["traces"]["train"]["injected"] >= 8
    test_sources = {fn.source for split, fn in dataset.functions if split == "test"}
    assert test_sources, "corpus/augment.py is in the test split"
    assert not test_sources & set(dataset.texts("train"))
    for trace in dataset.traces:
        assert trace.split == split_of(trace.file)
    train_files = {t.file for t in dataset.split_traces("train")}
    assert not train_files & {t.file for t in dataset.split_traces("test")}
    keys = [" ".join(t.original.split()) for t in dataset.traces]
    assert len(keys) == len(set(keys))
    save_dataset(dataset, tmp_path / "ds")
    again = load_dataset(tmp_path / "ds")
    assert [t.to_dict() for t in again.traces] == [t.to_dict() for t in dataset.traces]
    assert again.functions == dataset.functions


# --- training --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory, tokenizer):
    """A random-init tiny base model saved like `xlaport train base` saves one."""
    from xlaport.training.workflow import new_base_model

    directory = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    model = new_base_model(TINY, tokenizer)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.mark.slow
def test_base_pretraining_on_xla_compiles_once_per_graph_and_falls_back_never(tiny_base, tokenizer):
    from transformers import AutoModelForCausalLM
    from xlaport.training.loop import move_model, train

    texts = [p.read_text() for p in sorted(CORPUS.glob("*.py"))]
    batches = pretrain_batches(tokenizer, texts, block=64, batch_size=2, steps=5)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_base))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = train(model, batches, LoopConfig(steps=5, lr=1e-3, warmup_steps=1, log_every=1), log=lambda m: None)
    assert result.device.startswith("xla")
    assert result.compiles == 2  # step 0 without optimizer state, step 1 with it
    assert result.compiles_after_warmup == 0
    assert result.fallback_ops == {}
    assert sorted(result.losses) == [0, 1, 2, 3, 4]
    # the tied embedding stayed tied on the device (moving to XLA unties it; lm_head would train alone)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    move_model(model, "cpu")
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before)


@pytest.mark.slow
def test_training_resumes_from_its_cpu_checkpoint(tmp_path, tiny_base, tokenizer):
    from xlaport.training.loop import CHECKPOINT, JOB_FILE, RESULT_FILE, run_job, write_job

    texts = [p.read_text() for p in sorted(CORPUS.glob("*.py"))]
    batches = pretrain_batches(tokenizer, texts, block=32, batch_size=2, steps=6)
    loop = LoopConfig(steps=4, lr=1e-3, warmup_steps=1, checkpoint_every=2, log_every=1, device="eager")
    job = {"kind": "base", "base_model": str(tiny_base), "loop": loop.__dict__}
    write_job(tmp_path, job, batches)
    first = run_job(tmp_path, log=lambda m: None)
    assert first.start_step == 0 and sorted(first.losses) == [0, 1, 2, 3]
    checkpoint = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert checkpoint["step"] == 4
    assert all(t.device.type == "cpu" for t in checkpoint["model"].values())
    # the job grows by two steps: the run continues where the checkpoint left off
    job["loop"]["steps"] = 6
    (tmp_path / JOB_FILE).write_text(json.dumps(job))
    second = run_job(tmp_path, log=lambda m: None)
    assert second.start_step == 4 and sorted(second.losses) == [0, 1, 2, 3, 4, 5]
    assert second.losses[3] == first.losses[3]
    assert json.loads((tmp_path / RESULT_FILE).read_text())["start_step"] == 4


@pytest.mark.slow
def test_tiny_end_to_end_lora_training_passes_the_xla_check(tmp_path, monkeypatch):
    """corpus → traces → tokenizer → base → LoRA (the loop script under `xlaport check`) → proposer."""
    from xlaport.eval.check import run_check
    from xlaport.model.artifacts import newest, read_meta
    from xlaport.model.proposer import load_proposer
    from xlaport.serve.pipeline import Pipeline
    from xlaport.training import loop
    from xlaport.training.dataset import Batches
    from xlaport.training.workflow import (
        JOB_DIR,
        finish_job,
        prepare_base_job,
        prepare_data,
        prepare_lora_job,
        run_training,
    )

    monkeypatch.setenv("XLAPORT_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "none.jsonl"))
    size = TINY.with_overrides(buckets=(192, 256), lora_steps=6, base_steps=4)
    data = prepare_data(size, roots=[CORPUS])
    base, base_result = run_training(prepare_base_job(size, data=data, device="eager"))
    assert read_meta(base)["kind"] == "base" and (base / "tokenizer.json").exists()
    assert base_result.steps == 4

    out = prepare_lora_job(size, data=data, base=base, device="xla")
    job_dir = out / JOB_DIR
    batches = Batches.load(job_dir / loop.BATCHES_FILE)
    assert len({tuple(t.shape) for t in batches.input_ids}) == 2, "both buckets are used"
    report = run_check(
        Path(loop.__file__),
        [str(job_dir), str(out)],
        steps_warmup=batches.warmup_steps,
        timeout_s=600,
        writable=[tmp_path / "models"],  # the sandboxed child reads the job and base, writes its checkpoint
        reveal=True,  # the job lies in pytest's 0700 tmp_path: this test's own files
    )
    assert report.level == "L2", report.reasons
    assert report.steps == 6 and report.compiles_total == 3 and report.compiles_after_warmup == 0
    assert report.fallback_ops == {} and not report.nan and not report.stale_optimizer_params
    finish_job(out)
    assert newest("lora") == out and not job_dir.exists()
    meta = read_meta(out)
    assert meta["train"]["compiles_after_warmup"] == 0 and meta["base_model"] == str(base.resolve())

    # the trained adapter is picked up and proposes; the pipeline keeps the rules' work either way
    proposer = load_proposer()
    assert proposer is not None and proposer.name == out.name
    source = "import torch\n\n\ndef report(x):\n    used = torch.cuda.memory_allocated()\n    return x * 2, used\n"
    patch = Pipeline(proposer=proposer).suggest(source, "report.py")
    assert patch.evidence.rewritten_functions == ["report"] or any(
        note.startswith("report: ") for note in patch.notes
    ), patch.notes


def test_train_cli_reports_bad_input_clearly(tmp_path, monkeypatch):
    from xlaport.cli import app

    monkeypatch.setenv("XLAPORT_MODELS_DIR", str(tmp_path))
    runner = CliRunner()
    result = runner.invoke(app, ["train", "base", "--size", "huge"])
    assert result.exit_code == 2 and "unknown size 'huge'" in result.output
    result = runner.invoke(app, ["train", "lora", "--size", "tiny", "--base-model", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such model directory" in result.output
    result = runner.invoke(app, ["train", "data", "--size", "tiny", "--corpus", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "corpus folder not found" in result.output
    result = runner.invoke(app, ["train", "list"])
    assert result.exit_code == 0 and "nothing in" in result.output


# --- what the model is trained on, and how cheaply ------------------------------------------------
def test_serving_view_is_the_text_the_pipeline_shows_the_model():
    from xlaport.training.traces import serving_view

    original = textwrap.dedent(
        """\
        def timed(model, x):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(torch.cuda.current_stream())
            y = model(x)
            end.record(torch.cuda.current_stream())
            torch.cuda.synchronize()
            return y, start.elapsed_time(end)
        """
    )
    target = "import time\n\ndef timed(model, x):\n    start = time.perf_counter()\n    y = model(x)\n    return y, time.perf_counter() - start\n"
    trace = Trace("synth:event_timing", "a.py", "timed", original, target, imports="import torch", codes=["XLA411"])
    view = serving_view(trace)
    # the safe rule rewrote the synchronize before the model sees the function; events recorded on a stream are
    # left to it (XLA208 rewrites plain event timers itself)
    assert "torch.cuda.synchronize" not in view.original and "torch.cuda.Event" in view.original
    assert "import torch_xla.core.xla_model as xm" in view.imports.splitlines()
    assert view.codes and "XLA204" not in view.codes
    assert split_target(view.target) == split_target(target)
    # the rules fix it all: the pipeline would not ask the model, so no training example either
    fixed_by_rules = Trace("injected", "a.py", "f", "def f(x):\n    return x.cuda()\n", "def f(x):\n    return x\n")
    assert serving_view(fixed_by_rules) is None


def test_target_loss_is_the_models_own_loss_from_fewer_logits():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from xlaport.training.loop import target_loss, target_positions, target_width
    from xlaport.training.workflow import lora_settings

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2
    )
    settings = lora_settings(TINY.with_overrides(lora_layers=2, lora_targets=("q_proj",)), "llama", 4)
    assert settings["layers_to_transform"] == [2, 3]
    assert "layers_to_transform" not in lora_settings(TINY, "llama", config.num_hidden_layers)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(task_type="CAUSAL_LM", **settings))
    ids = torch.randint(0, 50, (3, 12))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 4:9], labels[1, 1:12], labels[2, 10:12] = ids[0, 4:9], ids[1, 1:12], ids[2, 10:12]
    width = target_width(type("B", (), {"labels": [labels, None]})())
    assert width == 32  # 10 labelled next tokens at most, rounded up
    positions, targets = target_positions(labels, width)
    with torch.no_grad():
        expected = model(input_ids=ids, labels=labels).loss
        assert torch.allclose(target_loss(model, ids, None, positions, targets), expected, atol=1e-6)


def test_a_resumed_job_takes_the_steps_asked_again(tmp_path):
    """`train lora/base --out DIR --steps N` on an interrupted job: N is its new length (it was ignored)."""
    from xlaport.training.dataset import Batches
    from xlaport.training.loop import BATCHES_FILE, JOB_FILE, write_job
    from xlaport.training.workflow import TrainingError, prepare_base_job

    batches = Batches([torch.zeros(1, 4, dtype=torch.int32)] * 6, [None] * 6, warmup_steps=2)
    loop = LoopConfig(steps=4, lr=1e-3, warmup_steps=1, checkpoint_every=2, log_every=1, device="eager")
    write_job(tmp_path / "_job", {"kind": "base", "base_model": "unused", "loop": loop.__dict__}, batches)

    def steps() -> int:
        return json.loads((tmp_path / "_job" / JOB_FILE).read_text())["loop"]["steps"]

    assert prepare_base_job(TINY, out=tmp_path) == tmp_path and steps() == 4  # no --steps: the job's own
    prepare_base_job(TINY, out=tmp_path, steps=6)
    assert steps() == 6
    prepare_base_job(TINY, out=tmp_path, steps=3)
    assert steps() == 3
    with pytest.raises(TrainingError, match="fewer batches than --steps 7"):
        prepare_base_job(TINY, out=tmp_path, steps=7)
    assert len(Batches.load(tmp_path / "_job" / BATCHES_FILE)) == 6 and steps() == 3


@pytest.mark.slow
def test_lora_resumed_with_more_steps_prepares_them_and_continues(tmp_path, monkeypatch, tiny_base):
    """An interrupted LoRA job resumed by the CLI with a larger --steps: the missing batches are prepared, the
    run continues from its checkpoint and stops at the new length."""
    from xlaport.training.dataset import Batches
    from xlaport.training.loop import BATCHES_FILE, CHECKPOINT, run_job
    from xlaport.training.workflow import JOB_DIR, prepare_data, prepare_lora_job

    from xlaport.cli import app

    monkeypatch.setenv("XLAPORT_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "none.jsonl"))
    size = TINY.with_overrides(buckets=(192, 256), lora_steps=2)
    data = prepare_data(size, roots=[CORPUS])
    out = prepare_lora_job(size, data=data, base=tiny_base, out=tmp_path / "adapter", device="eager")
    assert len(Batches.load(out / JOB_DIR / BATCHES_FILE)) == 2
    run_job(out / JOB_DIR, log=lambda m: None)  # the job's 2 steps, then "interrupted": the job stays
    assert torch.load(out / JOB_DIR / CHECKPOINT, weights_only=True)["step"] == 2

    result = CliRunner().invoke(
        app, ["train", "lora", "--size", "tiny", "--out", str(out), "--steps", "4", "--device", "eager"]
    )
    assert result.exit_code == 0, result.output
    assert "resumed at step 2" in result.output and "step 4/4" in result.output
    report = json.loads(result.stdout[result.stdout.index("{") :])
    assert report["steps"] == 4
    assert not (out / JOB_DIR).exists() and (out / "xlaport.json").exists()
