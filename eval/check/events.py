"""Reading what the child left: its JSON-lines events, torch_xla's compilation analysis, the process to report."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..sandbox import read_child_file
from .report import RecompileSource, StepStats

RUNNER = Path(__file__).with_name("runner.py")  # the child's entry point (a script, started by path)
# the child side's own files: their frames are not the user's
CHILD_SIDE = ("runner.py", "probe.py", "probe_reads.py", "probe_placement.py", "probe_watch.py", "probe_sites.py")
CHILD_FILES = tuple(str(RUNNER.with_name(name)) for name in CHILD_SIDE)
# Appended to a host read's site when torch's GradScaler made it (its inf check before each optimizer step).
GRAD_SCALER_READ = " (GradScaler.step: inf check)"


def read_events(path: Path) -> list[dict]:
    """The runner's JSON lines; a last line cut short by a kill is dropped."""
    events = []
    for line in (read_child_file(path) or b"").decode("utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


@dataclass
class Compilation:
    cause: str | None
    location: str | None


_FRAME = re.compile(r"^\s*(?P<func>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")


def parse_compilation_analysis(text: str) -> list[Compilation]:
    """One entry per "Compilation Analysis" block of PT_XLA_DEBUG_LEVEL=1 output, in order."""
    prefix = "Compilation Analysis: "
    compilations: list[Compilation] = []
    block: list[str] | None = None
    for raw in text.splitlines():
        if not raw.startswith(prefix):
            continue
        line = raw[len(prefix) :]
        if line.startswith("====="):
            if block is None:
                block = []
            else:
                compilations.append(_compilation_from_block(block))
                block = None
        elif block is not None:
            block.append(line)
    return compilations


def _compilation_from_block(lines: list[str]) -> Compilation:
    cause = None
    frames: list[str] = []
    section = None
    for line in lines:
        stripped = line.strip()
        if stripped == "Compilation Cause":
            section = "cause"
        elif stripped.startswith("Graph Info"):
            section = "graph"
        elif stripped.startswith("Python Frame Triggered Execution"):
            section = "frames"
        elif stripped.startswith("-----"):
            section = None
        elif section == "cause" and cause is None and stripped:
            cause = stripped
        elif section == "frames":
            match = _FRAME.match(line)
            if match:
                frames.append(f"{match['file']}:{match['line']}")
    return Compilation(cause=cause, location=_user_frame(frames))


def _user_frame(frames: list[str]) -> str | None:
    """The innermost frame outside installed packages and the runner: the user's line."""
    for frame in frames:
        if "site-packages" not in frame and not frame.startswith((*CHILD_FILES, "<frozen")):
            return frame
    return frames[0] if frames else None


@dataclass
class ProcessEvents:
    """The events of the one process whose steps the report shows."""

    main_pid: int | None
    pid: int | None
    steps: list[dict]
    end: dict | None
    imported_t: float | None
    processes_with_steps: int


def pick_process(events: list[dict]) -> ProcessEvents:
    """The process that ran the most steps: the runner itself, or a worker of torch_xla.launch / xmp.spawn."""
    main_pid = next((e["pid"] for e in events if e["event"] == "start"), None)
    steps_by_pid: dict[int, list[dict]] = {}
    for event in events:
        if event["event"] == "step":
            steps_by_pid.setdefault(event["pid"], []).append(event)
    pid = max(steps_by_pid, key=lambda p: (len(steps_by_pid[p]), p == main_pid), default=main_pid)
    return ProcessEvents(
        main_pid=main_pid,
        pid=pid,
        steps=steps_by_pid.get(pid, []),
        end=next((e for e in events if e["event"] == "end" and e["pid"] == pid), None),
        imported_t=next((e["t"] for e in events if e["event"] == "torch_xla_imported" and e["pid"] == pid), None),
        processes_with_steps=len(steps_by_pid),
    )


def last_phase(events: list[dict], process: ProcessEvents, finished: bool) -> str:
    """How far the run got, in words, from the events it left (for runs that were killed)."""
    kinds = {e["event"] for e in events}
    if finished:
        return "after the script ended"
    if "start" not in kinds:
        return "starting Python (before the check's runner ran)"
    if not any(e["event"] == "torch_xla_imported" for e in events):
        return "running the script, before it imported torch_xla"
    beats = [e for e in events if e["event"] == "heartbeat" and e["pid"] == process.pid]
    beat = beats[-1] if beats else {}
    detail = []
    if beat.get("compiles"):
        detail.append(f"{beat['compiles']} graph compilation(s) so far")
    if beat.get("graph_nodes"):
        detail.append(f"the last graph had {beat['graph_nodes']} nodes")
    if beat.get("optimizer_steps"):
        detail.append(f"{beat['optimizer_steps']} optimizer step(s)")
    where = (
        f"in XLA step {len(process.steps)} ({len(process.steps)} complete)"
        if process.steps
        else "after importing torch_xla, before the first XLA step"
    )
    return where + (": " + ", ".join(detail) if detail else "")


def device_choice(events: list[dict], args: list[str] = ()) -> str | None:
    """Where the device of a module left off the XLA device was chosen: the command-line flag that named it
    (`--device cpu`, a configurator's `--device=cpu`, a `--cpu` switch), else `file:line: source` of the (up to
    three nearest) assignments of the name passed to `.to(...)` there, else the `.to(...)` call itself."""
    move = next((e for e in events if e["event"] == "off_xla_move" and e.get("site")), None)
    if move is None:
        return None
    path, _, line = move["site"].rpartition(":")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        call = lines[int(line) - 1]
    except (OSError, ValueError, IndexError):
        lines, call = [], ""
    name = re.search(r"\.to\(\s*([A-Za-z_][\w.]*)\s*[,)]", call)
    flag = device_flag(list(args), move.get("device", "cpu"), name.group(1) if name else None)
    if flag is not None:  # the command line overrides whatever the script assigns: never blame an assignment
        return flag + (f" (at {move['site']}: {call.strip()})" if call else "")
    if not call:
        return move["site"]
    found = []
    if name is not None:
        assign = re.compile(rf"^\s*{re.escape(name.group(1))}\s*(?::[^=]*)?=(?!=)")
        found = [n for n in range(int(line) - 1, 0, -1) if assign.match(lines[n - 1])][:3]
    if not found:
        return f"{move['site']}: {call.strip()}"
    where = "; ".join(f"{path}:{n}: {lines[n - 1].strip()}" for n in sorted(found))
    if any("accelerator" in lines[n - 1] or "cuda" in lines[n - 1] for n in found):
        where += " (torch.accelerator and torch.cuda know nothing of XLA: take the device from torch_xla.device())"
    return where


# A command-line switch that keeps a program off the accelerator: --cpu, --use_cpu, --no-cuda, --no_accel ...
_CPU_SWITCH = re.compile(r"--?(?:use[-_]?)?cpu|--?no[-_]?(?:cuda|gpu|accel\w*)", re.I)


def device_flag(args: list[str], device: str, name: str | None) -> str | None:
    """The command line's choice of `device` (the device type the model ended up on), in words with the
    arguments that give the XLA device instead; None when no argument chose it. A value flag counts when its
    name mentions "device" or is the name passed to `.to(...)` (`args.dev` -> `--dev`)."""
    wanted = {"device"} | ({name.rpartition(".")[2].lower()} if name else set())
    for index, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        key, equals, value = arg.partition("=")
        if not equals and index + 1 < len(args):
            value = args[index + 1]
        bare = key.lstrip("-").lower().replace("-", "_")
        if any(w in bare for w in wanted) and value.split(":")[0].lower() == device:
            given = arg if equals else f"{key} {value}"
            xla = f"{key}=xla" if equals else f"{key} xla"
            verify = f"--migrated-arg={key}=xla" if equals else f"--migrated-arg={key} --migrated-arg=xla"
            return (
                f"the command line: `{given}` chose the {device} device, overriding what the script assigns; "
                f"pass the XLA device instead (`{xla}`; for verify, keep the original's arguments and add "
                f"`{verify}`) (kb XLA233)"
            )
        if _CPU_SWITCH.fullmatch(key) and device == "cpu":
            return (
                f"the command line: the `{key}` switch keeps the model on the CPU; run without it "
                "(verify runs the original's CUDA code on the CPU by itself, so the reference needs no switch either) (kb XLA233)"
            )
    return None


def recompile_sources(
    per_step: list[StepStats], compilations: list[Compilation], steps_warmup: int
) -> list[RecompileSource]:
    """Groups the compilations of the steps after warm-up by (source line, cause).

    The debug file lists compilations in the order they happened, the same order the steps count
    them in, so the k-th compilation belongs to the step whose running count covers k.
    """
    groups: dict[tuple[str | None, str | None], RecompileSource] = {}
    position = 0
    for step in per_step:
        for k in range(position, position + step.compiles):
            if step.index < steps_warmup:
                continue
            known = compilations[k] if k < len(compilations) else Compilation(None, step.sync_site)
            key = (known.location or step.sync_site, known.cause)
            source = groups.setdefault(key, RecompileSource(location=key[0], cause=key[1], compiles=0, steps=[]))
            source.compiles += 1
            if step.index not in source.steps:
                source.steps.append(step.index)
        position += step.compiles
    return sorted(groups.values(), key=lambda s: -s.compiles)
