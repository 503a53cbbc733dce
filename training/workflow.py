"""The three training steps the CLI runs: dataset → base model → LoRA adapter.

Each writes one artifact directory (see artifacts.py); training itself runs as a job (loop.py)
whose checkpoint lets an interrupted run resume (`--out` the same directory again).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from xlaport.model.artifacts import new_artifact_dir, newest, read_meta, write_meta
from xlaport.model.base import BaseModelMissing, default_base_model
from xlaport.model.prompts import PROMPT_FORMAT

from xlaport.paths import models_dir, traces_path

from .configs import SizeConfig
from .corpus import package_roots
from .dataset import Dataset, build_dataset, load_dataset, lora_batches, pretrain_batches, save_dataset
from .loop import BATCHES_FILE, CHECKPOINT, JOB_FILE, RESULT_FILE, LoopConfig, TrainResult, run_job, write_job
from .tokenizer import train_tokenizer
from .traces import serving_view

Log = Callable[[str], None]
JOB_DIR = "_job"
TOKENIZER_SAMPLE_CHARS = 20_000_000  # enough text for the merges; keeps tokenizer training short


class TrainingError(RuntimeError):
    """A training step that cannot run (missing inputs, bad options)."""


def _quiet(message: str) -> None:
    pass


# --- dataset ------------------------------------------------------------------------------------
def prepare_data(
    size: SizeConfig,
    out: Path | None = None,
    roots: list[Path] | None = None,
    recorded: list[Path] | None = None,
    seed: int = 0,
    log: Log = _quiet,
    accepted: list[Path] | None = None,
) -> Path:
    """Builds and saves the dataset; returns its directory. `accepted`: JSONL files of accepted candidates."""
    roots = roots or package_roots()
    if not roots:
        raise TrainingError("no corpus: none of the default packages is installed; pass --corpus DIR")
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        raise TrainingError(f"corpus folder not found: {', '.join(missing)}")
    out = out or new_artifact_dir("dataset", size.name)
    dataset = build_dataset(roots, size, recorded or default_recorded(), seed=seed, log=log, accepted=accepted or ())
    if not dataset.split_traces("train"):
        raise TrainingError("the corpus gave no training traces (too few functions?)")
    save_dataset(dataset, out)
    log(f"dataset written to {out}: {json.dumps(dataset.meta['traces'])}")
    return out


def default_recorded() -> list[Path]:
    """The global trace file `xlaport migrate` appends to, when it exists."""
    path = traces_path()
    return [path] if path.is_file() else []


def resolve_dataset(data: Path | None, size: SizeConfig, log: Log) -> tuple[Path, Dataset]:
    """The given dataset, else the newest one of this size, else a freshly built one."""
    if data is None:
        data = newest_dataset(size.name)
        if data is None:
            log("no dataset yet: building one")
            data = prepare_data(size, log=log)
    return data, load_dataset(data)


def newest_dataset(size_name: str) -> Path | None:
    root = models_dir()
    if not root.is_dir():
        return None
    found = []
    for child in root.iterdir():
        meta = read_meta(child) if child.is_dir() else None
        if meta and meta["kind"] == "dataset" and meta.get("size") == size_name:
            found.append((meta["created"], child.name, child))
    return max(found)[2] if found else None


# --- base model ---------------------------------------------------------------------------------
def new_base_model(size: SizeConfig, tokenizer):
    """A randomly initialised Llama-style causal LM of `size`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=size.context,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def prepare_base_job(
    size: SizeConfig,
    data: Path | None = None,
    out: Path | None = None,
    device: str = "xla",
    seed: int = 0,
    log: Log = _quiet,
    threads: int | None = None,
    steps: int | None = None,
) -> Path:
    """Writes the pretraining job (tokenizer, random-init model, batches) into `out/_job`; returns `out`.

    When `out` already holds a job, it is kept (its checkpoint lets the run resume), with `steps` (the steps
    asked again, None: the job's own) as its length; more than its batches is refused (another `--out`).
    """
    import torch

    if size.pretrained:
        raise TrainingError(f"size {size.name} fine-tunes the pretrained SmolLM2 base: run `xlaport train lora`")
    out = out or new_artifact_dir("base", size.name)
    job_dir = out / JOB_DIR
    if _job_exists(job_dir, log):
        if not _resume_with_steps(job_dir, steps, log):
            raise TrainingError(
                f"the job in {job_dir} prepared fewer batches than --steps {steps}: a longer pretraining needs "
                "a new job (another --out)"
            )
        return out
    data, dataset = resolve_dataset(data, size, log)
    texts = dataset.texts("train")
    if not texts:
        raise TrainingError(f"dataset {data} has no training functions")
    start = time.perf_counter()
    tokenizer = train_tokenizer(_sample(texts, TOKENIZER_SAMPLE_CHARS, seed), size.vocab_size)
    log(f"tokenizer: {len(tokenizer)} tokens ({time.perf_counter() - start:.0f} s)")
    tokenizer.save_pretrained(str(job_dir / "tokenizer"))
    torch.manual_seed(seed)
    model = new_base_model(size, tokenizer)
    model.save_pretrained(str(job_dir / "init"))  # the job starts from these saved weights, also when resumed
    batches = pretrain_batches(tokenizer, texts, size.context, size.batch_size, size.base_steps, seed)
    loop = _loop_config(size, size.base_steps, size.base_lr, device, seed, threads)
    meta = {"kind": "base", "size": size.name, "size_config": size.to_dict(), "dataset": str(data.resolve())}
    job = {
        "kind": "base",
        "base_model": str(job_dir / "init"),
        "tokenizer": str(job_dir / "tokenizer"),
        "loop": loop,
        "meta": meta,
    }
    write_job(job_dir, job, batches)
    log(f"base job: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, {size.base_steps} steps")
    return out


