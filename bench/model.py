"""Does the code model fix what the rules leave? Rules-only vs model-only vs rules+model, and training throughput.

    .venv/bin/python bench/model.py --model DIR [--limit 24] [--validate 40] [--throughput-steps 4] [--json out.json]
    .venv/bin/python bench/model.py --throughput-only [--base DIR] [--json out.json]

Held-out functions with manual findings (never trained on):
  - the test split of the model's dataset (synthesized pairs, split by source file: no test file's
    function is in training), up to `--limit`, the kinds taken in turn;
  - tests/fixtures/model_heldout/*/ (input.py, expected.py): functions written here, modelled on
    real training scripts (MNIST, DCGAN, ImageNet examples).
Each is a file (imports + function). Arms, on the same files:
  rules-only   Pipeline(proposer=None).suggest, unsafe fixes on (`--safe-fixes`: suggest's default, safe only);
  model-only   the code model alone on the original function (greedy, bounded);
  rules+model  Pipeline(proposer=model).suggest: rules first, the model on the findings left.
Columns: manual findings resolved (multiset of kb codes: manual findings of the original no longer
reported), proposals (model-only: candidates accepted by the model's checks — parse, one function,
same signature, a finding gone; rules+model: rewrites the pipeline kept), validated (of those, the
share whose file passes the pipeline's validation: XLA execution check + generated differential
tests; at most `--validate` distinct files are validated), exact (the function equals the
target function, whitespace aside), median latency per function. Greedy generation is memoized per
prompt (the same output either way), so rules+model latency leaves out generation where the rules
did not change the function first.
Throughput: LoRA training steps of the `cpu` configuration's shape (4x256) on the model's base,
random tokens, through torch_xla (PJRT_DEVICE=CPU) and eagerly on the CPU, each in a child process
(`--throughput-json FILE` reuses an earlier run's numbers instead, and says so in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve()
FIXTURES = HERE.parent.parent / "tests" / "fixtures" / "model_heldout"


def _normalized(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def _manual(findings) -> Counter:
    return Counter(f.code for f in findings if not f.fixable)


def held_out(model_dir: Path, limit: int) -> list[dict]:
    """[{name, source, function, target_function, target_imports, origin}] of the held-out set."""
    import ast

    from xlaport.model.artifacts import read_meta
    from xlaport.model.prompts import split_target
    from xlaport.model.proposer import add_imports
    from xlaport.training.dataset import load_dataset
    from xlaport.training.traces import module_text

    items = []
    dataset = (read_meta(model_dir) or {}).get("dataset")
    if dataset and Path(dataset).is_dir():
        by_kind: dict[str, list] = {}
        for trace in load_dataset(Path(dataset)).split_traces("test"):
            if trace.kind.startswith("synth:"):
                by_kind.setdefault(trace.kind, []).append(trace)
        chosen = []
        while len(chosen) < limit and any(by_kind.values()):
            for group in by_kind.values():
                if group and len(chosen) < limit:
                    chosen.append(group.pop(0))
        for trace in chosen:
            imports, function = split_target(trace.target)
            name = ast.parse(trace.original).body[0].name
            items.append(
                {
                    "name": f"{trace.file}:{trace.name}",
                    "origin": trace.kind,
                    "source": module_text(trace.imports, trace.original),
                    "function": name,
                    "target_function": function,
                    "target_imports": imports,
                    "target_source": add_imports(module_text(trace.imports, function), imports),
                }
            )
    for directory in sorted(p for p in FIXTURES.iterdir() if p.is_dir()) if FIXTURES.is_dir() else []:
        source = (directory / "input.py").read_text(encoding="utf-8")
        expected = (directory / "expected.py").read_text(encoding="utf-8")
        from xlaport.model.spans import function_sources

        changed = [n for n, text in function_sources(source).items() if function_sources(expected).get(n) != text]
        target = function_sources(expected)[changed[0]]
        before = {ast.dump(n) for n in ast.parse(source).body if isinstance(n, (ast.Import, ast.ImportFrom))}
        added = [
            ast.unparse(n)
            for n in ast.parse(expected).body
            if isinstance(n, (ast.Import, ast.ImportFrom)) and ast.dump(n) not in before
        ]
        items.append(
            {
                "name": directory.name,
                "origin": "fixture",
                "source": source,
                "function": changed[0],
                "target_function": textwrap.dedent(target),
                "target_imports": added,
                "target_source": expected,
                "driver": (directory / "driver.py").read_text(encoding="utf-8")
                if (directory / "driver.py").is_file()
                else None,
            }
        )
    return items


def run_quality(
    model_dir: Path, limit: int, validate: int, log, max_new_tokens: int | None = None, unsafe: bool = True
) -> dict:
    from xlaport.kb import lint_source
    from xlaport.model.proposer import load_proposer
    from xlaport.model.spans import function_sources
    from xlaport.serve.pipeline import Pipeline, SuggestOptions

    start = time.perf_counter()
    model = load_proposer(model_dir)
    load_s = time.perf_counter() - start
    if max_new_tokens:
        model.max_new_tokens = max_new_tokens
    items = held_out(model_dir, limit)
    log(f"{len(items)} held-out functions; model loaded in {load_s:.1f} s")
    rules_pipeline, model_pipeline = Pipeline(proposer=None), Pipeline(proposer=model)
    _memoize_generation(model)
    verdicts: dict[tuple[str, str], str] = {}  # (original, migrated) -> "status: reason"

    def validated(source: str, migrated: str, driver: str | None) -> str | None:
        """`validate_file` of `migrated` (memoized; at most `validate` distinct files), or None past the limit."""
        key = (source, migrated)
        if key not in verdicts:
            if len(verdicts) >= validate:
                return None
            verdicts[key] = validate_file(source, migrated, driver)
        return verdicts[key]

    def exact(migrated: str, item: dict) -> bool:
        function = function_sources(migrated).get(item["function"])
        return function is not None and _normalized(textwrap.dedent(function)) == _normalized(item["target_function"])

    rows = []
    for n, item in enumerate(items):
        source = item["source"]
        original = lint_source(source)
        manual = _manual(original)
        row = {"name": item["name"], "origin": item["origin"], "manual": sum(manual.values())}

        t = time.perf_counter()
        patch = rules_pipeline.suggest(source, "f.py", SuggestOptions(unsafe_fixes=unsafe, k=0))
        row["rules_s"] = time.perf_counter() - t
        row["rules_resolved"] = sum((manual - _manual(lint_source(patch.migrated))).values())
        row["rules_exact"] = exact(patch.migrated, item)

        t = time.perf_counter()
        findings = [f for f in original if not f.fixable]
        candidate, new_source = model.rewrite_in_file(source, item["function"], findings, [])
        row["model_s"] = time.perf_counter() - t
        row["model_accepted"] = bool(candidate and candidate.accepted and new_source)
        row["model_reason"] = (
            None if row["model_accepted"] else (candidate.rejected_reason if candidate else "no such function")
        )
        row["model_raw"] = candidate.raw if candidate else ""  # the edit script, for reading the rejections
        row["model_tokens"] = candidate.new_tokens if candidate else 0
        row["model_gen_s"] = candidate.seconds if candidate else 0.0
        row["model_resolved"] = (
            sum((manual - _manual(lint_source(new_source))).values()) if row["model_accepted"] else 0
        )
        row["model_exact"] = bool(row["model_accepted"] and exact(new_source, item))
        row["model_imports_exact"] = bool(
            row["model_exact"] and sorted(candidate.imports) == sorted(item["target_imports"])
        )
        if row["model_accepted"]:
            row["model_validation"] = validated(source, new_source, item.get("driver"))
            # the control: the right answer, through the same validation
            row["target_validation"] = validated(source, item["target_source"], item.get("driver"))

        t = time.perf_counter()
        both = model_pipeline.suggest(source, "f.py", SuggestOptions(unsafe_fixes=unsafe, k=0))
        row["both_s"] = time.perf_counter() - t
        row["both_resolved"] = sum((manual - _manual(lint_source(both.migrated))).values())
        row["both_exact"] = exact(both.migrated, item)
        row["both_proposals"] = len(both.evidence.rewritten_functions)
        row["both_notes"] = [note for note in both.notes if "code model" in note or "proposal" in note]
        if row["both_proposals"]:
            row["both_validation"] = validated(source, both.migrated, item.get("driver"))
            row["target_validation"] = validated(source, item["target_source"], item.get("driver"))
        if item.get("driver"):  # the control on every fixture: does the validator pass the right answer?
            row["target_validation"] = validated(source, item["target_source"], item["driver"])
        # a proposal that does not validate is not accepted: its findings count as resolved only when it did
        # (rules+model then falls back to the rules' patch, as the pipeline does)
        row["rules_validated_resolved"] = row["rules_resolved"]
        row["model_validated_resolved"] = row["model_resolved"] if row.get("model_validation") == "validated" else 0
        both_ok = not row["both_proposals"] or row.get("both_validation") == "validated"
        row["both_validated_resolved"] = row["both_resolved"] if both_ok else row["rules_resolved"]
        rows.append(row)
        log(
            f"[{n + 1}/{len(items)}] {item['name']}: manual {row['manual']}, resolved rules {row['rules_resolved']} "
            f"model {row['model_resolved']} both {row['both_resolved']}; model "
            f"{'ok' if row['model_accepted'] else row['model_reason']}"
            + (
                f", validation {row.get('both_validation') or row.get('model_validation')}"
                if row["model_accepted"] or row["both_proposals"]
                else ""
            )
        )
    return {
        "model": str(model_dir),
        "model_meta": {k: v for k, v in (read_meta_of(model_dir)).items() if k != "train"},
        "load_s": round(load_s, 1),
        "max_new_tokens": model.max_new_tokens,
        "unsafe_fixes": unsafe,
        "rows": rows,
        "summary": summarize(rows),
    }


def is_script(source: str) -> bool:
    """Whether running the file does something: a `__main__` guard or a top-level call."""
    import ast

    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return True
    return False


def validate_file(original: str, migrated: str, driver: str | None = None) -> str:
    """The pipeline's checks on a migrated file: generated differential tests, and the XLA execution check
    where the file is a script (a module of definitions does nothing when run, so the execution check would
    reject even the right answer: "no XLA step was seen"). `driver`: a script beside the file that calls the
    function with real inputs; testgen records that call (`--record`) and replays it on both versions.
    "status" or "status: reason"."""
    import tempfile

    from xlaport.serve.checks import run_generated_tests, run_xla_check
    from xlaport.serve.results import verdict

    with tempfile.TemporaryDirectory(prefix="xlaport-bench-") as tmp:
        original_path, migrated_path = Path(tmp, "original", "f.py"), Path(tmp, "migrated", "f.py")
        for target, text in ((original_path, original), (migrated_path, migrated)):
            target.parent.mkdir(parents=True)
            target.write_text(text, encoding="utf-8")
            if driver:
                target.with_name("driver.py").write_text(driver, encoding="utf-8")
        record = "python driver.py" if driver else None
        checks = [run_generated_tests(original_path, migrated_path, Path(tmp, "tests"), record=record)]
        if is_script(migrated):
            checks.insert(0, run_xla_check(migrated_path, [], 600, 4096))
    status, reason, _ = verdict(checks)
    return f"{status}: {reason}" if reason else status


def read_meta_of(model_dir: Path) -> dict:
    from xlaport.model.artifacts import read_meta

    return read_meta(model_dir) or {}


def _memoize_generation(model) -> None:
    """Greedy generation is deterministic: the rules+model arm reuses model-only's output for the same prompt.

    Its latency then leaves out generation wherever the rules did not change the function first.
    """
    cache: dict = {}
    generate = model.generate_text

    def cached(prompt_ids: list[int], budget: int):
        key = (tuple(prompt_ids), budget)
        if key not in cache:
            cache[key] = generate(prompt_ids, budget)
        return cache[key]

    model.generate_text = cached


def summarize(rows: list[dict]) -> dict:
    manual = sum(r["manual"] for r in rows)
    tokens = sum(r["model_tokens"] for r in rows)
    gen_s = sum(r["model_gen_s"] for r in rows)
    arms = ("rules", "model", "both")

    def share(count: int, total: int) -> dict:
        return {"count": count, "total": total, "share": round(count / total, 3) if total else None}

    def validation(key: str) -> dict:
        runs = [r[key] for r in rows if r.get(key)]
        passed = sum(run == "validated" for run in runs)
        return {**share(passed, len(runs)), "statuses": dict(Counter(run.split(":")[0] for run in runs))}

    return {
        "functions": len(rows),
        "manual_findings": manual,
        "resolved": {arm: share(sum(r[f"{arm}_resolved"] for r in rows), manual) for arm in arms},
        # the acceptance measure: resolved by a patch that passed validation (rules' fixes are safe by construction)
        "validated_resolved": {arm: share(sum(r[f"{arm}_validated_resolved"] for r in rows), manual) for arm in arms},
        "exact": {arm: share(sum(r[f"{arm}_exact"] for r in rows), len(rows)) for arm in arms},
        "model_accepted": share(sum(r["model_accepted"] for r in rows), len(rows)),
        "rules_model_proposals": sum(r["both_proposals"] for r in rows),
        "validated": {arm: validation(f"{arm}_validation") for arm in ("model", "both", "target")},
        "median_s": {arm: round(statistics.median(r[f"{arm}_s"] for r in rows), 2) for arm in arms} if rows else {},
        "mean_s": {arm: round(statistics.fmean(r[f"{arm}_s"] for r in rows), 2) for arm in arms} if rows else {},
        "generation_tokens_per_s": round(tokens / gen_s, 1) if gen_s else None,
        "rejections": dict(Counter((r["model_reason"] or "")[:50] for r in rows if not r["model_accepted"])),
    }


# --- throughput ------------------------------------------------------------------------------------------
def throughput_child(device: str, base: str, steps: int) -> dict:
    """LoRA training steps of the cpu configuration's shape on `base`, random tokens (runs in its own process)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from xlaport.training.configs import get_size
    from xlaport.training.dataset import Batches
    from xlaport.training.loop import LoopConfig, train

    size = get_size("cpu")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(0)
    lora = LoraConfig(
        task_type="CAUSAL_LM", r=size.lora_r, lora_alpha=size.lora_alpha, target_modules=list(size.lora_targets)
    )
    model = get_peft_model(model, lora)
    shape = (size.batch_size, min(size.buckets))
    vocab = model.config.vocab_size
    batches = Batches([torch.randint(0, vocab, shape, dtype=torch.int32) for _ in range(steps)], [None] * steps, 2)
    config = LoopConfig(steps=steps, lr=1e-4, warmup_steps=1, log_every=10**6, device=device)
    result = train(model, batches, config, log=lambda m: None)
    data = {k: v for k, v in result.to_dict().items() if k != "losses"}
    data["shape"] = list(shape)
    data["steady_step_s"] = round(result.steady_s / max(1, steps - result.compile_warmup_steps), 2)
    return data


