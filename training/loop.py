"""The training loop: torch_xla by default (`PJRT_DEVICE=CPU` here, a TPU when present), eager as an option.

XLA rules it follows: batches have fixed shapes (one graph per shape), the optimizer is built after
the model moved to the device, one `torch_xla.sync()` per step, no host reads inside a step (the
loss is read by a step closure on logging steps only), checkpoints are CPU state dicts written
between steps, and a run resumes from its last checkpoint.

Also a script, so that `xlaport check` can run the very same loop: `python loop.py JOB_DIR`,
where JOB_DIR holds `job.json` and the batches (see `write_job`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

# absolute import: this file also runs as a script (by `xlaport check`)
from xlaport.model.proposer import cpu_threads
from xlaport.training.dataset import IGNORE_INDEX, Batches

CHECKPOINT = "checkpoint.pt"
JOB_FILE = "job.json"
BATCHES_FILE = "batches.pt"
RESULT_FILE = "result.json"


@dataclass
class LoopConfig:
    steps: int
    lr: float
    warmup_steps: int = 20  # learning-rate warm-up (not the compile warm-up)
    min_lr_ratio: float = 0.1  # cosine decay to this share of `lr` (never 0: 0 and 1 are graph constants on XLA)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    checkpoint_every: int = 200
    log_every: int = 10
    device: str = "xla"  # "xla" or "eager" (CUDA when available, else CPU)
    seed: int = 0
    threads: int | None = None  # CPU threads for torch; None: all cores but one (see `cpu_threads`)

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / (self.warmup_steps + 1)
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)


@dataclass
class TrainResult:
    device: str
    steps: int
    start_step: int  # > 0 when resumed
    tokens: int  # label tokens (non-padding) trained on in this run
    padded_tokens: int  # tokens processed, padding included
    wall_s: float
    steady_s: float  # after the compile warm-up
    steady_tokens: int
    compile_warmup_steps: int
    losses: dict[int, float] = field(default_factory=dict)
    compiles: int | None = None  # XLA graph compilations in this run
    compiles_after_warmup: int | None = None
    fallback_ops: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.steady_tokens / self.steady_s if self.steady_s > 0 else 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["losses"] = {str(k): v for k, v in self.losses.items()}
        data["tokens_per_s"] = round(self.tokens_per_s, 1)
        return data


def use_cpu_pjrt_unless_tpu() -> None:
    """PJRT_DEVICE=CPU when nothing is configured and no TPU runtime is installed (silences the default warning)."""
    if "PJRT_DEVICE" not in os.environ and importlib.util.find_spec("libtpu") is None:
        os.environ["PJRT_DEVICE"] = "CPU"


def pick_device(kind: str) -> torch.device:
    if kind == "xla":
        use_cpu_pjrt_unless_tpu()
        import torch_xla

        return torch_xla.device()
    if kind == "eager":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    raise ValueError(f"unknown device kind {kind!r} (xla or eager)")


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def move_model(model: torch.nn.Module, device: torch.device | str) -> None:
    """`model.to(device)`, keeping tied weights tied (moving to XLA replaces the parameters and unties them)."""
    model.to(device)
    if callable(getattr(model, "tie_weights", None)):
        model.tie_weights()


def causal_mask(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An additive (1, 1, L, L) causal mask.

    Passed on XLA instead of letting transformers build one: without a mask it checks the position
    ids for packed sequences with a device read (`aten::_local_scalar_dense`) in every forward.
    Right padding needs no mask: labels are -100 there and causal attention never looks ahead.
    """
    mask = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return mask[None, None].to(device)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(path: Path, step: int, model, optimizer, losses: dict[int, float]) -> None:
    """CPU state dicts of the trainable weights and the optimizer, written atomically."""
    data = {
        "step": step,
        "model": trainable_state(model),
        "optimizer": _to_cpu(optimizer.state_dict()),
        "losses": losses,
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(data, tmp)
    os.replace(tmp, path)


def train(
    model: torch.nn.Module,
    batches: Batches,
    config: LoopConfig,
    checkpoint: Path | None = None,
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Trains `model` (a causal LM taking input_ids/labels) in place; resumes from `checkpoint` if it exists."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(cpu_threads(config.threads))
    try:
        return _train(model, batches, config, checkpoint, log)
    finally:
        torch.set_num_threads(previous_threads)


def _train(
    model: torch.nn.Module, batches: Batches, config: LoopConfig, checkpoint: Path | None, log: Callable[[str], None]
) -> TrainResult:
    if config.steps > len(batches):
        raise ValueError(f"{config.steps} steps asked, only {len(batches)} batches prepared")
    xla = config.device == "xla"
    if xla:
        use_cpu_pjrt_unless_tpu()
        import torch_xla
        import torch_xla.core.xla_model as xm
    device = pick_device(config.device)
    torch.manual_seed(config.seed)

    state = torch.load(checkpoint, weights_only=True) if checkpoint and checkpoint.exists() else None
    if state is not None:
        model.load_state_dict(state["model"], strict=False)
    model.config.pad_token_id = None  # transformers' padding checks read device values
    move_model(model, device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)  # after the move
    start_step, losses = 0, {}
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        start_step, losses = state["step"], dict(state["losses"])
        log(f"resumed at step {start_step}")
    # the compile warm-up: the first steps compile each shape (and the graph with optimizer state)
    warmup = batches.warmup_steps
    compiles_start = _compile_count() if xla else None
    fallbacks_start = _fallback_counts() if xla else {}

    def record(step: int, loss: torch.Tensor) -> None:
        # a device-to-host copy after the step ran (not `.item()`, which XLA counts as a CPU fallback op)
        losses[step] = round(float(loss.cpu()), 4)
        log(f"step {step + 1}/{config.steps}  loss {losses[step]:.4f}")

    masks: dict[int, torch.Tensor] = {}  # one device tensor per length, reused by every step
    width = target_width(batches)
    dtype = next(model.parameters()).dtype
    tokens = padded = steady_tokens = 0
    start = steady_start = time.perf_counter()
    compiles_at_warmup = compiles_start
    for step in range(start_step, config.steps):
        if step == start_step + warmup:
            _wait(config.device)
            steady_start = time.perf_counter()
            compiles_at_warmup = _compile_count() if xla else None
        input_ids = batches.input_ids[step].long()
        labels = batches.labels[step]
        labels = input_ids if labels is None else labels
        step_tokens = int((labels != IGNORE_INDEX).sum())  # CPU tensors: no device read
        tokens += step_tokens
        padded += input_ids.numel()
        if step >= start_step + warmup:
            steady_tokens += step_tokens
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step)
        mask = None
        if xla:
            length = input_ids.shape[1]
            if length not in masks:
                masks[length] = causal_mask(length, dtype, device)
            mask = masks[length]
        if width:  # fine-tuning: logits only where a label is (the prompt is most of the tokens)
            positions, targets = target_positions(labels, width)
            loss = target_loss(model, input_ids.to(device), mask, positions.to(device), targets.to(device))
        else:
            loss = model(
                input_ids=input_ids.to(device), labels=labels.to(device), attention_mask=mask, use_cache=False
            ).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logging_step = step == start_step or (step + 1) % config.log_every == 0 or step + 1 == config.steps
        if xla:
            if logging_step:
                xm.add_step_closure(record, args=(step, loss.detach()))
            torch_xla.sync()
        elif logging_step:
            record(step, loss.detach())
        done = step + 1
        if checkpoint is not None and (done % config.checkpoint_every == 0 or done == config.steps):
            save_checkpoint(checkpoint, done, model, optimizer, losses)
    _wait(config.device)
    end = time.perf_counter()
    result = TrainResult(
        device=str(device),
        steps=config.steps,
        start_step=start_step,
        tokens=tokens,
        padded_tokens=padded,
        wall_s=round(end - start, 2),
        steady_s=round(end - steady_start, 2) if config.steps > start_step + warmup else 0.0,
        steady_tokens=steady_tokens,
        compile_warmup_steps=warmup,
        losses=losses,
    )
    if xla:
        result.compiles = _compile_count() - compiles_start
        result.compiles_after_warmup = _compile_count() - compiles_at_warmup
        counts = _fallback_counts()
        result.fallback_ops = {
            k: v - fallbacks_start.get(k, 0) for k, v in counts.items() if v > fallbacks_start.get(k, 0)
        }
    model.eval()
    return result


def target_width(batches: Batches) -> int:
    """How many labelled positions a row may have, rounded up to 32: one width for the whole run (fixed
    shapes). 0 for pretraining batches (every position is a label)."""
    counts = [int((labels[:, 1:] != IGNORE_INDEX).sum(1).max()) for labels in batches.labels if labels is not None]
    return -(-max(counts) // 32) * 32 if counts else 0


def target_positions(labels: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, targets), each (batch, width), CPU: the positions whose next token is a label, and
    that label; the rest is position 0 with target IGNORE_INDEX."""
    positions = torch.zeros(labels.shape[0], width, dtype=torch.long)
    targets = torch.full((labels.shape[0], width), IGNORE_INDEX, dtype=torch.long)
    for row, row_labels in enumerate(labels):
        kept = (row_labels[1:] != IGNORE_INDEX).nonzero().flatten()
        positions[row, : len(kept)] = kept
        targets[row, : len(kept)] = row_labels[1:][kept]
    return positions, targets


def target_loss(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    positions: torch.Tensor,
    targets: torch.Tensor,
) -> torch.Tensor:
    """The causal-LM loss of `model(input_ids, labels=...)`, with the output layer applied only at `positions`.

    The prompt is ~80% of a LoRA example's tokens and the output layer (49k words) plus its softmax
    about a fifth of the model's work: computing logits where there is no label was mostly waste.
    """
    causal_lm = model.get_base_model() if job_is_peft(model) else model  # peft's LoRA layers live inside it
    hidden = causal_lm.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)[0]
    picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    logits = causal_lm.get_output_embeddings()(picked).float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


def _wait(device_kind: str) -> None:
    if device_kind == "xla":
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()  # waits for the launched graphs without starting a new step
    elif torch.cuda.is_available():
        torch.cuda.synchronize()


def _fallback_counts() -> dict[str, int]:
    """Process-wide counts of ops that fell back to the CPU (`aten::*` counters)."""
    import torch_xla.debug.metrics as met

    return {name: int(met.counter_value(name) or 0) for name in met.executed_fallback_ops()}


def _compile_count() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


# --- jobs: what `xlaport train` runs, and what `xlaport check` can run as a script -------------
def write_job(directory: Path, job: dict, batches: Batches) -> None:
    """A self-contained training job: `job.json` (kind, model paths, loop and LoRA settings) + batches."""
    directory.mkdir(parents=True, exist_ok=True)
    batches.save(directory / BATCHES_FILE)
    (directory / JOB_FILE).write_text(json.dumps(job, indent=2) + "\n", encoding="utf-8")


def load_job_model(job: dict) -> torch.nn.Module:
    """The model a job trains: the base model, wrapped with a fresh LoRA adapter for LoRA jobs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(job["base_model"], dtype=torch.float32)
    if job["kind"] == "lora":
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(job["loop"].get("seed", 0))  # the adapter's initial weights
        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **job["lora"]))
    return model


