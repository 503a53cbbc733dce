"""Model sizes and training settings, one named configuration per size.

`tiny` is for tests (seconds). `small` is the default and is sized to finish base + LoRA training
within 30 minutes on a 2-core CPU through torch_xla (measured on a shared, busy machine: ~700
tokens/s, so ~1.5 M training tokens in all; see bench/model.py). `base` and `large` are meant
for a TPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class SizeConfig:
    name: str
    # model (Llama-style causal LM built from a transformers config)
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    context: int  # max positions; also the pretraining block length
    # data
    buckets: tuple[int, ...]  # padded lengths of LoRA examples (fixed shapes: one graph per bucket)
    max_files: int | None  # corpus files read per package (None: all)
    max_injected: int  # clean functions that get CUDA-isms injected
    max_rule_traces: int  # functions migrated by the rules (each costs a few lint passes)
    max_function_chars: int
    # training
    batch_size: int
    base_steps: int
    lora_steps: int
    base_lr: float = 1e-3
    lora_lr: float = 2e-3
    warmup_steps: int = 20
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    checkpoint_every: int = 200
    log_every: int = 10
    max_new_tokens: int = 512  # generation bound at serving time

    def with_overrides(self, **changes: object) -> SizeConfig:
        """A copy with the given fields changed; None values are ignored."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        data = asdict(self)
        data["buckets"] = list(self.buckets)
        return data


SIZES: dict[str, SizeConfig] = {
    "tiny": SizeConfig(
        name="tiny",
        vocab_size=600,
        hidden=64,
        layers=2,
        heads=2,
        intermediate=128,
        context=256,
        buckets=(128, 256),
        max_files=12,
        max_injected=40,
        max_rule_traces=40,
        max_function_chars=600,
        batch_size=4,
        base_steps=12,
        lora_steps=10,
        warmup_steps=2,
        lora_r=4,
        lora_alpha=8,
        checkpoint_every=1000,
        log_every=2,
        max_new_tokens=96,
    ),
    "small": SizeConfig(
        name="small",
        vocab_size=4096,
        hidden=192,
        layers=4,
        heads=3,
        intermediate=512,
        context=512,
        buckets=(256, 512),
        max_files=None,
        max_injected=3000,
        max_rule_traces=1500,
        max_function_chars=800,
        batch_size=8,
        base_steps=160,
        lora_steps=200,
        base_lr=2e-3,
        lora_lr=3e-3,
        warmup_steps=10,
        checkpoint_every=50,
    ),
    # TPU sizes: same code path, bigger shapes.
    "base": SizeConfig(
        name="base",
        vocab_size=16384,
        hidden=768,
        layers=12,
        heads=12,
        intermediate=2048,
        context=1024,
        buckets=(256, 512, 1024),
        max_files=None,
        max_injected=20000,
        max_rule_traces=20000,
        max_function_chars=3000,
        batch_size=32,
        base_steps=20000,
        lora_steps=3000,
        base_lr=6e-4,
        lora_lr=1e-3,
        warmup_steps=500,
        checkpoint_every=1000,
    ),
    "large": SizeConfig(
        name="large",
        vocab_size=32768,
        hidden=1536,
        layers=24,
        heads=16,
        intermediate=4096,
        context=2048,
        buckets=(512, 1024, 2048),
        max_files=None,
        max_injected=50000,
        max_rule_traces=50000,
        max_function_chars=6000,
        batch_size=64,
        base_steps=50000,
        lora_steps=5000,
        base_lr=3e-4,
        lora_lr=5e-4,
        warmup_steps=1000,
        lora_r=32,
        lora_alpha=64,
        checkpoint_every=2000,
    ),
}

DEFAULT_SIZE = "small"


def get_size(name: str) -> SizeConfig:
    try:
        return SIZES[name]
    except KeyError:
        raise KeyError(f"unknown size {name!r} (known: {', '.join(SIZES)})") from None
