"""The optimization stage: performance rewrites that the program's own run keeps or rejects.

    optimize(tree, validate_cmd, verify_cmd, original) -> OptimizeReport

A migrated tree whose execution check reaches L2 is the start (the study: optimize only once the consistency
checks pass, and rerun them after each change). Its check measured what a step costs (host reads per site
with their share of the step, compiles); each cost with a known rewrite is a `Candidate` (kb/optimize/: one
family per module). Candidates are tried one at a time, most costly first, on a scratch copy of the tree with
every candidate kept so far: the check runs again and, with a verify command, verify against the SAME
reference run of the original (cached after the first verify, never rerun per candidate). A candidate is
kept only when the step cost improves and the curve stays where the reference puts it (verify holds at the
baseline's level); otherwise it is rejected with the numbers. Host reads per step and compiles are counted,
not timed: the same program gives the same counts on a busy machine or a quiet one. A candidate that lowers
one (and raises none) is kept unless its step is clearly slower: one run's step time beyond the steps' spread
and SLOWER_LIMIT, confirmed by interleaved repeated runs of both trees (every candidate run slower than every
baseline run). Only when the counts are equal does the step time decide alone, and then it must be faster
over the interleaved runs (every candidate run faster than every baseline run). Without a command nothing
runs: every candidate is proposed, with its diff and the finding it answers. A code model's proposal is judged the same way: a `Candidate` (proposer "model:NAME", the file's text
before and after) in `optimize(..., extra_candidates=[...])`, tried after the rules' candidates, or given to
`Session.judge` with a baseline from `Session.run`.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xlaport.eval.check import run_check
from xlaport.eval.verify.api import verify_tree
from xlaport.eval.verify.config import VerifyConfig, level_at_least
from xlaport.kb.optimize import families

from xlaport.files import SKIP_DIRS, ChangedMeanwhile, atomic_write, copier_inside, quoting_mode

from .inputs import parse_command
from .source import unified_diff

REPORT_JSON = "xlaport-optimize.json"
REPORT_MD = "xlaport-optimize.md"
# a step this much slower than before is a regression; a step this much faster is an improvement by itself
# (XLA:CPU step times on a shared machine move by ~10-20% between runs: counts decide first)
SLOWER_LIMIT = 0.25
FASTER_ENOUGH = 0.10
# when the step time must decide (alone, or against a counted saving): runs of each tree, interleaved
# (baseline, candidate, baseline, ...). Faster (slower) means every candidate run's median step below (above)
# every baseline run's (with 3 and 3 runs, a one-sided rank test at p = 1/20) and the median of the runs at
# least MIN_GAIN lower (higher).
TIMING_RUNS = 3
MIN_GAIN = 0.05
# per-step finding kinds of the check (its READ_KINDS) that the logging family answers
LOGGING_CODES = frozenset({"XLA401", "XLA402", "XLA403", "XLA404"})


@dataclass
class Candidate:
    """One rewrite to judge: what it answers, where, the new text, and who proposed it."""

    family: str
    file: str  # relative to the tree
    finding: str  # the measured (or found) cost it answers, in words
    new_text: str
    original_text: str
    lines: list[int] = field(default_factory=list)
    proposer: str = "rules"  # "rules" or "model:NAME"
    summary: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.family}@{self.file}"

    def diff(self) -> str:
        return unified_diff(self.original_text, self.new_text, self.file)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "family": self.family,
            "file": self.file,
            "finding": self.finding,
            "lines": self.lines,
            "proposer": self.proposer,
            "summary": self.summary,
            "notes": self.notes,
            "diff": self.diff(),
        }


@dataclass
class StepCost:
    """What a step cost in one run of the check (after its warm-up steps)."""

    level: str
    steps: int
    step_ms: float | None  # median wall time of a step after warm-up
    host_reads_per_step: float  # device-to-host reads outside step closures, mean after warm-up
    host_wait_ms_per_step: float
    compiles: int
    compiles_after_warmup: int
    reasons: list[str] = field(default_factory=list)
    step_ms_spread: float = 0.0  # interquartile range of the steps after warm-up: how much the step time moves

    @classmethod
    def of(cls, check: dict) -> StepCost:
        after = check.get("per_step", [])[check.get("steps_warmup", 0) :]
        return cls(
            level=check.get("level", "none"),
            steps=check.get("steps", 0),
            step_ms=round(1000 * statistics.median(s["wall_s"] for s in after), 2) if after else None,
            host_reads_per_step=round(sum(s["host_reads"] for s in after) / len(after), 3) if after else 0.0,
            host_wait_ms_per_step=round(1000 * sum(s["host_wait_s"] for s in after) / len(after), 2) if after else 0.0,
            compiles=check.get("compiles_total", 0),
            compiles_after_warmup=check.get("compiles_after_warmup", 0),
            reasons=list(check.get("reasons", [])),
            step_ms_spread=round(1000 * _iqr([s["wall_s"] for s in after]), 2),
        )

    def line(self) -> str:
        step = "-" if self.step_ms is None else f"{self.step_ms:.1f} ms"
        return (
            f"{self.level}, step {step}, {self.host_reads_per_step:g} host read(s) per step "
            f"({self.host_wait_ms_per_step:.1f} ms waiting), {self.compiles} compile(s) "
            f"({self.compiles_after_warmup} after warm-up)"
        )


def compare(before: StepCost, after: StepCost) -> tuple[list[str], list[str], list[str]]:
    """(what costs less, what costs more, what changed without being a saving or a cost), in words, from one run
    of each. Host reads per step and compiles are counts (`is_counted`): fewer of one is a saving, more a cost,
    whatever the machine's load. The step time is timed: one run's step is faster (slower) only when by
    FASTER_ENOUGH (SLOWER_LIMIT) and beyond the steps' spread; `Session.judge` asks repeated runs
    (`step_timing`) before the step time rejects a counted saving or decides alone."""
    better, worse, measured = [], [], []
    pairs = [
        ("host reads per step", before.host_reads_per_step, after.host_reads_per_step, 0.5),
        ("compiles after warm-up", before.compiles_after_warmup, after.compiles_after_warmup, 1),
        ("compiles", before.compiles, after.compiles, 1),
    ]
    for name, old, new, least in pairs:
        if new <= old - least:
            better.append(f"{name} {old:g} -> {new:g}")
        elif new >= old + least:
            worse.append(f"{name} {old:g} -> {new:g}")
    if before.step_ms and after.step_ms:
        change = after.step_ms / before.step_ms - 1
        text = f"step time {before.step_ms:.1f} -> {after.step_ms:.1f} ms ({change:+.0%})"
        # beyond the steps' own spread too: on a shared machine one run's steps can all be slow
        noise = 2 * max(before.step_ms_spread, after.step_ms_spread)
        if change <= -FASTER_ENOUGH and before.step_ms - after.step_ms > noise:
            better.append(text)
        elif change >= SLOWER_LIMIT and after.step_ms - before.step_ms > noise:
            worse.append(text)
        else:
            measured.append(text + ", within one run's noise")
    return better, worse, measured


def is_counted(change: str) -> bool:
    """A change `compare` words from a count (host reads, compiles), not from a timed step."""
    return not change.startswith("step time")


@dataclass
class StepTiming:
    """Median step times (ms) of repeated runs of the baseline and of the candidate, interleaved."""

    before_ms: list[float]
    after_ms: list[float]

    @property
    def faster(self) -> bool:
        before, after = self.before_ms, self.after_ms
        if min(len(before), len(after)) < TIMING_RUNS:
            return False
        return max(after) < min(before) and statistics.median(after) <= (1 - MIN_GAIN) * statistics.median(before)

    @property
    def slower(self) -> bool:
        """Every candidate run slower than every baseline run, the median by at least MIN_GAIN: a clear slowdown."""
        before, after = self.before_ms, self.after_ms
        if min(len(before), len(after)) < TIMING_RUNS:
            return False
        return min(after) > max(before) and statistics.median(after) >= (1 + MIN_GAIN) * statistics.median(before)

    @property
    def p_value(self) -> float:
        """The one-sided rank test's p when every candidate run is faster (1 / C(n+m, n))."""
        return 1 / math.comb(len(self.before_ms) + len(self.after_ms), len(self.after_ms))

    def line(self) -> str:
        if not self.before_ms or not self.after_ms:
            return "step time not measured (a timing run failed)"
        old, new = statistics.median(self.before_ms), statistics.median(self.after_ms)
        runs = f"{len(self.before_ms)} and {len(self.after_ms)} runs interleaved"
        head = f"step time {old:.1f} -> {new:.1f} ms ({new / old - 1:+.0%}) over {runs} "
        head += f"(run medians {_ms(self.before_ms)} -> {_ms(self.after_ms)})"
        if self.faster:
            return head + f": every candidate run faster (one-sided rank test p = {self.p_value:.2f})"
        if self.slower:
            return head + f": every candidate run slower (one-sided rank test p = {self.p_value:.2f})"
        if max(self.after_ms) < min(self.before_ms):
            return head + f": faster in every run but by less than {MIN_GAIN:.0%}"
        if min(self.after_ms) > max(self.before_ms):
            return head + f": slower in every run but by less than {MIN_GAIN:.0%}"
        return head + ": the runs overlap, neither faster nor slower beyond their spread"


