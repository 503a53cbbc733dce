"""`generate_tests`: targets, inputs and the written test files for a pair of trees."""

from __future__ import annotations

from pathlib import Path

from xlaport.files import atomic_write, keep_backup, read_source

from .differential import DEFAULT_SEED
from .inputs import PROBE_TIMEOUT_S, RECORD_TIMEOUT_S, probe_inputs, record_argv, record_inputs
from .render import INPUTS_DIR, inputs_source, render_readme, render_test_file, unique_test_name
from .results import GeneratedTest, TestgenResult, Undrivable
from .sources import SourcePair, source_pairs
from .targets import Target, find_targets

TEST_PREFIX = "test_xlaport_"
IMPORT_FAILED = "importing the original raised"  # same words as worker/probe.py


def _write(path: Path, text: str, written: list[str]) -> None:
    """Writes `text`, keeping a .xlaport.bak of a different file already there (never overwriting one)."""
    if path.exists():
        if path.read_text(encoding="utf-8", errors="replace") == text:
            written.append(str(path))
            return
        keep_backup(path)
    atomic_write(path, text)
    written.append(str(path))


# ---------------------------------------------------------------- the entry point


def generate_tests(
    original: Path,
    migrated: Path,
    out: Path,
    record: str | None = None,
    all_public: bool = False,
    changed_files: bool = False,
    seed: int = DEFAULT_SEED,
    timeout_s: float = RECORD_TIMEOUT_S,
) -> TestgenResult:
    """Writes differential tests for the changed functions and modules into `out`: with `changed_files`,
    every public one of a file that the migration changed; with `all_public`, every public one."""
    original, migrated, out = Path(original), Path(migrated), Path(out).resolve()
    if record is not None:
        record_argv(record)  # fail before any work
    pairs, undrivable = source_pairs(original, migrated, out)
    result = TestgenResult(out=str(out), undrivable=undrivable)
    wanted: dict[str, list[Target]] = {}
    static_undriven: dict[str, list[Undrivable]] = {}
    for pair in pairs:
        try:
            original_text, migrated_text = read_source(pair.original_file), read_source(pair.migrated_file)
            if changed_files and not all_public and original_text == migrated_text:
                continue
            targets = find_targets(original_text, migrated_text, all_public or changed_files)
        except (SyntaxError, ValueError) as exc:
            result.undrivable.append(Undrivable(pair.rel, "*", f"cannot parse: {exc}"))
            continue
        for target in targets:
            if target.kind == "other":
                static_undriven.setdefault(pair.rel, []).append(Undrivable(pair.rel, target.name, target.reason))
            else:
                wanted.setdefault(pair.rel, []).append(target)
    if not wanted:
        result.notes.append(
            "no function or nn.Module changed" + ("" if all_public else " (use --all to test every public one)")
        )
    recorded_index: dict[str, dict] = {}
    if record and wanted:
        recorded_index, notes = record_inputs(record, pairs, wanted, out / INPUTS_DIR, timeout_s)
        result.notes.extend(notes)
    to_probe = {
        rel: [
            t for t in targets if "path" not in recorded_index.get(f"{_pair(pairs, rel).original_module}:{t.name}", {})
        ]
        for rel, targets in wanted.items()
    }
    argv = record_argv(record)[1:] if record else []
    probed = probe_inputs(pairs, to_probe, seed, PROBE_TIMEOUT_S, argv) if any(to_probe.values()) else {}
    result.notes.extend(import_notes(probed))
    for pair in pairs:
        tests, undriven = _plan_file(pair, wanted.get(pair.rel, []), recorded_index, probed, record)
        undriven = static_undriven.get(pair.rel, []) + undriven
        result.undrivable.extend(undriven)
        if not tests:
            continue
        test_file = out / (TEST_PREFIX + pair.rel.removesuffix(".py").replace("/", "_").replace(".", "_") + ".py")
        _write(test_file, render_test_file(pair, out, tests, undriven, seed, argv), result.files_written)
        for test_name, target, spec, _note in tests:
            result.tests.append(
                GeneratedTest(
                    test_file.name,
                    test_name,
                    pair.rel,
                    target.name,
                    target.kind,
                    "recorded" if spec.get("recorded") else "synthesized",
                    inputs_source(spec),
                )
            )
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "README.md", render_readme(result, record), result.files_written)
    return result


def import_notes(probed: dict[str, dict]) -> list[str]:
    """One note per module that could not be imported, with the reason (its targets share it)."""
    notes: dict[str, str] = {}
    for key, found in probed.items():
        reason = found.get("reason", "")
        if reason.startswith(IMPORT_FAILED):
            module = key.split(":")[0]
            notes.setdefault(module, f"module {module} could not be imported (no test for it): {reason}")
    return list(notes.values())


def _pair(pairs: list[SourcePair], rel: str) -> SourcePair:
    return next(p for p in pairs if p.rel == rel)


def _plan_file(
    pair: SourcePair, targets: list[Target], recorded_index: dict, probed: dict, record: str | None
) -> tuple[list[tuple[str, Target, dict, str]], list[Undrivable]]:
    tests, undriven, taken = [], [], set()
    for target in targets:
        key = f"{pair.original_module}:{target.name}"
        seen = recorded_index.get(key, {})
        if "path" in seen:
            tests.append(
                (
                    unique_test_name(target.name, taken),
                    target,
                    {"recorded": seen["path"]},
                    f"the first call recorded from `{record}`",
                )
            )
            continue
        found = probed.get(key, {"reason": "not probed"})
        if "inputs" in found:
            why = ""
            if record:
                why = f"; not recorded: {seen.get('reason', 'not called by the recorded run')}"
            tests.append((unique_test_name(target.name, taken), target, found["inputs"], found.get("note", "") + why))
            continue
        reason = found["reason"]
        if record and "reason" in seen:
            reason = f"{seen['reason']}; {reason}"
        undriven.append(Undrivable(pair.rel, target.name, reason))
    return tests, undriven
