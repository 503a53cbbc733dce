"""Starting the check: the sandboxed child that runs the script under the runner, then the graded report."""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..sandbox import read_child_file, readable_scratch, run_sandboxed
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
    max_steps: int | None = None,
) -> CheckReport:
    """Runs `script` with `args` under torch_xla in a child process and grades what happened. `writable`:
    the caller's scratch folders the child may write (handed over to the sandbox user, see eval/sandbox/).
    `max_steps`: the script is stopped cleanly after that many steps (real scripts often loop for hours)."""
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    if steps_warmup < 0:
        raise ValueError("steps_warmup must be >= 0")
    if max_steps is not None and max_steps < 1:
        raise ValueError("max_steps must be >= 1")
    with tempfile.TemporaryDirectory(prefix="xlaport-check-") as tmp:
        tmp_path = Path(tmp)
        events_file = tmp_path / "events.jsonl"
        debug_file = tmp_path / "pt_xla_debug.txt"
        cwd = Path(workdir) if workdir is not None else tmp_path / "work"
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
            [sys.executable, str(RUNNER), str(script), *args],
            cwd=cwd,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            env=child_env,
            writable=[tmp_path, *writable],
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
    )
    if max_steps and report.steps >= max_steps:
        report.notes.append(
            f"stopped after {max_steps} steps, as --max-steps asked; the rest of the script did not run"
        )
    if not result.sandboxed:
        report.notes.append("not sandboxed: " + "; ".join(result.gaps))
    if result.memory_limit_mb < memory_mb:
        report.notes.append(
            f"memory limit lowered to this machine's {result.memory_limit_mb} MB (asked {memory_mb} MB)"
        )
    if workdir is None and report.error and ("FileNotFoundError" in report.error or "No such file" in report.error):
        report.notes.append(
            "the script ran in a fresh temporary working directory: if it reads files by relative path, "
            "run it with --workdir DIR (workdir= in the API)"
        )
    return report


def check_source(source: str, args: Sequence[str] = (), **kwargs) -> CheckReport:
    """Writes `source` to a temporary `script.py` and checks it (for the HTTP service and the MCP tool)."""
    with readable_scratch("xlaport-source-") as tmp:
        script = Path(tmp) / "script.py"
        script.write_text(source, encoding="utf-8")
        return run_check(script, args, **kwargs)