def _ms(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.0f}" for v in values) + "]"


def _iqr(values: list[float]) -> float:
    if len(values) < 4:
        return 0.0
    quartiles = statistics.quantiles(values, n=4)
    return quartiles[2] - quartiles[0]


@dataclass
class Evidence:
    """One run of the tree: its check and, with a verify command, verify's verdict."""

    cost: StepCost
    verify: dict | None = None  # {"level", "status", "loss", "reasons"}
    error: str | None = None
    check: dict = field(default_factory=dict)  # the whole check report (the next candidates' sites)

    def curve_line(self) -> str:
        if self.verify is None:
            return "curve not compared (no --verify)"
        return f"verify {self.verify['status']} at {self.verify['level']} (loss {self.verify.get('loss') or '-'})"


@dataclass
class Baseline:
    """The migrated tree's evidence as a caller already measured it: its check report, verify's summary
    ({"level", "status", "loss", "reasons"}; None without a verify command) and the folder that holds the
    reference runs of the original that verify made (so that the candidates' verify reuses them)."""

    check: dict
    verify: dict | None = None
    reference_cache: Path | None = None
    source: str = "the caller's run"


def verify_summary(report: dict) -> dict:
    """Verify's report (VerifyReport.to_dict()) as the summary a candidate's verdict carries."""
    loss = report.get("loss") or {}
    return {
        "level": report.get("level"),
        "status": report.get("status"),
        "loss": loss.get("verdict") if isinstance(loss, dict) else None,
        "reference_cached": bool((report.get("reference_run") or {}).get("cached")),
        "reasons": [r for r in report.get("reasons", []) if not r.startswith("note")][:6],
    }


