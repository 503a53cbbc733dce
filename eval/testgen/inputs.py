"""Inputs for the targets: recorded from a real run of the original (`record`), else synthesized and tried
once on the original (`probe`); both in sandboxed worker children."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from xlaport.eval.sandbox import read_child_file, run_sandboxed

from xlaport.files import copier_inside

from .results import TestgenError
from .sources import SourcePair, module_name
from .targets import Target

PROBE_TIMEOUT_S = 600.0
RECORD_TIMEOUT_S = 900.0
COPY_LIMIT_BYTES = 10 * 1024 * 1024  # larger files are linked, not copied, into the recording sandbox


def record_inputs(
    command: str, pairs: list[SourcePair], wanted: dict[str, list[Target]], inputs_dir: Path, timeout_s: float
) -> tuple[dict[str, dict], list[str]]:
    """Runs the driver command on a copy of the original tree under the shim; {key: {"path"}|{"reason"}}."""
    argv = record_argv(command)
    root = pairs[0].original_root
    notes = []
    with tempfile.TemporaryDirectory(prefix="xlaport-record-") as tmp:
        copy = copy_tree(root, Path(tmp) / "tree")
        targets = [
            {
                "module": p.original_module,
                "target": t.name,
                "kind": t.kind,
                "file": str(copy / p.original_file.relative_to(root)),
            }
            for p in pairs
            for t in wanted.get(p.rel, [])
        ]
        job = Path(tmp) / "record.json"
        record_dir = Path(tmp) / "recorded"
        script = argv[2] if argv[1] == "-m" else module_name(Path(argv[1]))
        job.write_text(json.dumps({"targets": targets, "out_dir": str(record_dir), "script_module": script}))
        run = run_sandboxed(
            [sys.executable, "-m", "xlaport.eval.testgen.worker", "record", str(job), "--", *argv[1:]],
            cwd=copy,
            timeout_s=timeout_s,
            env={"USE_TORCH_XLA": "0"},
            writable=[Path(tmp)],
            readable=[root.parent],  # what the copy's links to its siblings point at
            reveal=True,  # trees xlaport itself read to write the tests
        )
        if not run.ok:
            notes.append(
                f"the recorded run did not finish cleanly ({run.describe_failure()}); calls seen before that were kept"
            )
        index_text = read_child_file(record_dir / "index.json")
        index = json.loads(index_text) if index_text is not None else {}
        for entry in index.values():
            if "path" in entry:
                # the recorded program wrote this index: only regular files in record_dir are taken
                recorded = read_child_file(record_dir / Path(entry["path"]).name, limit_bytes=None)
                if recorded is None:
                    entry.pop("path")
                    entry.setdefault("reason", "the recorded inputs file is missing")
                    continue
                inputs_dir.mkdir(parents=True, exist_ok=True)
                destination = inputs_dir / Path(entry["path"]).name
                destination.write_bytes(recorded)
                entry["path"] = str(destination)
    return index, notes


def record_argv(command: str) -> list[str]:
    """`python SCRIPT ARGS...` or `python -m MODULE ARGS...` split into words; TestgenError otherwise."""
    argv = shlex.split(command)
    while len(argv) > 1 and argv[1] in ("-u", "-B", "-O", "-OO"):  # interpreter flags that change nothing here
        del argv[1]
    is_python = bool(argv) and Path(argv[0]).name.startswith("python")
    if not is_python or len(argv) < 2 or (argv[1].startswith("-") and argv[1] != "-m"):
        raise TestgenError(f"--record must be a `python SCRIPT ...` or `python -m MODULE ...` command, got {command!r}")
    return argv


def copy_tree(src: Path, parent: Path) -> Path:
    """Copies `src` to `parent/<its name>` so a run cannot change the user's files (big files are symlinked),
    with links to the folders and files beside `src`, so paths like `../data` still resolve. The copy."""

    def ignore(directory: str, names: list[str]) -> list[str]:
        return [n for n in names if n in (".git", ".venv", "venv", "__pycache__", "node_modules")]

    copy_as_opened = copier_inside(src)  # never through a link swapped in after the listing

    def copy(source: str, destination: str) -> None:
        if os.path.getsize(source) > COPY_LIMIT_BYTES:
            os.symlink(os.path.abspath(source), destination)
        else:
            copy_as_opened(source, destination)

    parent.mkdir(parents=True, exist_ok=True)
    dst = parent / src.name
    shutil.copytree(src, dst, ignore=ignore, copy_function=copy, symlinks=True)
    if src.parent != src:
        for sibling in src.parent.iterdir():
            if sibling.name != src.name and not (parent / sibling.name).exists():
                os.symlink(sibling, parent / sibling.name)
    return dst


def probe_inputs(
    pairs: list[SourcePair], wanted: dict[str, list[Target]], seed: int, timeout_s: float, argv: list[str]
) -> dict[str, dict]:
    """Synthesized inputs for every wanted target, tried once on a copy of the original (in a sandboxed child,
    under the shim, with no network), from the tree root as working directory with `argv` in sys.argv."""
    found: dict[str, dict] = {}
    by_root: dict[Path, list[dict]] = {}
    for pair in pairs:
        for target in wanted.get(pair.rel, []):
            by_root.setdefault(pair.original_root, []).append(
                {"module": pair.original_module, "target": target.name, "kind": target.kind}
            )
    for root, targets in by_root.items():
        with tempfile.TemporaryDirectory(prefix="xlaport-probe-") as tmp:
            copy = copy_tree(root, Path(tmp) / "tree")
            job, result = Path(tmp) / "probe.json", Path(tmp) / "found.json"
            job.write_text(
                json.dumps({"root": str(copy), "argv": argv, "targets": targets, "seed": seed, "result": str(result)})
            )
            run = run_sandboxed(
                [sys.executable, "-m", "xlaport.eval.testgen.worker", "probe", str(job)],
                timeout_s=timeout_s,
                env={"USE_TORCH_XLA": "0", "PYTHONDONTWRITEBYTECODE": "1"},
                writable=[Path(tmp)],
                readable=[Path(root).parent],  # the tree and its siblings
                reveal=True,  # trees xlaport itself read to write the tests
            )
            if (found_text := read_child_file(result)) is not None:
                found.update(json.loads(found_text))
            else:
                for t in targets:
                    found[f"{t['module']}:{t['target']}"] = {
                        "reason": f"probing the original failed: {run.describe_failure()}"
                    }
    return found