def _loop_config(size: SizeConfig, steps: int, lr: float, device: str, seed: int, threads: int | None) -> dict:
    config = LoopConfig(
        steps=steps,
        lr=lr,
        warmup_steps=min(size.warmup_steps, max(1, steps // 10)),
        checkpoint_every=size.checkpoint_every,
        log_every=size.log_every,
        device=device,
        seed=seed,
        threads=threads,
    )
    return asdict(config)


def finish_job(out: Path, result: TrainResult | None = None) -> Path:
    """Completes the artifact in `out` after its job ran: tokenizer, `xlaport.json`; removes the job.

    `result` defaults to the one the job wrote (when it ran in another process, e.g. under `xlaport check`).
    """
    from transformers import AutoTokenizer

    job_dir = out / JOB_DIR
    job = json.loads((job_dir / JOB_FILE).read_text(encoding="utf-8"))
    if result is None and not (job_dir / RESULT_FILE).exists():
        raise TrainingError(f"the job in {job_dir} has not finished")
    train = result.to_dict() if result is not None else json.loads((job_dir / RESULT_FILE).read_text(encoding="utf-8"))
    AutoTokenizer.from_pretrained(job["tokenizer"]).save_pretrained(str(out))
    write_meta(out, {**job["meta"], "train": train})
    shutil.rmtree(job_dir)
    return out


def _resume_with_steps(job_dir: Path, steps: int | None, log: Log) -> bool:
    """A job being resumed takes the steps asked again (`--steps`; None keeps its own): True when its batches
    cover them (job.json updated), False when more batches must be prepared. The learning-rate schedule of the
    steps still to run follows the new length; the steps already done and the checkpoint stay."""
    from .dataset import Batches

    job = json.loads((job_dir / JOB_FILE).read_text(encoding="utf-8"))
    if steps is None or steps == job["loop"]["steps"]:
        return True
    if steps > len(Batches.load(job_dir / BATCHES_FILE)):
        return False
    log(f"the job's length: {job['loop']['steps']} -> {steps} steps (--steps)")
    job["loop"]["steps"] = steps
    (job_dir / JOB_FILE).write_text(json.dumps(job, indent=2) + "\n", encoding="utf-8")
    return True


def _job_exists(job_dir: Path, log: Log) -> bool:
    """True when `job_dir` already holds a job: it is kept as it is, and its checkpoint lets the run resume."""
    if not (job_dir / JOB_FILE).exists():
        return False
    log(f"resuming the job in {job_dir}" if (job_dir / CHECKPOINT).exists() else f"running the job in {job_dir}")
    return True


def run_training(out: Path, log: Log = _quiet) -> tuple[Path, TrainResult]:
    """Runs the job prepared in `out/_job` in this process and completes the artifact."""
    result = run_job(out / JOB_DIR, out, log=log)
    return finish_job(out, result), result


def _sample(texts: list[str], max_chars: int, seed: int) -> list[str]:
    if sum(map(len, texts)) <= max_chars:
        return texts
    shuffled = list(texts)
    random.Random(seed).shuffle(shuffled)
    chosen, total = [], 0
    for text in shuffled:
        if total >= max_chars:
            break
        chosen.append(text)
        total += len(text)
    return chosen


# --- LoRA ---------------------------------------------------------------------------------------
def lora_settings(size: SizeConfig, model_type: str, num_layers: int | None = None) -> dict:
    """peft LoraConfig fields; with `size.lora_layers`, only the top layers of a `num_layers` model are adapted."""
    settings = {
        "r": size.lora_r,
        "lora_alpha": size.lora_alpha,
        "lora_dropout": size.lora_dropout,
        "target_modules": list(size.lora_targets) if isinstance(size.lora_targets, tuple) else size.lora_targets,
    }
    if size.lora_layers and num_layers and size.lora_layers < num_layers:
        # backward then stops at the lowest adapted layer: nothing below needs a gradient
        settings["layers_to_transform"] = list(range(num_layers - size.lora_layers, num_layers))
    if model_type == "gpt2":
        settings["fan_in_fan_out"] = True  # GPT-2 uses Conv1D layers
    return settings


def prepare_lora_job(
    size: SizeConfig,
    data: Path | None = None,
    base: Path | None = None,
    out: Path | None = None,
    device: str = "xla",
    seed: int = 0,
    log: Log = _quiet,
    threads: int | None = None,
    steps: int | None = None,
) -> Path:
    """Writes the LoRA job (padded batches of the train-split traces) into `out/_job`; returns `out`.

    When `out` already holds a job, it is resumed with `steps` (the steps asked again; None: the job's own):
    beyond its batches, they are prepared again from the job's base, dataset and seed (the same batches first:
    `lora_batches` draws them in order) and its checkpoint stays.
    """
    from transformers import AutoConfig, AutoTokenizer

    out = out or new_artifact_dir("lora", size.name)
    job_dir = out / JOB_DIR
    if _job_exists(job_dir, log):
        if _resume_with_steps(job_dir, steps, log):
            return out
        job = json.loads((job_dir / JOB_FILE).read_text(encoding="utf-8"))
        log(f"preparing {steps} batches for the job in {job_dir} (it had fewer); its checkpoint stays")
        size = size.with_overrides(lora_steps=steps)
        base, data = Path(job["base_model"]), Path(job["meta"]["dataset"])
        seed = job["loop"].get("seed", seed)
    if base is None and size.pretrained:
        try:
            base = default_base_model(log=log)
        except BaseModelMissing as exc:
            raise TrainingError(str(exc)) from None
    base = base or newest("base")
    if base is None:
        raise TrainingError("no base model: run `xlaport train base` first, or pass --base-model PATH")
    if not (base / "config.json").exists():
        raise TrainingError(f"{base} is not a Hugging Face model directory (no config.json)")
    data, dataset = resolve_dataset(data, size, log)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = AutoConfig.from_pretrained(str(base))
    context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048
    buckets = tuple(b for b in size.buckets if b <= context) or (context,)
    traces = [view for trace in dataset.split_traces("train") if (view := serving_view(trace)) is not None]
    log(f"{len(traces)} of {len(dataset.split_traces('train'))} train traces keep a finding after the safe fixes")
    batches = lora_batches(tokenizer, traces, buckets, size.batch_size, size.lora_steps, seed)
    tokenizer.save_pretrained(str(job_dir / "tokenizer"))
    meta = {
        "kind": "lora",
        "size": size.name,
        "base_model": str(base.resolve()),
        "dataset": str(data.resolve()),
        "prompt_format": PROMPT_FORMAT,
        "context": context,
        "max_new_tokens": size.max_new_tokens,
    }
    job = {
        "kind": "lora",
        "base_model": str(base.resolve()),
        "tokenizer": str(job_dir / "tokenizer"),
        "lora": lora_settings(size, config.model_type, getattr(config, "num_hidden_layers", None)),
        "loop": _loop_config(size, size.lora_steps, size.lora_lr, device, seed, threads),
        "meta": meta,
    }
    write_job(job_dir, job, batches)
    shapes = sorted({tuple(t.shape) for t in batches.input_ids})
    log(f"LoRA job: {len(traces)} train traces, batch shapes {shapes}, {size.lora_steps} steps")
    return out