@dataclass
class Verdict:
    candidate: dict
    status: str  # "kept", "rejected", "not tried", "proposed"
    reason: str
    before: dict | None = None
    after: dict | None = None
    verify: dict | None = None
    output_tail: str | None = None  # the last lines the candidate's run printed
    timing: dict | None = None  # repeated runs when the step time decided: {"before_ms", "after_ms", "faster"}


@dataclass
class OptimizeReport:
    tree: str
    original: str | None
    validate_cmd: str | None
    verify_cmd: str | None
    status: str  # "optimized", "unchanged", "proposed", "refused"
    reason: str = ""
    baseline: dict | None = None
    final: dict | None = None
    candidates: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)  # files of the tree the kept candidates changed
    reports: dict[str, str] = field(default_factory=dict)
    runs: int = 0  # runs of the program this optimization made (the baseline's, when given, not among them)

    def to_dict(self) -> dict:
        return asdict(self)


def python_files(tree: Path) -> list[str]:
    """The tree's Python files, relative (what a candidate may change)."""
    found = []
    for path in sorted(tree.rglob("*.py")):
        rel = path.relative_to(tree)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") or part == "tests_xla" for part in rel.parts):
            continue
        if path.is_file() and not path.is_symlink():
            found.append(str(rel))
    return found


def original_of(tree: Path) -> Path | None:
    """The source tree a migrated tree came from, as its migrate report says."""
    report = tree / "xlaport-report.json"
    try:
        src = json.loads(report.read_text(encoding="utf-8")).get("src")
    except (OSError, ValueError):
        return None
    return Path(src) if src and Path(src).is_dir() else None