def throughput(base: str, steps: int, log) -> dict:
    results = {}
    for device in ("xla", "eager"):
        env = {**os.environ, "PJRT_DEVICE": "CPU"} if device == "xla" else {**os.environ, "USE_TORCH_XLA": "0"}
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(HERE), "--throughput-child", device, "--base", base, "--throughput-steps", str(steps)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"throughput run on {device} failed:\n{proc.stderr[-2000:]}")
        results[device] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[device]["process_s"] = round(time.perf_counter() - start, 1)
        log(f"throughput {device}: {results[device]['tokens_per_s']} tokens/s")
    return results


def training_record(model_dir: Path) -> dict:
    """What the model's own training recorded, and the default configuration's time extrapolated from it."""
    from xlaport.model.artifacts import read_meta
    from xlaport.training.configs import get_size

    meta = read_meta(model_dir) or {}
    train = meta.get("train") or {}
    if "steady_s" not in train:  # no training record, or an adapter exported from a checkpoint mid-run
        return {"partial": train} if train else {}
    size = get_size(meta.get("size", "cpu"))
    steady_steps = max(1, train["steps"] - train.get("start_step", 0) - train["compile_warmup_steps"])
    step_s = train["steady_s"] / steady_steps
    warmup_s = train["wall_s"] - train["steady_s"]
    return {
        "size": size.name,
        "steps": train["steps"],
        "wall_s": train["wall_s"],
        "steady_step_s": round(step_s, 2),
        "tokens_per_s": train.get("tokens_per_s"),
        "compiles": train.get("compiles"),
        "compiles_after_warmup": train.get("compiles_after_warmup"),
        "fallback_ops": train.get("fallback_ops"),
        "default_steps": size.lora_steps,
        "default_wall_s_extrapolated": round(warmup_s + step_s * (size.lora_steps - train["compile_warmup_steps"]), 0),
        "losses": train.get("losses"),
    }


