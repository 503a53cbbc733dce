"""Where a run died when it died inside a dependency (an installed package), and what explains the error.

A migration changes the program's own files; a crash raised by an installed package's code (`site-packages`)
needs the workaround applied there (a patch, a pinned version, an option of the package). `dependency_frame`
finds that frame in the traceback: the innermost frame outside torch and torch_xla (whose frames only say
where the framework noticed the problem). `Explain` is what a caller above the check passes in to name the kb
entry whose symptom the error matches (the kb sits beside eval, so eval never imports it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# an error line -> the sentences of the kb entries whose symptom it matches ("XLA522: ...")
Explain = Callable[[str], list[str]]

FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
INSTALLED = re.compile(r"[/\\](?:site|dist)-packages[/\\]")
# the framework: its frames say where it noticed a problem, not whose call caused it
FRAMEWORK = frozenset({"torch", "torch_xla", "functorch", "torchgen"})


@dataclass(frozen=True)
class DependencyFrame:
    package: str  # the installed package's top-level name
    path: str
    line: int
    function: str

    def where(self) -> str:
        return f"{self.path}:{self.line}, in {self.function}"


def dependency_frame(traceback_text: str | None) -> DependencyFrame | None:
    """The innermost non-framework frame of the traceback when it is an installed package's; None when the
    program's own code (or no traceback) is there."""
    frames = [m for m in map(FRAME.match, (traceback_text or "").splitlines()) if m]
    for frame in reversed(frames):
        path = frame["path"]
        installed = INSTALLED.split(path, maxsplit=1)
        if len(installed) == 2:
            package = re.split(r"[/\\]", installed[1])[0].removesuffix(".py")
            if package in FRAMEWORK:
                continue
            return DependencyFrame(package, path, int(frame["line"]), frame["function"].strip())
        if path.startswith("<") or "/lib/python3" in path:  # `<frozen ...>`, the standard library
            continue
        return None  # the program's own file
    return None


# an exception's own line: `ValueError: ...`, `torch.OutOfMemoryError: ...`, `KeyboardInterrupt`
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b")


def error_line(traceback_text: str | None) -> str:
    """The exception's own line: after the last traceback, its first unindented line that names an exception
    (torch_xla adds lines after it, such as `Failed after pipeline-start`); else the last unindented line."""
    text = traceback_text or ""
    tail = text[text.rfind("Traceback (most recent call last):") :] if "Traceback (most recent" in text else text
    lines = [line for line in tail.splitlines() if line.strip() and not line.startswith(" ")]
    named = [line for line in lines if EXCEPTION_LINE.match(line)]
    return named[0] if named else (lines[-1] if lines else "")


# what an error line says torch_xla no longer has: an attribute of one of its modules, a name to import, a module
MISSING_XLA_API = (
    re.compile(r"module '(?P<module>torch_xla[\w.]*)' has no attribute '(?P<name>\w+)'"),
    re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>torch_xla[\w.]*)'"),
    re.compile(r"No module named '(?P<module>torch_xla[\w.]*)'"),
)


def missing_xla_api(line: str) -> str | None:
    """The torch_xla API an error line says is missing (`torch_xla.core.xla_model.xrt_world_size`): one that the
    installed torch_xla removed or renamed; None for other errors."""
    for pattern in MISSING_XLA_API:
        match = pattern.search(line)
        if match:
            name = match.groupdict().get("name")
            return f"{match['module']}.{name}" if name else match["module"]
    return None


def crash_reason(traceback_text: str | None, explain: Explain | None) -> str:
    """What to add to the reason of a run that exited with an error: the dependency it was raised in (package,
    file:line) and the kb entries that explain the error, with their workaround; "" when there is neither."""
    frame = dependency_frame(traceback_text)
    entries = explain(error_line(traceback_text)) if explain is not None and traceback_text else []
    parts = []
    if frame is not None:
        parts.append(
            f"raised inside the dependency `{frame.package}` ({frame.where()}), which a migration of the program "
            "does not change"
        )
        removed = missing_xla_api(error_line(traceback_text))
        if removed is not None:
            parts.append(
                f"`{frame.package}` uses `{removed}`, which the installed torch_xla no longer has (removed or "
                "renamed): use a release of the package that no longer calls it, or a shim that maps it to its "
                "replacement before the package runs"
            )
    if entries:
        where = f" in `{frame.package}`" if frame is not None else ""
        parts.append(f"explained by {'; '.join(entries)} (apply the workaround{where})")
    return "; ".join(parts)