class Session:
    """One optimization of one tree: the commands, the reference cache, the texts kept so far."""

    def __init__(
        self,
        tree: Path,
        validate_cmd: str | None,
        verify_cmd: str | None = None,
        original: Path | None = None,
        timeout_s: float = 600.0,
        memory_mb: int = 8192,
        scratch: Path | None = None,
        subdir: str = "",
        timing_runs: int = TIMING_RUNS,
        reference_cache: Path | None = None,
    ) -> None:
        self.tree = Path(tree).resolve()
        self.validate_cmd = validate_cmd or verify_cmd
        self.verify_cmd = verify_cmd
        self.original = Path(original).resolve() if original else None
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self.timing_runs = timing_runs
        self.scratch = Path(scratch or tempfile.mkdtemp(prefix="xlaport-optimize-"))
        # the reference runs of the original: a caller's (migrate's verify ran them already) or this session's
        self.reference_cache = Path(reference_cache) if reference_cache else self.scratch / "reference-cache"
        self.subdir = subdir
        self.texts = {rel: (self.tree / rel).read_text(encoding="utf-8") for rel in python_files(self.tree)}
        self.started = dict(self.texts)  # what the tree held: a file edited during the runs is never overwritten
        self.runs = 0

    # -- evidence --------------------------------------------------------------------------------------
    def run(self, texts: dict[str, str], with_verify: bool = True) -> Evidence:
        """Writes `texts` over a scratch copy of the tree and runs the check (and verify, unless `with_verify`
        is False: a timing run) there."""
        self.runs += 1
        work = self.scratch / f"run-{self.runs}"
        ignore = shutil.ignore_patterns(*SKIP_DIRS, "tests_xla")  # each file as opened, never through a new link
        shutil.copytree(self.tree, work, symlinks=True, ignore=ignore, copy_function=copier_inside(self.tree))
        for rel, text in texts.items():
            (work / rel).write_text(text, encoding="utf-8")
        check: dict | None = None
        verify = None
        if self.verify_cmd and with_verify:
            report = self._verify(work)
            verify = {
                "level": report.level,
                "status": report.status,
                "loss": report.loss.verdict if report.loss else None,
                "reference_cached": bool(report.reference_run and report.reference_run.cached),
                "reasons": [r for r in report.reasons if not r.startswith("note")][:6],
            }
            if parse_command(self.verify_cmd) == parse_command(self.validate_cmd):
                check = report.check
        if check is None:
            script, args = parse_command(self.validate_cmd)
            check = run_check(
                work / self.subdir / script,
                args,
                timeout_s=self.timeout_s,
                memory_mb=self.memory_mb,
                workdir=work / self.subdir,
                project=work,
                reveal=True,
            ).to_dict()
        check = check or {}
        evidence = Evidence(cost=StepCost.of(check), verify=verify, error=check.get("error"), check=check)
        shutil.rmtree(work, ignore_errors=True)
        return evidence

    def _verify(self, work: Path):
        script, args = parse_command(self.verify_cmd)
        config = VerifyConfig(
            reference_cache=str(self.reference_cache), timeout_s=self.timeout_s, memory_mb=self.memory_mb
        )
        return verify_tree(self.original, work, ["python", script, *args], config, subdir=self.subdir)

    # -- judging ---------------------------------------------------------------------------------------
    def judge(self, candidate: Candidate, baseline: Evidence) -> tuple[Verdict, Evidence | None]:
        """Runs the tree with `candidate` on top of what was kept, and keeps it or says why not."""
        if families_changes_numbers(candidate.family) and not self.verify_cmd:
            return self._verdict(
                candidate, "not tried", "it changes the numbers: judging it needs --verify", baseline
            ), None
        texts = {**self.texts, candidate.file: candidate.new_text}
        after = self.run(texts)
        better, worse, measured = compare(baseline.cost, after.cost)
        problems = []
        if after.cost.level != "L2":
            problems.append(
                f"the check reached {after.cost.level}: " + "; ".join(after.cost.reasons[:2] or [after.error or ""])
            )
        if after.verify is not None and not _curve_holds(baseline.verify, after.verify):
            problems.append(f"the curve left the reference's band: {after.curve_line()}")
        counted = [b for b in better if is_counted(b)]
        timed = [c for c in better + worse + measured if not is_counted(c)]  # one run's step time, if measured
        timing = None
        if not problems and not any(is_counted(w) for w in worse) and self.timing_runs > 1:
            if counted and any(not is_counted(w) for w in worse):
                # a counted saving that one run says is slower: interleaved runs decide whether it clearly is
                timing = self.step_timing(texts, baseline, after)
                worse = [w for w in worse if is_counted(w)] + ([timing.line()] if timing.slower else [])
                timed = [timing.line()]
            elif not counted:
                # the counts are equal: only the step time can show a saving, and one run of each is not enough
                timing = self.step_timing(texts, baseline, after)
                better, timed = ([timing.line()], []) if timing.faster else ([], [timing.line()])
        more = [w for w in worse if is_counted(w)]
        saved = "; ".join(counted) or _counts(baseline.cost, after.cost) + " (equal)"
        if not problems and more:
            problems.append(
                f"it costs more: counted: {'; '.join(more)}"
                + "".join(f"; timed: {w}" for w in worse if not is_counted(w))
                + (f" (it saves {'; '.join(counted)})" if counted else "")
            )
        elif not problems and worse:
            problems.append(f"its step is clearly slower: timed: {'; '.join(worse)} (counted: {saved})")
        elif not problems and not better:
            problems.append(
                f"the step cost did not improve: counted: {_counts(baseline.cost, after.cost)} (equal)"
                + (f"; timed: {'; '.join(timed)}" if timed else "")
            )
        timing_dict = None if timing is None else {**asdict(timing), "faster": timing.faster, "slower": timing.slower}
        if problems:
            verdict = self._verdict(candidate, "rejected", "; ".join(problems), baseline, after, timing_dict)
            return verdict, None
        self.texts[candidate.file] = candidate.new_text
        if counted:
            step = "; ".join(timed) or "step time not measured"
            step += " (one run each)" if timing is None and timed else ""
        else:
            step = "; ".join(better) + (" (one run each)" if timing is None else "")
        reason = f"counted: {saved}; timed: {step}"
        return self._verdict(candidate, "kept", f"{reason}; {after.curve_line()}", baseline, after, timing_dict), after

    def step_timing(self, texts: dict[str, str], baseline: Evidence, after: Evidence) -> StepTiming:
        """The step time of the kept texts and of `texts`, over `timing_runs` runs of each (the two runs already
        made count as the first pair), interleaved so that a change in the machine's load falls on both."""
        before_ms, after_ms = [baseline.cost.step_ms], [after.cost.step_ms]
        for _ in range(self.timing_runs - 1):
            before_ms.append(self.run(self.texts, with_verify=False).cost.step_ms)
            after_ms.append(self.run(texts, with_verify=False).cost.step_ms)
        if None in before_ms or None in after_ms:
            return StepTiming([], [])
        return StepTiming(before_ms, after_ms)

    def _verdict(
        self, candidate, status, reason, before: Evidence | None, after: Evidence | None = None, timing=None
    ) -> Verdict:
        return Verdict(
            candidate=candidate.to_dict(),
            status=status,
            reason=reason,
            before=asdict(before.cost) if before else None,
            after=asdict(after.cost) if after else None,
            verify=after.verify if after else None,
            output_tail=after.check.get("stdout_tail") if after else None,
            timing=timing,
        )

    # -- candidates ------------------------------------------------------------------------------------
    def measured_targets(self, check: dict) -> list[tuple[float, str, str, list[int], str]]:
        """(cost ms per step, family, file, lines, finding) for each cost the check measured that a family
        answers, most costly first."""
        targets: dict[tuple[str, str], list] = {}
        for finding in check.get("performance", []):
            rel_line = self._site(finding.get("site"))
            if rel_line is None:
                continue
            rel, line = rel_line
            if finding["kind"] == "host_sync" and finding.get("every_step"):
                family = "bf16_no_scaler" if finding.get("code") == "XLA502" else None
                if finding.get("code") in LOGGING_CODES:
                    family = "logging_reads"
                if family is None:
                    continue
                cost = finding.get("ms_per_step") or 0.0
                share = finding.get("share")
                words = f"{finding['what']} ({finding['when']}{f', {share:.0%} of the step' if share else ''})"
            elif finding["kind"] == "compile":
                family, cost, words = "fixed_generation", 1000 * finding.get("cost_s", 0.0), finding["what"]
            else:
                continue
            entry = targets.setdefault((family, rel), [0.0, [], []])
            entry[0] += cost
            entry[1].append(line)
            entry[2].append(words)
        for source in check.get("recompile_sources", []):  # repeated compilation (what kept the check at L0)
            rel_line = self._site(source.get("location"))
            if rel_line is None:
                continue
            rel, line = rel_line
            entry = targets.setdefault(("fixed_generation", rel), [0.0, [], []])
            entry[0] += 1000.0 * source["compiles"]  # compiles outrank per-step reads: each one costs seconds
            entry[1].append(line)
            entry[2].append(
                f"{source['compiles']} compilation(s) after warm-up at {rel}:{line} ({source.get('cause') or 'cause unknown'})"
            )
        ranked = [
            (c, fam, rel, sorted(set(lines)), "; ".join(words)) for (fam, rel), (c, lines, words) in targets.items()
        ]
        return sorted(ranked, key=lambda t: -t[0])

    def _site(self, site: str | None) -> tuple[str, int] | None:
        """`/any/copy/of/the/tree/train.py:12` -> ("train.py", 12) when the file is one of the tree's."""
        if not site or ":" not in site:
            return None
        path, _, line = site.rpartition(":")
        if not line.isdigit():
            return None
        matches = [rel for rel in self.texts if path == rel or path.endswith("/" + rel)]
        return (max(matches, key=len), int(line)) if matches else None

    def candidate(self, family: str, rel: str, lines: list[int], finding: str) -> tuple[Candidate | None, list[str]]:
        rewrite, notes = families.plan(family, self.texts[rel], rel, lines)
        if rewrite is None:
            return None, notes
        return (
            Candidate(
                family=family,
                file=rel,
                finding=finding,
                new_text=rewrite.text,
                original_text=self.texts[rel],
                lines=rewrite.lines,
                summary=rewrite.summary,
                notes=notes,
            ),
            notes,
        )


