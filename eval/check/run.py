"""Starting the check: the sandboxed child that runs the script under the runner, then the graded report."""

from __future__ import annotations

import glob
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from xlaport.files import module_file

from ..sandbox import SandboxResult, project_root, read_child_file, readable_scratch, run_sandboxed, scratch
from .crash import Explain
from .events import RUNNER, parse_compilation_analysis, read_events
from .grade import build_report
from .report import CheckReport

GOOGLE_PCI_VENDOR = "0x1ae0"


def default_pjrt_device(env: Mapping[str, str]) -> str:
    """PJRT_DEVICE as given, else TPU when a Google TPU is attached over PCI, else CPU."""
    if env.get("PJRT_DEVICE"):
        return env["PJRT_DEVICE"]
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if Path(vendor).read_text().strip() == GOOGLE_PCI_VENDOR:
                return "TPU"
        except OSError:
            continue
    return "CPU"


def run_check(
    script: Path,
    args: Sequence[str] = (),
    steps_warmup: int = 2,
    timeout_s: float = 600,
    memory_mb: int = 8192,
    env: Mapping[str, str] | None = None,
    workdir: Path | None = None,
    writable: Sequence[Path] = (),
    project: Path | None = None,
    reveal: bool = False,
    allow_unsandboxed: bool = False,
    keep_outputs: Path | None = None,
    max_steps: int | None = None,
    explain: Explain | None = None,
    module: str | None = None,
) -> CheckReport:
    """Runs `script` with `args` under torch_xla in a child process and grades what happened, as
    `cd WORKDIR && python SCRIPT ARGS` would run it: a relative `script` is found in `workdir`, which is the
    run's working folder (None: a fresh private folder, for submitted code that has no folder of its own).
    The run sees its project (`project`, else the enclosing git work tree or project folder of `workdir`,
    view.project_root) as a private writable view: it may write there, `../data` and imports of the parent
    work, and the user's files are never changed; the report says what it wrote (kept in `keep_outputs` when
    given). `reveal`: the sandbox user may read in the view what it could not (the caller could: the CLI's
    user, never a server's client); `allow_unsandboxed`: what the sandbox user cannot read is run as root
    instead of refused (SandboxRefused), said first in the notes. `writable`: the caller's scratch folders the
    child may write (handed over to the sandbox user, see eval/sandbox/). `max_steps`: the script is stopped
    cleanly after that many steps (real scripts often loop for hours). `explain`: names the kb entries that
    explain an error the run died of (crash.py; the kb's `explain_error`). `module`: run `python -m MODULE ARGS`
    from `workdir` instead (`script` is then ignored: the module's file, found there as `-m` finds it, stands for
    it in the report)."""
    if module is not None:
        script = module_file(Path(workdir or "."), module)
    script = Path(script)
    if not script.is_absolute() and workdir is not None:
        script = Path(workdir) / script
    script = script.resolve()
    if not script.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    if steps_warmup < 0:
        raise ValueError("steps_warmup must be >= 0")
    if max_steps is not None and max_steps < 1:
        raise ValueError("max_steps must be >= 1")
    views = []
    if workdir is not None and not any(Path(workdir).resolve().is_relative_to(Path(w).resolve()) for w in writable):
        # the user's folder (the caller's own scratch, handed over, is private already)
        workdir = Path(workdir).resolve()
        views.append(Path(project).resolve() if project is not None else project_root(workdir))
        if not any(script.is_relative_to(v) for v in views):  # a script from elsewhere: its own project too
            views.append(project_root(script.parent))
    with scratch("xlaport-check-", avoid=views) as tmp:
        tmp_path = Path(tmp)
        events_file = tmp_path / "events.jsonl"
        debug_file = tmp_path / "pt_xla_debug.txt"
        cwd = workdir if workdir is not None else tmp_path / "work"
        cwd.mkdir(exist_ok=True)
        merged_env = {**os.environ, **(env or {})}
        child_env = {
            **(env or {}),
            "PJRT_DEVICE": default_pjrt_device(merged_env),
            "XLAPORT_CHECK_OUT": str(events_file),
            "XLAPORT_SCRIPT_DIR": str(script.parent),
            # per-compilation analysis (cause + Python frames) to name the source of recompilations
            "PT_XLA_DEBUG_LEVEL": "1",
            "PT_XLA_DEBUG_FILE": str(debug_file),
            "PT_XLA_DEBUG_MAX_FRAME": "20",
        }
        if max_steps:
            child_env["XLAPORT_CHECK_MAX_STEPS"] = str(max_steps)
        child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", merged_env.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        launched_at = time.time()
        result = run_sandboxed(
            [sys.executable, str(RUNNER), *(["-m", module] if module else [str(script)]), *args],
            cwd=cwd,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            env=child_env,
            writable=[tmp_path, *writable],
            views=views,
            reveal=reveal,
            allow_unsandboxed=allow_unsandboxed,
            keep_outputs=keep_outputs,
        )
        events = read_events(events_file)
        debug_text = (read_child_file(debug_file) or b"").decode("utf-8", errors="replace")
        compilations = parse_compilation_analysis(debug_text)
    report = build_report(
        script=script,
        args=list(args),
        steps_warmup=steps_warmup,
        timeout_s=timeout_s,
        result=result,
        events=events,
        compilations=compilations,
        launched_at=launched_at,
        pjrt_device=child_env["PJRT_DEVICE"],
        memory_mb=result.memory_limit_mb,  # the limit that applied (the sandbox may clamp it)
        explain=explain,
    )
    if module is not None:
        report.notes.append(f"ran as `python -m {module}` from {cwd} (the module's file: {script})")
    if max_steps and report.steps >= max_steps:
        report.notes.append(
            f"stopped after {max_steps} steps, as --max-steps asked; the rest of the script did not run"
        )
    if result.memory_limit_mb < memory_mb:
        report.notes.append(
            f"memory limit lowered to this machine's {result.memory_limit_mb} MB (asked {memory_mb} MB)"
        )
    if result.views:
        report.notes.append(outputs_note(result))
    if views and report.error and ("PermissionError" in report.error or "No such file" in report.error):
        report.notes.append(
            f"the run sees {', '.join(str(v) for v in views)} (its project) and the system's read-only files: "
            "if the script reaches above that, pass --project DIR (project= in the API)"
        )
    if workdir is None and report.error and ("FileNotFoundError" in report.error or "No such file" in report.error):
        report.notes.append(
            "the script ran in a fresh temporary working directory: if it reads files by relative path, "
            "run it with --workdir DIR (workdir= in the API)"
        )
    if not result.sandboxed:  # first: a reader must not miss it
        report.notes.insert(0, "not sandboxed: " + "; ".join(result.gaps))
    return report


def outputs_note(result: SandboxResult, shown: int = 5) -> str:
    """Where the run's writes went: the user's folders are never written."""
    seen = "; ".join(result.views)
    if not result.outputs and not result.outputs_removed:
        return f"outputs: the run saw {seen} and wrote nothing there"
    names = ", ".join(result.outputs[:shown]) + (
        f" and {len(result.outputs) - shown} more" if len(result.outputs) > shown else ""
    )
    text = f"outputs: the run saw {seen}; it wrote {len(result.outputs)} file(s), {result.outputs_bytes / 2**20:.1f} MB"
    text += f" ({names})" if names else ""
    if result.outputs_removed:
        text += f" and removed {len(result.outputs_removed)} (only in its view)"
    if result.outputs_kept:
        return text + f"; kept in {result.outputs_kept}"
    return text + "; discarded with the run (--keep-outputs DIR keeps them)"


def check_source(source: str, args: Sequence[str] = (), **kwargs) -> CheckReport:
    """Writes `source` to a temporary `script.py` and checks it (for the HTTP service and the MCP tool)."""
    with readable_scratch("xlaport-source-") as tmp:
        script = Path(tmp) / "script.py"
        script.write_text(source, encoding="utf-8")
        return run_check(script, args, **kwargs)
