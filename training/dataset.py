"""The dataset: deduplicated corpus functions and traces, split by source file, and the batches built from them.

A dataset directory holds `functions.jsonl` (pretraining text), `traces.jsonl` (fine-tuning
examples), both with their split, and `xlaport.json` (counts, sources). The test split is never
used for training: neither the base model's pretraining nor LoRA sees it.

Batches have fixed shapes so that torch_xla compiles one graph per shape: pretraining uses full
blocks of one length; LoRA examples are right-padded to the smallest bucket that holds them, with
labels -100 on the prompt and on the padding.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from xlaport.model.artifacts import read_meta, write_meta
from xlaport.model.prompts import edit_script, kb_entries, prompt_variants

from xlaport.files import atomic_write

from .configs import SizeConfig
from .corpus import Function, corpus_files, extract_functions, normalized_key, split_of
from .synth import synth_traces
from .traces import (
    Trace,
    accepted_traces,
    inject,
    injected_trace,
    is_injection_candidate,
    is_rule_candidate,
    lint_many,
    module_text,
    recorded_traces,
    rule_trace,
)

IGNORE_INDEX = -100


@dataclass
class Dataset:
    functions: list[tuple[str, Function]] = field(default_factory=list)  # (split, function)
    traces: list[Trace] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def texts(self, split: str) -> list[str]:
        return [fn.source for s, fn in self.functions if s == split]

    def split_traces(self, split: str) -> list[Trace]:
        return [t for t in self.traces if t.split == split]


# --- building -----------------------------------------------------------------------------------
def build_dataset(
    roots: list[Path],
    size: SizeConfig,
    recorded: Iterable[Path] = (),
    seed: int = 0,
    unsafe: bool = True,
    log: Callable[[str], None] = lambda message: None,
    accepted: Iterable[Path] = (),
) -> Dataset:
    """Reads the corpus, deduplicates functions, makes rule / injected / recorded / accepted traces, splits by file.

    Accepted candidates come before recorded traces, so a function both hold is kept as the accepted one."""
    start = time.perf_counter()
    functions: list[tuple[str, Function]] = []
    seen: set[str] = set()
    files = corpus_files(roots, size.max_files)
    for path, name in files:
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for fn in extract_functions(source, name, size.max_function_chars):
            key = normalized_key(fn.source)
            if key not in seen:  # first occurrence wins; copies elsewhere (any split) are dropped
                seen.add(key)
                functions.append((split_of(fn.file), fn))
    log(f"corpus: {len(files)} files, {len(functions)} unique functions ({time.perf_counter() - start:.0f} s)")

    traces: list[Trace] = []
    trace_keys: set[str] = set()

    def add(trace: Trace | None) -> None:
        if trace is None:
            return
        key = normalized_key(trace.original)
        if key not in trace_keys:
            trace_keys.add(key)
            traces.append(trace)

    rule_candidates = [fn for _, fn in functions if is_rule_candidate(fn)]
    lints = lint_many([module_text(fn.imports, fn.source) for fn in rule_candidates])
    fixable = [(fn, f) for fn, f in zip(rule_candidates, lints, strict=True) if f and any(x.fixable for x in f)]
    random.Random(seed).shuffle(fixable)
    for fn, findings in fixable[: size.max_rule_traces]:
        add(rule_trace(fn, unsafe=unsafe, findings=findings))
    log(f"rule traces: {len(traces)} of {len(rule_candidates)} candidates ({time.perf_counter() - start:.0f} s)")

    rng = random.Random(seed)
    candidates = [fn for _, fn in functions if is_injection_candidate(fn)]
    rng.shuffle(candidates)
    injections = []
    for fn in candidates:
        if len(injections) >= size.max_injected:
            break
        injected = inject(fn, rng)
        if injected is not None:
            injections.append((fn, injected))
    lints = lint_many([module_text(imports, source) for _, (source, imports) in injections])
    before = len(traces)
    for (fn, injected), findings in zip(injections, lints, strict=True):
        if findings is not None:
            add(injected_trace(fn, rng, injected=injected, findings=findings))
    injected_count = len(traces) - before
    log(f"injected traces: {injected_count} ({time.perf_counter() - start:.0f} s)")

    before = len(traces)
    for trace in synth_traces([fn for _, fn in functions], size.max_synth, seed):
        add(trace)
    log(f"synthesized manual-finding traces: {len(traces) - before} ({time.perf_counter() - start:.0f} s)")

    accepted_added = []
    for path in accepted:
        for trace in accepted_traces(path):
            before = len(traces)
            add(trace)
            if len(traces) > before:
                accepted_added.append(
                    {"file": trace.file, "function": trace.name, "codes": trace.codes, "split": trace.split}
                )
    if accepted_added:
        splits = Counter(a["split"] for a in accepted_added)
        log(f"accepted candidates: {len(accepted_added)} added ({dict(splits)})")
    recorded_count = 0
    for path in recorded:
        for trace in recorded_traces(path):
            before = len(traces)
            add(trace)
            recorded_count += len(traces) - before
    dataset = Dataset(functions, traces)
    dataset.meta = {
        "kind": "dataset",
        "size": size.name,
        "seed": seed,
        "unsafe_fixes": unsafe,
        "roots": [str(r) for r in roots],
        "recorded_sources": [str(p) for p in recorded],
        "accepted_sources": [str(p) for p in accepted],
        "accepted": accepted_added,
        "files": len(files),
        "functions": dict(Counter(s for s, _ in functions)),
        "traces": {
            split: dict(Counter(t.kind for t in traces if t.split == split)) for split in ("train", "val", "test")
        },
        "recorded": recorded_count,
        "injected": injected_count,
        "build_s": round(time.perf_counter() - start, 1),
    }
    return dataset


def save_dataset(dataset: Dataset, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rows = (json.dumps({"split": split, **fn.to_dict()}) for split, fn in dataset.functions)
    atomic_write(directory / "functions.jsonl", "\n".join(rows) + "\n")
    atomic_write(directory / "traces.jsonl", "\n".join(json.dumps(t.to_dict()) for t in dataset.traces) + "\n")
    write_meta(directory, dataset.meta)  # written last: its presence marks a complete dataset


def load_dataset(directory: Path) -> Dataset:
    meta = read_meta(directory)
    if meta is None or meta["kind"] != "dataset":
        raise FileNotFoundError(f"no xlaport dataset in {directory} (build one with `xlaport train data`)")
    functions = []
    for line in (directory / "functions.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            split = row.pop("split")
            functions.append((split, Function(**row)))
    traces = [
        Trace.from_dict(json.loads(line))
        for line in (directory / "traces.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    return Dataset(functions, traces, meta)


def encode_trace(tokenizer, trace: Trace, max_len: int) -> tuple[list[int], int] | None:
    """(token ids of prompt + target + EOS, prompt length), shortening the prompt to fit; None if it cannot."""
    script = edit_script(trace.original, trace.target)
    target_ids = tokenizer(script, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    for prompt in prompt_variants(trace.original, trace.imports, kb_entries(trace.codes)):
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        if len(prompt_ids) + len(target_ids) <= max_len:
            return prompt_ids + target_ids, len(prompt_ids)
    return None


# --- batches ------------------------------------------------------------------------------------
@dataclass
class Batches:
    """Per-step CPU tensors; `labels` None means the labels are the inputs (pretraining)."""

    input_ids: list[torch.Tensor]
    labels: list[torch.Tensor | None]
    warmup_steps: int  # steps after which every shape has been compiled (with optimizer state)

    def save(self, path: Path) -> None:
        torch.save({"input_ids": self.input_ids, "labels": self.labels, "warmup_steps": self.warmup_steps}, path)

    @classmethod
    def load(cls, path: Path) -> Batches:
        data = torch.load(path, weights_only=True)
        return cls(data["input_ids"], data["labels"], data["warmup_steps"])

    def __len__(self) -> int:
        return len(self.input_ids)


def pretrain_batches(tokenizer, texts: list[str], block: int, batch_size: int, steps: int, seed: int = 0) -> Batches:
    """Random `block`-token windows of the texts joined by EOS: one shape for every step."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False).input_ids:
        stream.extend(ids)
        stream.append(eos)
    if len(stream) <= block:
        raise ValueError(f"corpus too small for pretraining: {len(stream)} tokens, block of {block}")
    tokens = torch.tensor(stream, dtype=torch.int32)
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - block, (steps, batch_size), generator=generator)
    windows = tokens[starts.unsqueeze(-1) + torch.arange(block)]  # (steps, batch, block)
    # warm-up: step 0 compiles without optimizer state, step 1 with it
    return Batches(list(windows.unbind(0)), [None] * steps, warmup_steps=min(2, steps))