def families_changes_numbers(family: str) -> bool:
    return family in families.CHANGES_NUMBERS


def _curve_holds(before: dict | None, after: dict) -> bool:
    """The candidate's verify holds at the baseline's level: it passes (at the baseline's level or above, when the
    baseline passed), or (when the tree's own did not pass) ends the same way at a level no lower."""
    if before is None:
        return after["status"] == "pass"
    if after["status"] == "pass":
        return before["status"] != "pass" or level_at_least(after["level"], before["level"])
    if before["status"] == "pass":
        return False
    return after["status"] == before["status"] and level_at_least(after["level"], before["level"])


def _counts(before: StepCost, after: StepCost) -> str:
    return (
        f"host reads per step {before.host_reads_per_step:g} -> {after.host_reads_per_step:g}, "
        f"compiles {before.compiles} -> {after.compiles} "
        f"({before.compiles_after_warmup} -> {after.compiles_after_warmup} after warm-up)"
    )


def _refusal(cost: StepCost) -> str | None:
    """Why a tree cannot be optimized: its check is below L2 for a reason other than repeated compilation
    (which a family answers; the candidate must then reach L2)."""
    if cost.level == "L2":
        return None
    others = [r for r in cost.reasons if not r.startswith("repeated compilation")]
    if cost.level == "L0" and cost.reasons and not others:
        return None
    return f"the migrated program's check reached {cost.level}, not L2: " + (
        "; ".join(others or cost.reasons) or "it did not run"
    )


