"""Precision benchmark: are `xlaport lint` findings on real code worth a user's time?

    .venv/bin/python bench/precision.py [--corpus /work/corpus] [--labels bench/precision_labels.jsonl]
        [--repos owner/name,...] [--json out.json] [--show-unlabelled N]

bench/precision_labels.jsonl holds findings of `xlaport lint` on public repositories, each labelled by a
person: true (a real problem or real migration work on a TPU, and the message says what is in the code) or
false (with a one-line reason and a false-positive class). A label records repo, commit, path, line, code
and an anchor: the stripped text of the flagged line, so a label survives line shifts. No other code of
those repositories is kept here.

The benchmark lints each labelled repository found under `--corpus/OWNER__NAME` again (through the CLI,
never xlaport's internals) and matches today's findings to the labels by (path, code) and then the same
line and anchor, the same anchor, or the same line. It reports, per rule and overall: true positives,
false positives, precision over the labelled findings still reported, findings without a label (listed,
so new rules and changed rules show up), labelled-true findings no longer reported (recall lost against
the labels) and labelled-false ones gone (noise removed); false positives by class. Findings whose JSON has
`"severity": "note"` (a lower-confidence level that the default output hides) count as not reported; labels
they match are listed as demoted. It also checks recall
on the held-in fixtures: every tests/fixtures/kb/<CODE>/ whose findings.txt is non-empty must still fire
<CODE> on its input.py (and the expected lines are counted).

A benchmark, not a test: it exits 0 whatever the numbers are, 2 on its own errors (labels unreadable,
xlaport not runnable, no labelled repository in the corpus).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LABELS = ROOT / "bench" / "precision_labels.jsonl"
DEFAULT_FIXTURES = ROOT / "tests" / "fixtures" / "kb"
LINT_TIMEOUT_S = 1800


class BenchError(Exception):
    """The benchmark itself cannot run (exit 2)."""


@dataclass(frozen=True)
class Label:
    repo: str
    commit: str
    path: str
    line: int
    code: str
    label: bool
    reason: str
    anchor: str
    fp_class: str | None = None


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    code: str
    message: str
    anchor: str
    note: bool = False  # `"severity": "note"`: hidden by default, not counted as reported


@dataclass
class Match:
    label: Label
    finding: Finding
    how: str  # "line+anchor", "anchor" or "line"


@dataclass
class RepoResult:
    repo: str
    labelled_commit: str
    corpus_commit: str | None
    seconds: float
    matches: list[Match] = field(default_factory=list)
    unlabelled: list[Finding] = field(default_factory=list)
    lost: list[Label] = field(default_factory=list)  # labelled true, no longer reported
    gone: list[Label] = field(default_factory=list)  # labelled false, no longer reported
    demoted: list[Match] = field(default_factory=list)  # lost or gone labels that now match a note
    notes: int = 0
    lint_errors: list[str] = field(default_factory=list)


# --- inputs ------------------------------------------------------------------------------
def load_labels(path: Path) -> list[Label]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BenchError(f"cannot read labels {path}: {exc}") from None
    labels = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
            labels.append(
                Label(
                    repo=row["repo"],
                    commit=row["commit"],
                    path=row["path"],
                    line=int(row["line"]),
                    code=row["code"],
                    label=bool(row["label"]),
                    reason=row["reason"],
                    anchor=row["anchor"],
                    fp_class=row.get("fp_class"),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BenchError(f"{path}:{number}: bad label ({exc.__class__.__name__}: {exc})") from None
    return labels


def corpus_dir(corpus: Path, repo: str) -> Path:
    return corpus / repo.replace("/", "__")


def corpus_commit(tree: Path) -> str | None:
    try:
        return (tree / ".corpus_commit").read_text().split()[-1]
    except (OSError, IndexError):
        return None


def line_text(tree: Path, path: str, line: int, cache: dict[str, list[str]]) -> str:
    if path not in cache:
        try:
            cache[path] = (tree / path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            cache[path] = []
    lines = cache[path]
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def run_lint(xlaport: list[str], paths: list[str], cwd: Path) -> tuple[list[dict], list[str]]:
    """`xlaport lint --format json PATHS` in `cwd`: the findings and the per-file error lines."""
    argv = [*xlaport, "lint", "--format", "json", *paths]
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=LINT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"cannot run {' '.join(argv[:3])}: {exc}") from None
    if proc.returncode not in (0, 1):  # 1: there are findings
        raise BenchError(f"xlaport lint exited {proc.returncode} in {cwd}: {proc.stderr.strip()[-500:]}")
    try:
        findings = json.loads(proc.stdout)["findings"]
    except json.JSONDecodeError as exc:
        raise BenchError(
            f"xlaport lint printed no JSON in {cwd}: {exc}; stderr: {proc.stderr.strip()[-300:]}"
        ) from None
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    return findings, errors


# --- matching ------------------------------------------------------------------------------
def match(labels: list[Label], findings: list[Finding]) -> tuple[list[Match], list[Finding], list[Label]]:
    """Pairs labels with findings of the same (path, code), each used once.

    Passes, most certain first: the same line and anchor; the same anchor (nearest line, so a label
    follows its line when code above it moved); the same line (the flagged text changed a little).
    Returns the matches, the findings without a label and the labels without a finding.
    """
    by_key_labels: dict[tuple[str, str], list[Label]] = defaultdict(list)
    by_key_findings: dict[tuple[str, str], list[Finding]] = defaultdict(list)
    for lab in labels:
        by_key_labels[(lab.path, lab.code)].append(lab)
    for f in findings:
        by_key_findings[(f.path, f.code)].append(f)
    matches: list[Match] = []
    unlabelled: list[Finding] = []
    unmatched: list[Label] = []
    for key in sorted(set(by_key_labels) | set(by_key_findings)):
        free_labels = list(by_key_labels.get(key, []))
        free_findings = list(by_key_findings.get(key, []))
        passes = (
            ("line+anchor", lambda lab, f: lab.line == f.line and lab.anchor == f.anchor),
            ("anchor", lambda lab, f: lab.anchor == f.anchor),
            ("line", lambda lab, f: lab.line == f.line),
        )
        for how, fits in passes:
            for f in list(free_findings):
                candidates = [lab for lab in free_labels if fits(lab, f)]
                if not candidates:
                    continue
                best = min(candidates, key=lambda lab: abs(lab.line - f.line))
                free_labels.remove(best)
                free_findings.remove(f)
                matches.append(Match(best, f, how))
        unlabelled.extend(free_findings)
        unmatched.extend(free_labels)
    return matches, unlabelled, unmatched


def evaluate_repo(repo: str, labels: list[Label], tree: Path, xlaport: list[str]) -> RepoResult:
    start = time.perf_counter()
    raw, errors = run_lint(xlaport, ["."], tree)
    seconds = time.perf_counter() - start
    cache: dict[str, list[str]] = {}
    findings = [
        Finding(
            f["path"],
            int(f["line"]),
            f["code"],
            f["message"],
            line_text(tree, f["path"], int(f["line"]), cache),
            f.get("severity") == "note",
        )
        for f in raw
    ]
    warnings = [f for f in findings if not f.note]
    notes = [f for f in findings if f.note]
    matches, unlabelled, unmatched = match(labels, warnings)
    demoted, _, _ = match(unmatched, notes)
    return RepoResult(
        repo=repo,
        labelled_commit=labels[0].commit,
        corpus_commit=corpus_commit(tree),
        seconds=round(seconds, 1),
        matches=matches,
        unlabelled=unlabelled,
        lost=[lab for lab in unmatched if lab.label],
        gone=[lab for lab in unmatched if not lab.label],
        demoted=demoted,
        notes=len(notes),
        lint_errors=errors,
    )


# --- fixture recall --------------------------------------------------------------------------
def fixture_recall(fixtures: Path, xlaport: list[str]) -> dict:
    """Every fixture whose findings.txt lists findings must still fire its own code on input.py."""
    if not fixtures.is_dir():
        raise BenchError(f"no fixture folder {fixtures}")
    cases = []
    for case in sorted(p for p in fixtures.iterdir() if p.is_dir()):
        listed = case / "findings.txt"
        if not (case / "input.py").exists() or not listed.exists():
            continue
        expected = {tuple(line.split()[:2]) for line in listed.read_text().splitlines() if line.strip()}
        if expected:
            cases.append((case, {(int(line), code) for line, code in expected}))
    if not cases:
        return {
            "fixtures": 0,
            "firing": 0,
            "missing": [],
            "expected_findings": 0,
            "found_findings": 0,
            "expected_findings_missing": [],
            "expected_findings_now_notes": [],
        }
    raw, _ = run_lint(xlaport, [str(case / "input.py") for case, _ in cases], fixtures)
    got: dict[str, set[tuple[int, str]]] = defaultdict(set)
    as_notes: set[str] = set()
    for f in raw:
        case_name = Path(f["path"]).resolve().parent.name
        if f.get("severity") == "note":
            as_notes.add(f"{case_name}:{f['line']} {f['code']}")
        else:
            got[case_name].add((int(f["line"]), f["code"]))
    missing, lines_missing, found = [], [], 0
    for case, expected in cases:
        fired = {code for _, code in got[case.name]}
        if case.name not in fired:
            missing.append(case.name)
        hit = expected & got[case.name]
        found += len(hit)
        lines_missing.extend(f"{case.name}:{line} {code}" for line, code in sorted(expected - hit))
    return {
        "fixtures": len(cases),
        "firing": len(cases) - len(missing),
        "missing": missing,
        "expected_findings": sum(len(e) for _, e in cases),
        "found_findings": found,
        "expected_findings_missing": lines_missing,
        "expected_findings_now_notes": [m for m in lines_missing if m in as_notes],
    }


# --- report -----------------------------------------------------------------------------------
def precision(tp: int, fp: int) -> float | None:
    return round(tp / (tp + fp), 6) if tp + fp else None


def summarize(results: list[RepoResult]) -> dict:
    per_rule: dict[str, Counter] = defaultdict(Counter)
    classes: Counter = Counter()
    for r in results:
        for m in r.matches:
            per_rule[m.label.code]["tp" if m.label.label else "fp"] += 1
            if not m.label.label:
                classes[m.label.fp_class or "unclassified"] += 1
        for f in r.unlabelled:
            per_rule[f.code]["unlabelled"] += 1
        for lab in r.lost:
            per_rule[lab.code]["lost"] += 1
        for lab in r.gone:
            per_rule[lab.code]["gone"] += 1
        for m in r.demoted:
            per_rule[m.label.code]["demoted"] += 1
    tp = sum(c["tp"] for c in per_rule.values())
    fp = sum(c["fp"] for c in per_rule.values())
    rules = {
        code: {
            "tp": c["tp"],
            "fp": c["fp"],
            "precision": precision(c["tp"], c["fp"]),
            "unlabelled": c["unlabelled"],
            "lost": c["lost"],
            "gone": c["gone"],
            "demoted": c["demoted"],
        }
        for code, c in sorted(per_rule.items())
    }
    labelled_true = tp + sum(c["lost"] for c in per_rule.values())
    return {
        "tp": tp,
        "fp": fp,
        "precision": precision(tp, fp),
        "unlabelled": sum(c["unlabelled"] for c in per_rule.values()),
        "lost": sum(c["lost"] for c in per_rule.values()),
        "gone": sum(c["gone"] for c in per_rule.values()),
        "demoted_to_notes": sum(c["demoted"] for c in per_rule.values()),
        "notes": sum(r.notes for r in results),
        "recall_vs_labels": round(tp / labelled_true, 6) if labelled_true else None,
        "fp_by_class": dict(classes.most_common()),
        "rules": rules,
    }


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def print_report(results: list[RepoResult], summary: dict, fixtures: dict, skipped: list[str], show: int) -> None:
    print("Precision of `xlaport lint` against labelled findings\n")
    print(
        f"{'repository':<47} {'commit':<9} {'TP':>4} {'FP':>4} {'prec':>7} {'new':>4} {'lost':>4} {'gone':>4} {'lint s':>7}"
    )
    for r in results:
        tp = sum(m.label.label for m in r.matches)
        fp = len(r.matches) - tp
        drift = "" if r.corpus_commit in (None, r.labelled_commit) else " *"
        print(
            f"{r.repo:<47} {r.labelled_commit[:7] + drift:<9} {tp:>4} {fp:>4} {fmt(precision(tp, fp)):>7} "
            f"{len(r.unlabelled):>4} {len(r.lost):>4} {len(r.gone):>4} {r.seconds:>7.1f}"
        )
    print(
        f"{'ALL':<47} {'':<9} {summary['tp']:>4} {summary['fp']:>4} {fmt(summary['precision']):>7} "
        f"{summary['unlabelled']:>4} {summary['lost']:>4} {summary['gone']:>4}"
    )
    if any(r.corpus_commit not in (None, r.labelled_commit) for r in results):
        print("  * the corpus holds another commit than the one labelled: matching relies on anchors")
    for repo in skipped:
        print(f"  skipped {repo}: not in the corpus")
    print(f"\n{'rule':<8} {'TP':>4} {'FP':>4} {'prec':>7} {'new':>4} {'lost':>4} {'gone':>4}")
    for code, c in summary["rules"].items():
        print(
            f"{code:<8} {c['tp']:>4} {c['fp']:>4} {fmt(c['precision']):>7} {c['unlabelled']:>4} {c['lost']:>4} {c['gone']:>4}"
        )
    print("\nfalse positives by class: " + (", ".join(f"{k} {v}" for k, v in summary["fp_by_class"].items()) or "none"))
    print(f"recall against the labels: {fmt(summary['recall_vs_labels'])} of labelled-true findings still reported")
    print(
        f"held-in fixtures: {fixtures['firing']}/{fixtures['fixtures']} fire their code"
        + (f" (missing: {', '.join(fixtures['missing'])})" if fixtures["missing"] else "")
        + f"; {fixtures['found_findings']}/{fixtures['expected_findings']} expected findings found"
        + (
            f" ({len(fixtures['expected_findings_now_notes'])} now notes)"
            if fixtures["expected_findings_now_notes"]
            else ""
        )
    )
    if summary["notes"]:
        print(
            f"notes (severity note, hidden by default): {summary['notes']}; labels they match: {summary['demoted_to_notes']}"
        )
    missing = fixtures["expected_findings_missing"]
    if missing:
        print("expected fixture findings not reported: " + ", ".join(missing))
    lost = [(r.repo, lab) for r in results for lab in r.lost]
    if lost:
        print("\nlabelled-true findings no longer reported:")
        demoted = {id(m.label) for r in results for m in r.demoted}
        for repo, lab in lost:
            print(
                f"  {repo} {lab.path}:{lab.line} {lab.code}  {lab.reason}"
                + ("  [now a note]" if id(lab) in demoted else "")
            )
    new = [(r.repo, f) for r in results for f in r.unlabelled]
    if new:
        print(f"\nfindings without a label ({len(new)}; label them in {DEFAULT_LABELS.name}):")
        for repo, f in new[:show]:
            print(f"  {repo} {f.path}:{f.line} {f.code}  {f.message[:100]}")
        if len(new) > show:
            print(f"  ... {len(new) - show} more (all in --json)")


def result_json(r: RepoResult) -> dict:
    return {
        "repo": r.repo,
        "labelled_commit": r.labelled_commit,
        "corpus_commit": r.corpus_commit,
        "lint_seconds": r.seconds,
        "tp": sum(m.label.label for m in r.matches),
        "fp": sum(not m.label.label for m in r.matches),
        "false_positives": [
            {
                "path": m.finding.path,
                "line": m.finding.line,
                "code": m.label.code,
                "fp_class": m.label.fp_class,
                "reason": m.label.reason,
            }
            for m in r.matches
            if not m.label.label
        ],
        "matched_by": dict(Counter(m.how for m in r.matches)),
        "unlabelled": [asdict(f) for f in r.unlabelled],
        "notes": r.notes,
        "demoted": [
            {"path": m.finding.path, "line": m.finding.line, "code": m.label.code, "label": m.label.label}
            for m in r.demoted
        ],
        "lost": [asdict(lab) for lab in r.lost],
        "gone": [asdict(lab) for lab in r.gone],
        "lint_errors": r.lint_errors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("/work/corpus"), help="folder of OWNER__NAME trees")
    parser.add_argument("--labels", type=Path, default=DEFAULT_LABELS)
    parser.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES)
    parser.add_argument("--repos", help="comma-separated owner/name (default: every labelled repository)")
    parser.add_argument("--xlaport", default=str(Path(sys.executable).with_name("xlaport")), help="the xlaport CLI")
    parser.add_argument("--json", type=Path, help="write the full result here")
    parser.add_argument("--show-unlabelled", type=int, default=40, help="how many unlabelled findings to print")
    opts = parser.parse_args(argv)
    try:
        labels = load_labels(opts.labels)
        by_repo: dict[str, list[Label]] = defaultdict(list)
        for lab in labels:
            by_repo[lab.repo].append(lab)
        wanted = sorted(by_repo) if not opts.repos else [r.strip() for r in opts.repos.split(",") if r.strip()]
        unknown = [r for r in wanted if r not in by_repo]
        if unknown:
            raise BenchError(f"no labels for {', '.join(unknown)}")
        xlaport = [opts.xlaport]
        results, skipped = [], []
        for repo in wanted:
            tree = corpus_dir(opts.corpus, repo)
            if not tree.is_dir():
                skipped.append(repo)
                continue
            print(f"linting {repo} ...", file=sys.stderr, flush=True)
            results.append(evaluate_repo(repo, by_repo[repo], tree, xlaport))
        if not results:
            raise BenchError(f"none of the labelled repositories is under {opts.corpus}")
        print("linting the held-in fixtures ...", file=sys.stderr, flush=True)
        fixtures = fixture_recall(opts.fixtures, xlaport)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = summarize(results)
    print_report(results, summary, fixtures, skipped, opts.show_unlabelled)
    if opts.json:
        payload = {
            "summary": summary,
            "fixtures": fixtures,
            "skipped": skipped,
            "repos": [result_json(r) for r in results],
            "labels": str(opts.labels),
            "corpus": str(opts.corpus),
        }
        opts.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