def run_job(directory: Path, out: Path | None = None, log: Callable[[str], None] = print) -> TrainResult:
    """Runs (or resumes) the job in `directory`; saves the trained model (or adapter) to `out` on the CPU."""
    job = json.loads((directory / JOB_FILE).read_text(encoding="utf-8"))
    model = load_job_model(job)
    config = LoopConfig(**job["loop"])
    batches = Batches.load(directory / BATCHES_FILE)
    result = train(model, batches, config, checkpoint=directory / CHECKPOINT, log=log)
    (directory / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    if out is not None:
        save_model(model, out)
    return result


def save_model(model: torch.nn.Module, out: Path) -> None:
    """`save_pretrained` from CPU copies of the weights: the model stays on its device, the optimizer's."""
    if job_is_peft(model):
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model)
    else:
        state, seen = {}, set()
        for name, tensor in model.state_dict(
            keep_vars=True
        ).items():  # tied weights appear under two names: keep the first
            if id(tensor) not in seen:
                seen.add(id(tensor))
                state[name] = tensor
    model.save_pretrained(str(out), state_dict={k: v.detach().cpu() for k, v in state.items()})


def job_is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2):
        print("usage: loop.py JOB_DIR [OUT_DIR]", file=sys.stderr)
        return 2
    result = run_job(Path(argv[0]), Path(argv[1]) if len(argv) == 2 else None)
    print(json.dumps({k: v for k, v in result.to_dict().items() if k != "losses"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