def optimize(
    tree: Path,
    validate_cmd: str | None = None,
    verify_cmd: str | None = None,
    original: Path | None = None,
    timeout_s: float = 600.0,
    memory_mb: int = 8192,
    write: bool = True,
    families_wanted: list[str] | None = None,
    subdir: str = "",
    extra_candidates: list[Candidate] | None = None,
    timing_runs: int = TIMING_RUNS,
    baseline: Baseline | None = None,
) -> OptimizeReport:
    """Optimizes a migrated tree (see the module's docstring); with `write`, the kept candidates are written to
    the tree and the report beside it (xlaport-optimize.json/.md). The commands run in `subdir` of the trees.
    `extra_candidates`: rewrites from elsewhere (a code model's), judged after the rules' own. `timing_runs`:
    runs of each tree when only the step time can decide (1: one run each). `baseline`: the tree's check and
    verify as a caller already measured them (migrate's evidence step), so the tree is not run again for it."""
    tree = Path(tree).resolve()
    if not tree.is_dir():
        raise ValueError(f"not a directory: {tree}")
    for command in filter(None, (validate_cmd, verify_cmd)):
        script, _ = parse_command(command)
        if not (tree / subdir / script).is_file():
            raise ValueError(f"the command's script is not in the tree: {script}")
    if verify_cmd and original is None:
        original = original_of(tree)
        if original is None:
            raise ValueError("verify needs the original tree: pass --original SRC (the tree has no migrate report)")
    wanted = families_wanted or list(families.FAMILIES)
    session = Session(
        tree,
        validate_cmd,
        verify_cmd,
        original,
        timeout_s,
        memory_mb,
        subdir=subdir,
        timing_runs=timing_runs,
        reference_cache=baseline.reference_cache if baseline else None,
    )
    report = OptimizeReport(
        tree=str(tree),
        original=str(original) if original else None,
        validate_cmd=session.validate_cmd,
        verify_cmd=verify_cmd,
        status="proposed",
    )
    try:
        if not session.validate_cmd:
            report.candidates = _proposals(session, wanted)
            report.reason = "nothing was run (no --validate): each candidate is a proposal, with its diff"
        else:
            _optimize(session, report, wanted, extra_candidates or [], baseline)
    finally:
        report.runs = session.runs
        shutil.rmtree(session.scratch, ignore_errors=True)
    if write:
        _write(session, report)
    return report


