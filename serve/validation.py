"""Validation of one file's patch inside its project, as the user would run it.

The project (sent, or a local folder; else the file alone) is copied twice into a scratch folder, the original
and the migrated text written at the file's path in each. Then:

- the program runs under the XLA execution check from the working folder `cwd`: the user's `command` when given,
  else the file's own entry point (an `if __name__ == "__main__":` block, or statements at module level);
- differential tests are generated for the changed file's functions and classes (original on the CPU, migrated
  on the XLA device), with inputs recorded from that run when there is one;
- a module without an entry point is validated by those tests alone: nothing to run is no reason to reject it.
- a run that fails at a line of the user's code is followed by the original's run, the same way (CUDA mapped to
  the CPU): failing there too (or with the same error), the failure is the program's, not the patch's: 'could not
  judge', never a rejection.

A run that fails because its context is missing (a module that was not sent, a data file, the network) is no
evidence against the patch: the patch stays unvalidated and says what to send. Light at import.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from xlaport.files import module_file

from .inputs import module_command, parse_command
from .project import ProjectError, ProjectSource, project_path, write_in_copy
from .results import CheckRun, Evidence, SuggestOptions, verdict
from .tree import GENERATED_TESTS_DIR

PROJECT = "project"  # the copies' folder name (the original's and the migrated's, side by side)
SEND_PROJECT = "send the project with the file (HTTP: `project`; MCP: `project_root`)"


def has_entry_point(source: str) -> bool:
    """True when running the file does something: an `if __name__ == "__main__":` block, or a call, loop or
    `with` at module level (a script). A module of definitions, imports and constants has none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) and "__name__" in ast.unparse(node.test):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Call, ast.Await)):
            return True
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            return True
    return False