def table(summary: dict) -> str:
    res, exact, val = summary["resolved"], summary["exact"], summary["validated"]
    vres = summary["validated_resolved"]

    def cell(d: dict) -> str:
        return f"{d['count']}/{d['total']} ({100 * (d['share'] or 0):.0f}%)"

    med = summary.get("median_s", {})
    rows = [
        ("rules-only", cell(res["rules"]), cell(vres["rules"]), "-", "-", cell(exact["rules"]), med.get("rules", 0)),
        (
            "model-only",
            cell(res["model"]),
            cell(vres["model"]),
            cell(summary["model_accepted"]),
            cell(val["model"]),
            cell(exact["model"]),
            med.get("model", 0),
        ),
        (
            "rules+model",
            cell(res["both"]),
            cell(vres["both"]),
            str(summary["rules_model_proposals"]),
            cell(val["both"]),
            cell(exact["both"]),
            med.get("both", 0),
        ),
    ]
    header = ("arm", "manual resolved", "and validated", "proposals", "validated", "exact", "median s/fn")
    lines = [f"{header[0]:<12} " + " ".join(f"{h:>16}" for h in header[1:])]
    lines += [f"{r[0]:<12} " + " ".join(f"{c:>16}" for c in r[1:]) for r in rows]
    lines.append(f"generation: {summary['generation_tokens_per_s']} tokens/s; rejections: {summary['rejections']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="LoRA model directory (default: the newest)")
    parser.add_argument("--limit", type=int, default=24, help="test-split functions (the fixtures come on top)")
    parser.add_argument("--validate", type=int, default=40, help="most distinct patched files to validate")
    parser.add_argument("--throughput-steps", type=int, default=4, help="0 skips the throughput runs")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--safe-fixes", action="store_true", help="rules apply only safe fixes (suggest's default)")
    parser.add_argument("--max-new-tokens", type=int, help="generation bound (default: the model's own)")
    parser.add_argument("--throughput-json", type=Path, help="reuse the throughput of an earlier run's JSON")
    parser.add_argument("--throughput-only", action="store_true", help="only the training throughput runs")
    parser.add_argument("--throughput-child", choices=["xla", "eager"], help=argparse.SUPPRESS)
    parser.add_argument("--base", help="base model directory for --throughput-only (default: SmolLM2-135M)")
    args = parser.parse_args(argv)
    if args.throughput_child:
        print(json.dumps(throughput_child(args.throughput_child, args.base, args.throughput_steps)))
        return 0
    os.environ.setdefault("USE_TORCH_XLA", "0")  # serving and linting run eagerly; the XLA child sets its own

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    from xlaport.model.proposer import base_model_of, find_model_dir

    if args.throughput_only:
        from xlaport.model.base import default_base_model

        base = str(args.base or default_base_model(log=log))
        results = {"throughput": throughput(base, args.throughput_steps or 4, log)}
    else:
        model_dir = find_model_dir(args.model)
        if model_dir is None:
            raise SystemExit("no LoRA model: train one with `xlaport train lora` or pass --model DIR")
        results = {
            "quality": run_quality(
                model_dir, args.limit, args.validate, log, args.max_new_tokens, unsafe=not args.safe_fixes
            )
        }
        if args.json:  # the quality run is the slow part: keep it even if what follows fails
            args.json.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
        results["training"] = training_record(model_dir)
        if args.throughput_json:
            earlier = json.loads(args.throughput_json.read_text(encoding="utf-8"))
            results["throughput"] = earlier["throughput"]
            results["throughput_source"] = str(args.throughput_json)
        elif args.throughput_steps:
            results["throughput"] = throughput(str(base_model_of(model_dir)), args.throughput_steps, log)
        print(table(results["quality"]["summary"]))
    if results.get("training", {}).get("wall_s"):
        tr = results["training"]
        print(
            f"training ({tr['size']}, {tr['steps']} steps): {tr['wall_s']} s wall, {tr['steady_step_s']} s/step steady, "
            f"{tr['tokens_per_s']} tokens/s, compiles {tr['compiles']} (after warm-up {tr['compiles_after_warmup']}), "
            f"fallbacks {tr['fallback_ops'] or 0}; default {tr['default_steps']} steps extrapolated: {tr['default_wall_s_extrapolated']} s"
        )
    for device, data in results.get("throughput", {}).items():
        print(
            f"throughput {device}: {data['tokens_per_s']} tokens/s, {data['steady_step_s']} s/step, compiles {data.get('compiles')}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