def _proposals(session: Session, wanted: list[str]) -> list[Verdict]:
    verdicts = []
    for rel, text in session.texts.items():
        for family, lines in families.static_sites(text, rel).items():
            if family not in wanted:
                continue
            finding = f"{families.DESCRIPTIONS[family]}: kb findings at {rel}:{', '.join(map(str, lines))}"
            candidate, notes = session.candidate(family, rel, lines, finding)
            if candidate is None:
                verdicts.append(
                    Verdict(
                        candidate={"id": f"{family}@{rel}", "family": family, "file": rel, "finding": finding},
                        status="not tried",
                        reason="no rewrite: " + ("; ".join(notes) or "the pattern is not one the family rewrites"),
                    )
                )
                continue
            verdicts.append(Verdict(candidate=candidate.to_dict(), status="proposed", reason=candidate.summary))
    return verdicts


def _optimize(
    session: Session, report: OptimizeReport, wanted: list[str], extra: list[Candidate], given: Baseline | None
) -> None:
    if given is not None:
        baseline = Evidence(
            cost=StepCost.of(given.check), verify=given.verify, error=given.check.get("error"), check=given.check
        )
        report.notes.append(f"the baseline is {given.source}: not run again")
    else:
        baseline = session.run(session.texts)
    report.baseline = {
        **asdict(baseline.cost),
        "verify": baseline.verify,
        "output_tail": baseline.check.get("stdout_tail"),
    }
    refused = _refusal(baseline.cost)
    if refused:
        report.status, report.reason = "refused", refused + " (optimize starts from a program whose evidence holds)"
        report.candidates = _proposals(session, wanted)
        for verdict in report.candidates:
            verdict.status, verdict.reason = "not tried", f"refused: {refused}"
        return
    if baseline.verify is not None:
        report.notes.append(
            f"the original's reference ran once and is reused for every candidate ({session.reference_cache.name})"
        )
    tried: set[tuple[str, str]] = set()
    current = baseline
    for _ in range(20):  # each round: the costliest target of the latest kept run not tried yet
        targets = [t for t in session.measured_targets(current.check) if (t[1], t[2]) not in tried and t[1] in wanted]
        if not targets:
            break
        _, family, rel, lines, finding = targets[0]
        tried.add((family, rel))
        candidate, notes = session.candidate(family, rel, lines, finding)
        if candidate is None:
            report.candidates.append(
                Verdict(
                    candidate={"id": f"{family}@{rel}", "family": family, "file": rel, "finding": finding},
                    status="not tried",
                    reason="no rewrite for this site: "
                    + ("; ".join(notes) or "the pattern is not one the family rewrites"),
                )
            )
            continue
        verdict, kept = session.judge(candidate, current)
        report.candidates.append(verdict)
        if kept is not None:
            current = kept
    # candidates from elsewhere (a code model's rewrites): judged the same way, after the rules' ones
    for candidate in extra:
        if session.texts.get(candidate.file) != candidate.original_text:
            report.candidates.append(
                session._verdict(candidate, "not tried", "the file changed since the candidate was made", None)
            )
            continue
        verdict, kept = session.judge(candidate, current)
        report.candidates.append(verdict)
        if kept is not None:
            current = kept
    # what the kb finds but the check did not measure: proposed, not run
    for verdict in _proposals(session, wanted):
        key = (verdict.candidate["family"], verdict.candidate["file"])
        if key in tried:
            continue
        if verdict.status == "proposed":
            verdict.status = "not tried"
            verdict.reason = "the check measured no per-step cost it answers; proposed only: " + verdict.reason
        report.candidates.append(verdict)
    report.final = {**asdict(current.cost), "verify": current.verify, "output_tail": current.check.get("stdout_tail")}
    kept = [v for v in report.candidates if v.status == "kept"]
    report.status = "optimized" if kept else "unchanged"
    report.reason = (
        f"{len(kept)} candidate(s) kept: {_cost(report.baseline).line()} -> {current.cost.line()}"
        if kept
        else "no candidate improved the step with the curve kept"
    )


