"""Benchmark of the code model against the rules-only pipeline, and of its training throughput.

    .venv/bin/python bench/model.py [--model DIR] [--limit 40] [--validate 8] [--throughput-steps 6]

Quality, on the held-out test split of the dataset the model was trained on (never trained on),
three arms on the same functions (each function is its import context + the function, as a file):
  rules-only   the pipeline without a model (`Pipeline(proposer=None)`, unsafe fixes on, as the
               rule traces were made),
  model-only   the code model alone on the original function (greedy, bounded),
  rules+model  the pipeline with the model proposing for what the rules left.
Columns: parse rate (model output whose edits apply and give a function that parses), exact match (the migrated function equals the
trace's target, imports included), no kb finding left, and the pipeline's validation (XLA
execution check + generated original-vs-migrated tests) on the first `--validate` functions.

Throughput: the `small` configuration's pretraining step on torch_xla (PJRT_DEVICE=CPU) and eagerly
on the CPU, random tokens, each in its own process: steady tokens/s after the compile warm-up and
compile counts. Training wall time: what the model's own `xlaport.json` recorded (base + LoRA);
when it was trained with fewer steps than the default, the default's time is extrapolated from
its measured steady step time, and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve()


# --- quality ----------------------------------------------------------------------------------------
def _function_of(module: str) -> tuple[list[str], str] | None:
    from xlaport.model.prompts import split_target

    try:
        return split_target(module)
    except SyntaxError:
        return None


def _normalized(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def _exact(output: tuple[list[str], str] | None, context_imports: list[str], target: str) -> bool:
    """The output's function and the imports it added equal the target's."""
    if output is None:
        return False
    from xlaport.model.prompts import split_target

    target_imports, target_function = split_target(target)
    added = sorted(set(output[0]) - set(context_imports))
    return _normalized(output[1]) == _normalized(target_function) and added == sorted(target_imports)


def _findings_left(module: str) -> int | None:
    from xlaport.kb import SourceError, lint_source

    try:
        return len(lint_source(module))
    except SourceError:
        return None


def select_traces(traces: list, limit: int) -> list:
    """Up to `limit` traces, round-robin over kinds, in a stable order."""
    by_kind: dict[str, list] = {}
    for trace in sorted(traces, key=lambda t: (t.kind, t.file, t.name)):
        by_kind.setdefault(trace.kind, []).append(trace)
    chosen = []
    while len(chosen) < limit and any(by_kind.values()):
        for kind in sorted(by_kind):
            if by_kind[kind] and len(chosen) < limit:
                chosen.append(by_kind[kind].pop(0))
    return chosen


def quality(model_dir: Path, limit: int, validate: int, log) -> dict:
    from xlaport.model.artifacts import read_meta
    from xlaport.model.prompts import split_target
    from xlaport.model.proposer import add_imports, load_proposer
    from xlaport.serve.pipeline import Pipeline
    from xlaport.serve.results import Evidence, SuggestOptions
    from xlaport.training.dataset import load_dataset
    from xlaport.training.traces import module_text

    meta = read_meta(model_dir) or {}
    dataset = load_dataset(Path(meta["dataset"]))
    tests = select_traces(dataset.split_traces("test"), limit)
    log(f"{len(tests)} test functions ({dict(Counter(t.kind for t in tests))}) from {meta['dataset']}")
    model = load_proposer(model_dir)
    rules_only = Pipeline(proposer=None)
    with_model = Pipeline(index=rules_only.index, proposer=model)
    options = SuggestOptions(unsafe_fixes=True, k=2)
    rows = []
    for number, trace in enumerate(tests, 1):
        module = module_text(trace.imports, trace.original)
        context_imports = split_target(module)[0]
        row = {"kind": trace.kind, "file": trace.file, "name": trace.name, "codes": trace.codes}
        start = time.perf_counter()
        rules_patch = rules_only.suggest(module, "snippet.py", options)
        row["rules"] = _arm(rules_patch.migrated, context_imports, trace.target, parsed=True)
        row["rules"]["seconds"] = round(time.perf_counter() - start, 2)

        start = time.perf_counter()
        codes = [f.code for f in _lint(module)]
        candidate = model.candidate(trace.original, trace.imports, codes, trace.name)
        parses = candidate.code is not None or not any(
            reason in (candidate.rejected_reason or "")
            for reason in ("does not apply", "does not parse", "no complete function", "too long")
        )
        output = add_imports(module_text(trace.imports, candidate.code), candidate.imports) if candidate.code else module
        row["model"] = _arm(output, context_imports, trace.target, parsed=parses)
        row["model"].update(
            accepted=candidate.accepted, rejected=candidate.rejected_reason, tokens=candidate.new_tokens,
            seconds=round(time.perf_counter() - start, 2),
        )

        start = time.perf_counter()
        combined = with_model.suggest(module, "snippet.py", options)
        row["rules+model"] = _arm(combined.migrated, context_imports, trace.target, parsed=True)
        row["rules+model"]["model_used"] = bool(combined.evidence.rewritten_functions)
        row["rules+model"]["seconds"] = round(time.perf_counter() - start, 2)

        if number <= validate:
            for arm, migrated in (("rules", rules_patch.migrated), ("model", output), ("rules+model", combined.migrated)):
                if migrated == module:
                    row[arm]["validation"] = "no change"
                    continue
                start = time.perf_counter()
                evidence = rules_only.validate_file(
                    module, migrated, "snippet.py", SuggestOptions(validate_patch=True, timeout_s=300),
                    Evidence(codes_applied=[], codes_left=[]),
                )
                row[arm]["validation"] = evidence.status
                row[arm]["checks"] = {c.name: c.passed for c in evidence.checks}
                row[arm]["validation_s"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        log(
            f"[{number}/{len(tests)}] {trace.kind:<8} {trace.name:<40} "
            + "  ".join(f"{arm}: exact={row[arm]['exact']} left={row[arm]['findings_left']}" for arm in ARMS)
        )
    return {"model": model_dir.name, "dataset": meta["dataset"], "functions": rows, "summary": summarize(rows, validate)}


ARMS = ("rules", "model", "rules+model")


def _lint(module: str):
    from xlaport.kb import SourceError, lint_source

    try:
        return lint_source(module)
    except SourceError:
        return []


def _arm(migrated: str, context_imports: list[str], target: str, parsed: bool) -> dict:
    output = _function_of(migrated)
    left = _findings_left(migrated)
    return {"parsed": parsed and output is not None, "exact": _exact(output, context_imports, target), "findings_left": left}


def summarize(rows: list[dict], validate: int) -> dict:
    summary = {}
    for arm in ARMS:
        n = len(rows)
        validated = [r[arm] for r in rows[:validate]]
        summary[arm] = {
            "functions": n,
            "parse_rate": _share(sum(r[arm]["parsed"] for r in rows), n),
            "exact_match": _share(sum(r[arm]["exact"] for r in rows), n),
            "no_finding_left": _share(sum(r[arm]["findings_left"] == 0 for r in rows), n),
            "validated": _share(sum(v.get("validation") == "validated" for v in validated), len(validated)),
            "xla_check_passed": _share(sum(v.get("checks", {}).get("xla_check") is True for v in validated), len(validated)),
            "tests_passed": _share(sum(v.get("checks", {}).get("generated_tests") is True for v in validated), len(validated)),
            "validation_runs": len(validated),
        }
        by_kind = Counter(r["kind"] for r in rows)
        summary[arm]["exact_by_kind"] = {
            kind: _share(sum(r[arm]["exact"] for r in rows if r["kind"] == kind), count) for kind, count in by_kind.items()
        }
        summary[arm]["no_finding_by_kind"] = {
            kind: _share(sum(r[arm]["findings_left"] == 0 for r in rows if r["kind"] == kind), count)
            for kind, count in by_kind.items()
        }
    summary["model"]["accepted"] = _share(sum(r["model"]["accepted"] for r in rows), len(rows))
    summary["model"]["rejections"] = dict(Counter(_reason_kind(r["model"]["rejected"]) for r in rows if r["model"]["rejected"]))
    summary["rules+model"]["model_used"] = sum(r["rules+model"]["model_used"] for r in rows)
    return summary


def _reason_kind(reason: str) -> str:
    for key in ("does not parse", "signature", "changes nothing", "not exactly one function", "no complete function", "too long"):
        if key in reason:
            return key
    return reason[:40]


def _share(count: int, total: int) -> str:
    return f"{count}/{total} ({100 * count / total:.0f}%)" if total else "–"


# --- throughput ----------------------------------------------------------------------------------------
def throughput_child(device: str, size_name: str, steps: int) -> dict:
    """One pretraining run of `steps` random-token batches of the size's shape (runs in its own process)."""
    import torch
    from xlaport.training.configs import get_size
    from xlaport.training.dataset import Batches
    from xlaport.training.loop import LoopConfig, train
    from xlaport.training.workflow import new_base_model

    class _Tokenizer:  # new_base_model only needs the sizes and special ids
        def __init__(self, n: int) -> None:
            self.n, self.eos_token_id, self.pad_token_id = n, 0, 1

        def __len__(self) -> int:
            return self.n

    size = get_size(size_name)
    torch.manual_seed(0)
    model = new_base_model(size, _Tokenizer(size.vocab_size))
    shape = (size.batch_size, size.context)
    batches = Batches([torch.randint(2, size.vocab_size, shape, dtype=torch.int32) for _ in range(steps)], [None] * steps, 2)
    result = train(model, batches, LoopConfig(steps=steps, lr=1e-3, warmup_steps=1, log_every=10**6, device=device), log=lambda m: None)
    data = result.to_dict()
    data["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 2)
    data["shape"] = list(shape)
    data["steady_step_s"] = round(result.steady_s / max(1, steps - result.compile_warmup_steps), 2)
    return data


def throughput(size_name: str, steps: int, log) -> dict:
    results = {}
    for device in ("xla", "eager"):
        env = {**os.environ, "PJRT_DEVICE": "CPU"} if device == "xla" else {**os.environ, "USE_TORCH_XLA": "0"}
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(HERE), "--throughput-child", device, "--size", size_name, "--throughput-steps", str(steps)],
            capture_output=True, text=True, env=env, check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"throughput run on {device} failed:\n{proc.stderr[-2000:]}")
        results[device] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[device]["process_s"] = round(time.perf_counter() - start, 1)
        log(f"throughput {device}: {results[device]['tokens_per_s']} tokens/s")
    return results