def relative_folder(cwd: str | None) -> str:
    """The working folder as a clean relative path ("." for the project root); ProjectError otherwise."""
    pure = PurePosixPath((cwd or ".").replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts:
        raise ProjectError(f"`cwd` must be a folder inside the project, relative to its root: {cwd!r}")
    return str(pure)


def validate_in_project(
    project: ProjectSource | None,
    original: str,
    migrated: str,
    rel_path: str,
    options: SuggestOptions,
    evidence: Evidence,
) -> Evidence:
    """The checks of a patch to `rel_path` run inside its project; the evidence with its verdict."""
    from xlaport.eval.sandbox import readable_scratch

    from .checks import run_generated_tests, run_xla_check

    cwd = relative_folder(options.cwd)
    if project is None:  # the file alone: it is its own project
        rel_path = Path(rel_path).name if rel_path.endswith(".py") else "snippet.py"
    with readable_scratch("xlaport-validate-") as tmp:
        roots = {side: Path(tmp, side, PROJECT) for side in ("original", "migrated")}
        for side, text in (("original", original), ("migrated", migrated)):
            if project is not None:
                project.write_to(roots[side])
            write_in_copy(roots[side], rel_path, text)  # never outside the copy (absolute, `..`, a link)
        if not (roots["migrated"] / cwd).is_dir():
            raise ProjectError(f"`cwd` {cwd!r} is not a folder of the project")
        script, args, how = _what_to_run(roots["migrated"], rel_path, cwd, migrated, options)
        checks: list[CheckRun] = []
        original_error = None
        if script is not None:
            workdir = roots["migrated"] / cwd
            run = run_xla_check(
                workdir / script, args, options.timeout_s, options.memory_mb, workdir, project=roots["migrated"]
            )
            checks.append(
                _context_failure(run, project is not None, cwd)
                or _fails_in_unmigrated_file(run, roots["migrated"], rel_path)
                or run
            )
            if _fails_in_users_code(checks[0]):
                # the original, run the same way, decides whether the failure is the patch's (cutout's last
                # line saved into a missing folder: 'rejected', though the original fails there too)
                original_error = _original_run_error(
                    roots["original"], cwd, script, args, options.timeout_s, options.memory_mb
                )
        # the tests' trees: the working folder when the file lies in it (the recorded run starts there), else the root
        inside = cwd == "." or PurePosixPath(rel_path).is_relative_to(cwd)
        tree = cwd if inside else "."
        # inputs are synthesized from the signatures (probed on the original), not recorded from the command:
        # replayed in this scratch layout, the sandboxed sides could not read the recorded inputs (measured on
        # siamese-triplet's trainer.fit: 'ORIGINAL raised FileNotFoundError ... testgen_inputs/trainer.fit.pt')
        record = None
        # the tests live in the migrated copy, as migrate keeps them: the sandboxed sides read their recorded
        # inputs there (a folder of the scratch beside the trees is not shown to them)
        checks.append(
            run_generated_tests(
                roots["original"] / tree,
                roots["migrated"] / tree,
                roots["migrated"] / tree / GENERATED_TESTS_DIR,
                record=record,
                timeout_s=options.timeout_s,
            )
        )
    tests = checks[-1]
    if original_error is not None and (own := _original_fails_alike(checks[0], original_error)) is not None:
        checks[0] = own
    if tests.passed is None and any(c.name == "xla_check" and c.passed for c in checks):
        # nothing drivable changed but the entry point, and the program's run went through it: the run decides
        tests = tests.model_copy(
            update={
                "report": {**tests.report, "not_applicable": True},
                "reasons": [*tests.reasons, "the program's run above exercised the change"],
            }
        )
        checks[-1] = tests
    deciding = [c for c in checks if not c.report.get("not_applicable")]
    status, reason, level = verdict(deciding)
    if status == "unvalidated" and script is None and all(c.passed is None for c in deciding):
        reason = (
            f"{rel_path} has no entry point and no test could be generated for its functions and classes "
            f'({reason}); send `command`, the program that uses it (e.g. "python train.py --epochs 1"), '
            "with its project"
        )
    return evidence.model_copy(
        update={
            "checks": checks,
            "status": status,
            "reason": reason,
            "level": level,
            "validated": status == "validated",
            "ran": how,
        }
    )


def _what_to_run(
    root: Path, rel_path: str, cwd: str, migrated: str, options: SuggestOptions
) -> tuple[str | None, list[str], str]:
    """(script relative to cwd, its arguments, what validation runs) — script None: nothing to run."""
    if options.command:
        script, args = parse_command(options.command)
        if not (root / cwd / script).is_file():
            raise ProjectError(
                f"the command's script {script!r} is not in the project's folder {cwd!r}: send the project with "
                "it, or give the `cwd` the command is typed in"
            )
        return script, args, f"`{options.command}` in {cwd}, then generated tests of {rel_path}"
    if has_entry_point(migrated):
        script = os.path.relpath(rel_path, cwd)
        line = shlex.join(["python", script, *options.args])
        return script, list(options.args), f"the file's own entry point (`{line}` in {cwd}), then generated tests"
    return (
        None,
        [],
        (
            f"generated tests of {rel_path}'s functions and classes (it has no entry point; send `command` to also run "
            "the program that uses it)"
        ),
    )


# A failure of the run that says the program's surroundings are missing, not that the migration is wrong
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
_MISSING_FILE = re.compile(r"(?:FileNotFoundError|No such file or directory)[^']*'([^']+)'")
_NO_NETWORK = re.compile(
    r"Dataset not found|download=True|URLError|Name or service not known|Temporary failure in name resolution|"
    r"Network is unreachable|Connection refused|Max retries exceeded"
)


def _fails_in_users_code(run: CheckRun) -> bool:
    """True when the run failed (not for missing context) at a line of the user's code."""
    line = _user_failing_source(run.report.get("error") or "") if run.passed is False else None
    return line is not None and len(line) >= 8


def _original_run_error(
    root: Path, cwd: str, script: str, args: list[str], timeout_s: float, memory_mb: int
) -> str | None:
    """The traceback of the ORIGINAL program run as the migrated one was (from `cwd` of its copy at `root`, CUDA
    mapped to the CPU, in the sandbox, through a private view: the copy is not changed); None when it ran to its
    end, or was stopped (time, memory) before it failed."""
    from xlaport.eval.sandbox import run_sandboxed

    workdir = root / cwd
    result = run_sandboxed(
        [sys.executable, "-m", "xlaport.eval.cuda_to_cpu", str(workdir / script), *args],
        cwd=workdir,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        env={"USE_TORCH_XLA": "0"},
        views=[root],
        reveal=True,  # a tree xlaport wrote itself, as the migrated run's
    )
    if result.returncode == 0 or result.timed_out or result.memory_exceeded:
        return None
    return "\n".join((result.stderr or result.stdout).strip().splitlines()[-80:])


def _original_fails_alike(run: CheckRun, original_error: str) -> CheckRun | None:
    """The failed run as 'could not judge' when the original program, run the same way (CUDA mapped to the CPU),
    failed with the same error, or at the same line of the user's code (torch and torch_xla word one failure
    differently: a float loss given int64 labels is 'Found dtype Long but expected Float' on the CPU and 'Binary op
    subtract with different element types' on XLA): the program or its environment fails here, not the patch."""
    if run.passed is not False:
        return None
    error = (run.report.get("error") or "").strip()
    last = error.splitlines()[-1].strip() if error else ""
    original = original_error.strip().splitlines()
    if len(last) < 12 or not original:
        return None
    if last == original[-1].strip():
        why = f"the original program fails the same way here ({last[:300]})"
    else:
        line = _user_failing_source(error)
        if line is None or len(line) < 8 or line != _user_failing_source(original_error):
            return None
        why = f"the original program fails at the same line here (`{line[:200]}`; the migrated one: {last[:300]})"
    why = (
        f"could not judge the patch: {why}, so the failure is the program's or its environment's; make the "
        "original run first (its data, its dependencies, its torch version)"
    )
    return run.model_copy(update={"passed": None, "reasons": [why]})


def _user_failing_source(error: str) -> str | None:
    """The source line of a traceback's deepest frame in the user's code (not a library's, not Python's)."""
    lines = error.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        frame = _FRAME.match(lines[i])
        if frame and not any(part in frame["path"] for part in _LIBRARY_PATHS):
            following = lines[i + 1] if i + 1 < len(lines) else ""
            return following.strip() if following.strip() and not _FRAME.match(following) else None
    return None


def _context_failure(run: CheckRun, project_sent: bool, cwd: str) -> CheckRun | None:
    """The run as 'could not run' (passed None, what to send) when its failure is missing context, or when it
    ended cleanly without a training step (nothing for the execution check to judge); else None."""
    report = run.report
    if run.passed is None or not report:
        return None
    if report.get("exit_code") == 0 and not report.get("torch_xla_imported"):
        why = (
            "the program ran to its end without importing torch_xla: the device is chosen in files of the project "
            "that are not migrated yet; migrate them too (migrate_repo, or suggest each and send the project with "
            "the migrated files)"
        )
        return run.model_copy(update={"passed": None, "reasons": [f"could not judge the patch: {why}"]})
    if report.get("exit_code") == 0 and not report.get("steps") and not report.get("optimizer_steps"):
        return run.model_copy(
            update={
                "passed": None,
                "report": {**report, "not_applicable": True},
                "reasons": [
                    "the program ran to its end without a training step, so the execution check had nothing to "
                    "judge; the generated tests are the evidence (send `command` for a run that trains)"
                ],
            }
        )
    if run.passed:
        return None
    error = report.get("error") or ""
    last = error.strip().splitlines()[-1] if error.strip() else ""
    why = None
    if module := _MISSING_MODULE.search(last):
        name = module.group(1)
        if importlib.util.find_spec(name.split(".")[0]) is None:
            why = (
                f"the program imports `{name}`, which is neither "
                + ("in the project sent" if project_sent else "sent (only the file was)")
                + " nor installed on this server: "
                + ("add it to the project" if project_sent else SEND_PROJECT)
                + "; if it is a third-party package, it must be installed where the server runs"
            )
    elif _NO_NETWORK.search(last):
        why = (
            "the program fetches data over the network, and validation runs without network: send the data set "
            "in the project, where the program looks for it"
        )
    elif missing := _MISSING_FILE.search(last):
        why = f"the program reads `{missing.group(1)}` (relative to its working folder `{cwd}`), which " + (
            "is not in the project sent: add it, or give the `cwd` the program is run from"
            if project_sent
            else f"was not sent: {SEND_PROJECT}, and the `cwd` it is run from"
        )
    if why is None:
        return None
    return run.model_copy(update={"passed": None, "reasons": [f"could not run: {why} ({last.strip()[:300]})"]})


def check_in_project(
    project: ProjectSource,
    source: str | None,
    rel_path: str,
    args: list[str],
    cwd: str | None,
    command: str | None,
    timeout_s: float,
    memory_mb: int,
) -> CheckRun:
    """The execution check of `rel_path` (its text `source`, else the project's file) run inside a copy of its
    project from `cwd`; `command` (as typed in `cwd`) runs another script of the project instead."""
    from xlaport.eval.sandbox import readable_scratch

    from .checks import run_xla_check

    folder = relative_folder(cwd)
    rel_path = project_path(rel_path)  # a path of the project: never absolute, never `..`
    with readable_scratch("xlaport-check-") as tmp:
        root = Path(tmp, PROJECT)
        project.write_to(root)
        if source is not None:
            write_in_copy(root, rel_path, source)  # never outside the copy (absolute, `..`, a link)
        elif not (root / rel_path).is_file():
            raise ProjectError(f"{rel_path!r} is not a file of the project")
        if not (root / folder).is_dir():
            raise ProjectError(f"`cwd` {folder!r} is not a folder of the project")
        module = None
        if command and (as_module := module_command(command)) is not None:
            module, args = as_module
            try:
                script = os.path.relpath(module_file(root / folder, module), root / folder)
            except (ValueError, FileNotFoundError) as exc:
                raise ProjectError(f"{exc} (the project's folder {folder!r})") from None
        elif command:
            script, args = parse_command(command)
        else:
            script = os.path.relpath(rel_path, folder)
        if not (root / folder / script).is_file():
            raise ProjectError(f"the script {script!r} is not in the project's folder {folder!r}")
        run = run_xla_check(
            root / folder / script, args, timeout_s, memory_mb, root / folder, project=root, module=module
        )
        return _context_failure(run, True, folder) or _fails_in_unmigrated_file(run, root, rel_path) or run


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)')
_LIBRARY_PATHS = ("site-packages", "dist-packages", "/lib/python3", "<frozen")