def _write(session: Session, report: OptimizeReport) -> None:
    for rel, text in session.texts.items():
        if text != session.started[rel]:
            try:  # the text the candidates were judged on, else the user's edit made meanwhile stays
                atomic_write(session.tree / rel, text, expected=session.started[rel])
                report.written.append(rel)
            except ChangedMeanwhile as exc:
                report.notes.append(str(exc))
    json_path, md_path = session.tree / REPORT_JSON, session.tree / REPORT_MD
    report.reports = {"json": str(json_path), "markdown": str(md_path)}
    mode = quoting_mode(session.tree / rel for rel in session.texts)  # the diffs quote them: no more readable
    atomic_write(json_path, json.dumps(report.to_dict(), indent=2) + "\n", mode=mode)
    atomic_write(md_path, render_markdown(report), mode=mode)


def render_text(report: OptimizeReport) -> str:
    lines = [f"xlaport optimize {report.tree}: {report.status}" + (f": {report.reason}" if report.reason else "")]
    if report.baseline:
        lines.append("  before: " + _cost(report.baseline).line())
    if report.final:
        lines.append("  after:  " + _cost(report.final).line())
    for verdict in report.candidates:
        c = verdict.candidate
        lines.append(f"  - {verdict.status}: {c['id']} ({c.get('proposer', 'rules')}): {verdict.reason}")
        if c.get("finding"):
            lines.append(f"      answers: {c['finding']}")
    lines.extend(f"  note: {note}" for note in report.notes)
    if report.written:
        lines.append(f"  written: {', '.join(report.written)}")
    if report.reports:
        lines.append(f"  report: {report.reports['markdown']} (also .json)")
    return "\n".join(lines)


def render_markdown(report: OptimizeReport) -> str:
    out = [f"# xlaport optimize: {report.status}", "", report.reason, ""]
    if report.validate_cmd:
        out += [f"- validate: `{report.validate_cmd}`", f"- verify: `{report.verify_cmd or '-'}`", ""]
    out += ["| candidate | verdict | why |", "|---|---|---|"]
    for verdict in report.candidates:
        out.append(f"| {verdict.candidate['id']} | {verdict.status} | {verdict.reason.replace('|', '/')} |")
    for verdict in report.candidates:
        diff = verdict.candidate.get("diff")
        if diff:
            out += [
                "",
                f"## {verdict.candidate['id']} ({verdict.status})",
                "",
                verdict.candidate.get("finding", ""),
                "",
                "```diff",
                diff.rstrip(),
                "```",
            ]
    return "\n".join(out) + "\n"


def _cost(summary: dict) -> StepCost:
    return StepCost(**{k: v for k, v in summary.items() if k not in ("verify", "output_tail")})