# --- training wall time ----------------------------------------------------------------------------------
def training_wall(model_dir: Path) -> dict:
    from xlaport.model.artifacts import read_meta
    from xlaport.training.configs import get_size

    lora = read_meta(model_dir) or {}
    base = read_meta(Path(lora.get("base_model", ""))) or {}
    out = {}
    for name, meta, default_steps in (
        ("base", base, "base_steps"),
        ("lora", lora, "lora_steps"),
    ):
        train = meta.get("train")
        if not train:
            continue
        size = get_size(meta.get("size", "small"))
        default = getattr(size, default_steps)
        ran = train["steps"]
        steady_steps = max(1, ran - train["start_step"] - train["compile_warmup_steps"])
        per_step = train["steady_s"] / steady_steps
        warmup_s = train["wall_s"] - train["steady_s"]
        out[name] = {
            "size": size.name,
            "steps": ran,
            "default_steps": default,
            "wall_s": train["wall_s"],
            "steady_step_s": round(per_step, 2),
            "tokens_per_s": train["tokens_per_s"],
            "compiles": train["compiles"],
            "compiles_after_warmup": train["compiles_after_warmup"],
            "default_wall_s": round(train["wall_s"] if ran == default else warmup_s + per_step * (default - train["compile_warmup_steps"]), 1),
            "extrapolated": ran != default,
            "first_loss": _losses(train)[0] if train["losses"] else None,
            "last_loss": _losses(train)[-1] if train["losses"] else None,
        }
    return out