def deepest_project_frame(error: str, root: Path) -> tuple[str, int, str] | None:
    """The deepest frame of a traceback that lies in a file of the project at `root`: (its path relative to the
    root, the line, the line's text). The run sees the project under another folder, so a frame's file is found
    by the longest tail of its path that names a file of the project."""
    lines = error.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        frame = _FRAME.match(lines[i])
        if not frame or "site-packages" in frame["path"] or "dist-packages" in frame["path"]:
            continue
        parts = PurePosixPath(frame["path"]).parts
        for start in range(1, len(parts)):
            rel = PurePosixPath(*parts[start:])
            if (root / rel).is_file():
                text = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
                return str(rel), int(frame["line"]), text
    return None


def _fails_in_unmigrated_file(run: CheckRun, root: Path, rel_path: str) -> CheckRun | None:
    """The failed run as 'could not judge' when it fails in another file of the project, on a line that still has
    code a TPU host cannot run (a kb finding there, e.g. `.cuda()`): that file needs migrating, not this patch."""
    if run.passed is not False or not run.report.get("exit_code"):
        return None
    frame = deepest_project_frame(run.report.get("error") or "", root)
    if frame is None or PurePosixPath(frame[0]) == PurePosixPath(rel_path):
        return None
    from .checks import failing_findings_at

    path, line, text = frame
    findings = failing_findings_at(root / path, line)
    if not findings:
        return None
    codes = ", ".join(sorted({f"{f.code} ({f.title})" for f in findings}))
    last = (run.report.get("error") or "").strip().splitlines()[-1].strip()
    why = (
        f"could not judge the patch: the run fails at {path}:{line} (`{text}`), in a file this patch does not "
        f"change, which still has code a TPU host cannot run there: {codes}. Migrate {path} too (MCP "
        "`suggest_patch` on it, or `migrate_repo` for the whole project; HTTP `/v1/suggest`) and send the project "
        f"with it migrated ({last[:300]})"
    )
    return run.model_copy(update={"passed": None, "reasons": [why]})


@contextmanager
def project_pair(
    project: ProjectSource, migrated: dict[str, str], original: dict[str, str] | None, cwd: str | None
) -> Iterator[tuple[Path, Path, str]]:
    """Two copies of a project, the original and the migrated, side by side in a scratch folder the sandbox user
    can read: `migrated` (relative path -> text) written into the second, `original` (the same, optional: the
    files as they were, when the project sent holds the migrated ones) into the first. (original root, migrated
    root, the working folder); ProjectError for a path that leaves the project or a `cwd` that is not in it."""
    from xlaport.eval.sandbox import readable_scratch

    folder = relative_folder(cwd)
    if not migrated:
        raise ProjectError("name at least one migrated file of the project (its path and text)")
    with readable_scratch("xlaport-verify-") as tmp:
        roots = Path(tmp, "original", PROJECT), Path(tmp, "migrated", PROJECT)
        for root, texts in zip(roots, (original or {}, migrated), strict=True):
            project.write_to(root)
            for rel_path, text in texts.items():
                write_in_copy(root, rel_path, text)  # never outside the copy (absolute, `..`, a link)
            if not (root / folder).is_dir():
                raise ProjectError(f"`cwd` {folder!r} is not a folder of the project")
        yield roots[0], roots[1], folder
