"""Model sizes and training settings, one named configuration per size.

`tiny` is the test configuration: a from-scratch base of ~1 M parameters (seconds). `cpu` (the
default) fine-tunes a LoRA adapter on the pretrained SmolLM2-135M (model/base.py) within 60
minutes on 2 CPU cores through torch_xla; `tpu` is the same on real hardware.
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
    pretrained: bool = False  # LoRA on the packaged SmolLM2 (model/base.py), not on a from-scratch base
    max_synth: int = 0  # synthesized manual-finding pairs (training/synth.py)
    lora_targets: tuple[str, ...] | str = "all-linear"
    lora_layers: int | None = None  # adapt only the top N layers (None: all); backward stops below them

    def with_overrides(self, **changes: object) -> SizeConfig:
        """A copy with the given fields changed; None values are ignored."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        data = asdict(self)
        data["buckets"] = list(self.buckets)
        if isinstance(self.lora_targets, tuple):
            data["lora_targets"] = list(self.lora_targets)
        return data


def _pretrained(name: str, **fields: object) -> SizeConfig:
    """A size that fine-tunes the packaged SmolLM2 (model/base.py): the from-scratch model fields are unused."""
    return SizeConfig(
        name=name, pretrained=True, vocab_size=0, hidden=0, layers=0, heads=0, intermediate=0, context=8192, **fields
    )


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
        max_synth=40,
    ),
    # LoRA on the pretrained SmolLM2-135M (model/base.py); the model fields above are unused.
    # Sized for <= 60 min (dataset build + training + export) on this shared 2-core machine, where the
    # loop gets about one core: 240 steps of 4x256/512 took 99 min at load 10-16 (19.3 CPU-s per step).
    # Buckets 256/384 (61% of the post-rule examples fit) and logits only at the labelled positions
    # (loop.target_loss) halve a step. LoRA on the top 15 layers only (110 steps: 8.7 s/step, 18.5 min
    # in all) learned too little: its edit scripts mostly did not apply (bench/results, 2026-12-02),
    # so every layer is adapted, for 150 steps. A smaller synthesized set keeps the dataset build short.
    "cpu": _pretrained(
        "cpu",
        buckets=(256, 384),
        max_files=None,
        max_injected=150,
        max_rule_traces=300,
        max_synth=600,
        max_function_chars=1200,
        batch_size=4,
        base_steps=0,
        lora_steps=150,
        lora_lr=5e-4,
        warmup_steps=15,
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
        checkpoint_every=10,  # a checkpoint is ~20 MB (adapter + AdamW state); an interrupted run loses <= 10 steps
        max_new_tokens=256,
    ),
    # The same on a TPU: longer examples, bigger batches, every projection adapted.
    "tpu": _pretrained(
        "tpu",
        buckets=(512, 1024, 2048),
        max_files=None,
        max_injected=5000,
        max_rule_traces=5000,
        max_synth=20000,
        max_function_chars=6000,
        batch_size=32,
        base_steps=0,
        lora_steps=3000,
        lora_lr=3e-4,
        warmup_steps=100,
        lora_r=32,
        lora_alpha=64,
        checkpoint_every=500,
        max_new_tokens=1024,
    ),
}

DEFAULT_SIZE = "cpu"


def get_size(name: str) -> SizeConfig:
    try:
        return SIZES[name]
    except KeyError:
        raise KeyError(f"unknown size {name!r} (known: {', '.join(SIZES)})") from None