def bucket_of(length: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in sorted(buckets) if length <= b), None)


def lora_batches(
    tokenizer, traces: list[Trace], buckets: tuple[int, ...], batch_size: int, steps: int, seed: int = 0
) -> Batches:
    """Padded fixed-shape batches. The first steps visit every used bucket, so later steps compile nothing."""
    pad = tokenizer.pad_token_id
    by_bucket: dict[int, list[tuple[list[int], int]]] = {}
    for trace in traces:
        encoded = encode_trace(tokenizer, trace, max(buckets))
        if encoded is not None:
            by_bucket.setdefault(bucket_of(len(encoded[0]), buckets), []).append(encoded)
    if not by_bucket:
        raise ValueError("no trace fits the largest bucket; nothing to fine-tune on")
    rng = random.Random(seed)
    cursors = {b: 0 for b in by_bucket}
    for examples in by_bucket.values():
        rng.shuffle(examples)

    def next_batch(bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        examples = by_bucket[bucket]
        ids = torch.full((batch_size, bucket), pad, dtype=torch.int32)
        labels = torch.full((batch_size, bucket), IGNORE_INDEX, dtype=torch.int64)
        for row in range(batch_size):
            tokens, prompt_len = examples[cursors[bucket] % len(examples)]
            cursors[bucket] += 1
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
            labels[row, prompt_len : len(tokens)] = torch.tensor(tokens[prompt_len:])
        return ids, labels

    used = sorted(by_bucket)
    # step 0 compiles the first bucket without optimizer state; then each bucket once with state
    order = [used[0], *used]
    weights = [len(by_bucket[b]) for b in used]
    order += rng.choices(used, weights=weights, k=max(0, steps - len(order)))
    pairs = [next_batch(b) for b in order[:steps]]
    return Batches([p[0] for p in pairs], [p[1] for p in pairs], warmup_steps=min(len(used) + 1, steps))


def trace_length_stats(tokenizer, traces: list[Trace], buckets: tuple[int, ...]) -> dict:
    counts = Counter()
    for trace in traces:
        encoded = encode_trace(tokenizer, trace, max(buckets))
        counts["too_long" if encoded is None else f"bucket_{bucket_of(len(encoded[0]), buckets)}"] += 1
    return dict(counts)