def _losses(train: dict) -> list[float]:
    """Losses in step order (JSON keys are strings, and xlaport.json sorts them as strings)."""
    return [loss for _, loss in sorted((int(step), loss) for step, loss in train["losses"].items())]


# --- report -------------------------------------------------------------------------------------------
def render(results: dict) -> str:
    lines = []
    if "quality" in results:
        q = results["quality"]
        s = q["summary"]
        lines += [
            f"## Held-out test split: {s['rules']['functions']} functions (model {q['model']})",
            "",
            "| arm | parse rate | exact match | no kb finding left | validated | XLA check passed | generated tests passed |",
            "|---|---|---|---|---|---|---|",
        ]
        for arm in ARMS:
            a = s[arm]
            lines.append(
                f"| {arm} | {a['parse_rate']} | {a['exact_match']} | {a['no_finding_left']} | {a['validated']} | "
                f"{a['xla_check_passed']} | {a['tests_passed']} |"
            )
        lines += ["", "Exact match by trace kind: " + "; ".join(f"{arm} {s[arm]['exact_by_kind']}" for arm in ARMS)]
        lines += ["No finding left by trace kind: " + "; ".join(f"{arm} {s[arm]['no_finding_by_kind']}" for arm in ARMS)]
        lines += [
            f"Model-only candidates accepted by the proposer's checks: {s['model']['accepted']}; "
            f"rejections: {s['model']['rejections']}; the rules+model pipeline used a model rewrite in "
            f"{s['rules+model']['model_used']} function(s)."
        ]
    if "throughput" in results:
        lines += ["", "## Training throughput (pretraining step, random tokens)", "", "| device | shape | params (M) | tokens/s (steady) | s/step | compiles | after warm-up | process s |", "|---|---|---|---|---|---|---|---|"]
        for t in results["throughput"].values():
            lines.append(
                f"| {t['device']} | {t['shape']} | {t['params_m']} | {t['tokens_per_s']} | {t['steady_step_s']} | "
                f"{t['compiles']} | {t['compiles_after_warmup']} | {t['process_s']} |"
            )
    if "training" in results:
        lines += ["", "## Training wall time (from the model's xlaport.json)", "", "| stage | steps run | default steps | wall s | s/step | tokens/s | compiles (after warm-up) | default wall s | loss first → last |", "|---|---|---|---|---|---|---|---|---|"]
        for stage, t in results["training"].items():
            mark = " (extrapolated)" if t["extrapolated"] else ""
            lines.append(
                f"| {stage} ({t['size']}) | {t['steps']} | {t['default_steps']} | {t['wall_s']} | {t['steady_step_s']} | "
                f"{t['tokens_per_s']} | {t['compiles']} ({t['compiles_after_warmup']}) | {t['default_wall_s']}{mark} | "
                f"{t['first_loss']} → {t['last_loss']} |"
            )
        total = sum(t["default_wall_s"] for t in results["training"].values())
        lines.append(f"\nDefault base + LoRA training: {total / 60:.1f} min")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="LoRA model directory (default: the newest)")
    parser.add_argument("--limit", type=int, default=40, help="test functions to evaluate")
    parser.add_argument("--validate", type=int, default=8, help="of those, how many go through validation")
    parser.add_argument("--size", default="small", help="configuration whose throughput is measured")
    parser.add_argument("--throughput-steps", type=int, default=6)
    parser.add_argument("--skip", nargs="*", default=[], choices=["quality", "throughput", "training"])
    parser.add_argument("--json", type=Path, help="also write all results here")
    parser.add_argument("--throughput-child", choices=["xla", "eager"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.throughput_child:
        print(json.dumps(throughput_child(args.throughput_child, args.size, args.throughput_steps)))
        return 0

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    from xlaport.model.proposer import find_model_dir, no_model_message

    model_dir = find_model_dir(args.model)
    results: dict = {}
    if model_dir is None and not {"quality", "training"} <= set(args.skip):
        raise SystemExit(no_model_message())
    if "training" not in args.skip:
        results["training"] = training_wall(model_dir)
    if "throughput" not in args.skip:
        results["throughput"] = throughput(args.size, args.throughput_steps, log)
    if "quality" not in args.skip:
        results["quality"] = quality(model_dir, args.limit, args.validate, log)
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
