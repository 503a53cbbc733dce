"""Search benchmark: does `xlaport kb search` put the right kb entry first for an error a user pastes?

    .venv/bin/python bench/search.py [--labels bench/search_labels.jsonl ...] [--split dev|test|all]
        [--lexical-weight W] [--sweep] [--show-misses] [--json out.json]

Several label files (`--labels A B`) are scored in one run, each file's splits on their own rows; `--all-labels`
scores every bench/search_labels*.jsonl.

bench/search_labels.jsonl holds errors and warnings as torch, torch_xla, transformers and the XLA debug
output print them (most were triggered on this machine, the rest copied from the message in the library's
source; `source` says which), alone, with a traceback or in a log, each with the kb entries that fix it
(`codes`: any of them counts as right; a message many entries produce lists the common causes only, and a
traceback whose user line names the cause lists that entry). Items of one `family` (variants of one
message) share a `split`: `dev` was used to choose the fusion weight, `test` was not looked at while tuning.

For each split it reports top-1 and top-3 (the share of queries whose first / first three results contain a
right code), the same with the embeddings alone (lexical weight 0) and with BM25 alone (embedding scores
ignored), and the query time. `--sweep` prints top-1/top-3 on dev for a range of lexical weights.

A benchmark, not a test: exits 0 whatever the numbers are, 2 on its own errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LABELS = ROOT / "bench" / "search_labels.jsonl"
SWEEP = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5)


def load_labels(path: Path) -> list[dict]:
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for item in items:
        if not item.get("codes") or not item.get("query") or item.get("split") not in {"dev", "test"}:
            raise ValueError(f"label {item.get('id')}: needs codes, query and split dev|test")
    return items


def rank_codes(index, items: list[dict], lexical_weight: float | None, embeddings: bool = True) -> list[list[str]]:
    """The top three codes of each item's query, with the given fusion weight (None: the module's)."""
    from xlaport.kb import retrieval

    saved = retrieval.LEXICAL_WEIGHT
    index._ranked.clear()  # the index keeps each text's ranking, made under the weight of its first search
    try:
        if lexical_weight is not None:
            retrieval.LEXICAL_WEIGHT = lexical_weight
        if embeddings:
            return [[hit.code for hit in hits] for hits in index.search_many([i["query"] for i in items], 3)]
        ranked = []
        for item in items:
            scores = index.lexical_scores(item["query"])
            order = sorted(range(len(scores)), key=lambda i: (-scores[i], index._codes[i]))[:3]
            ranked.append([index._codes[i] for i in order])
        return ranked
    finally:
        retrieval.LEXICAL_WEIGHT = saved
        index._ranked.clear()


def score(items: list[dict], ranked: list[list[str]]) -> dict:
    top1 = sum(bool(r[:1]) and r[0] in i["codes"] for i, r in zip(items, ranked, strict=True))
    top3 = sum(bool(set(r[:3]) & set(i["codes"])) for i, r in zip(items, ranked, strict=True))
    n = len(items)
    return {
        "n": n,
        "top1": top1,
        "top3": top3,
        "top1_rate": top1 / n if n else 0.0,
        "top3_rate": top3 / n if n else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=Path, nargs="+", default=[DEFAULT_LABELS])
    parser.add_argument("--all-labels", action="store_true", help="every bench/search_labels*.jsonl, in name order")
    parser.add_argument("--split", choices=("dev", "test", "all"), default="all")
    parser.add_argument("--lexical-weight", type=float, default=None, help="override retrieval.LEXICAL_WEIGHT")
    parser.add_argument(
        "--failing-line-weight", type=float, default=None, help="override retrieval.FAILING_LINE_WEIGHT (0: off)"
    )
    parser.add_argument(
        "--line-finding-bonus", type=float, default=None, help="override retrieval.LINE_FINDING_BONUS (0: off)"
    )
    parser.add_argument("--sweep", action="store_true", help="top-1/top-3 on dev for a range of lexical weights")
    parser.add_argument("--show-misses", action="store_true", help="print each query whose first result is wrong")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    paths = sorted(DEFAULT_LABELS.parent.glob("search_labels*.jsonl")) if args.all_labels else args.labels
    try:
        label_sets = {path: load_labels(path) for path in paths}
    except (OSError, ValueError) as exc:
        print(f"bench/search.py: {exc}", file=sys.stderr)
        return 2

    from xlaport.kb import retrieval

    if args.failing_line_weight is not None:
        retrieval.FAILING_LINE_WEIGHT = args.failing_line_weight
    if args.line_finding_bonus is not None:
        retrieval.LINE_FINDING_BONUS = args.line_finding_bonus
    started = time.perf_counter()
    index = retrieval.FixIndex.load_or_build()
    load_s = time.perf_counter() - started
    index.search("warm up", 1)  # the encoder's weights
    splits = ("dev", "test") if args.split == "all" else (args.split,)
    weight = retrieval.LEXICAL_WEIGHT if args.lexical_weight is None else args.lexical_weight
    results: dict = {"labels": [str(p) for p in paths], "lexical_weight": weight, "index_load_s": round(load_s, 3)}
    results["files"] = {}

    if args.sweep:
        dev = [i for items in label_sets.values() for i in items if i["split"] == "dev"]
        results["sweep_dev"] = {}
        print(f"{'weight':>7} {'top-1':>12} {'top-3':>12}   (dev of all files, n={len(dev)})")
        for w in SWEEP:
            s = score(dev, rank_codes(index, dev, w))
            results["sweep_dev"][str(w)] = s
            print(
                f"{w:>7.2f} {s['top1']:>4}/{s['n']} {s['top1_rate']:>5.0%} {s['top3']:>4}/{s['n']} {s['top3_rate']:>5.0%}"
            )
        print()

    print(f"{'labels':<20} {'split':<6} {'method':<22} {'n':>3} {'top-1':>11} {'top-3':>11}")
    query_ms = []
    for path, items in label_sets.items():
        name = path.stem.removeprefix("search_labels").lstrip("_") or "main"
        results["files"][name] = {}
        for split in splits:
            subset = [i for i in items if i["split"] == split]
            if not subset:
                continue
            index._vectors.clear()  # time each split's queries from cold (no cached query embeddings)
            started = time.perf_counter()
            fused = rank_codes(index, subset, weight)
            query_ms.append((time.perf_counter() - started) * 1000 / len(subset))
            rows = {
                f"fused (w={weight:g})": score(subset, fused),
                "embeddings only": score(subset, rank_codes(index, subset, 0.0)),
                "BM25 only": score(subset, rank_codes(index, subset, None, embeddings=False)),
            }
            for method, s in rows.items():
                print(
                    f"{name:<20} {split:<6} {method:<22} {s['n']:>3} {s['top1']:>4} {s['top1_rate']:>5.0%} "
                    f"{s['top3']:>4} {s['top3_rate']:>5.0%}"
                )
            misses = [
                {"id": i["id"], "codes": i["codes"], "got": r, "query": i["query"].splitlines()[-1][:110]}
                for i, r in zip(subset, fused, strict=True)
                if not (r and r[0] in i["codes"])
            ]
            results["files"][name][split] = {"methods": rows, "query_ms": round(query_ms[-1], 1), "misses": misses}
            if args.show_misses:
                for miss in misses:
                    print(
                        f"    miss #{miss['id']}: want {'/'.join(miss['codes'])}, got {' '.join(miss['got'])}: "
                        f"{miss['query']}"
                    )
    mean_ms = sum(query_ms) / max(len(query_ms), 1)
    print(f"\nindex load {load_s:.2f} s; a query (encoding included) {mean_ms:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
