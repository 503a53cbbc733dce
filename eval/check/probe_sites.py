"""Where in the checked script something happens: `file:line` of the nearest user frame (not torch, torch_xla,
site-packages or the check's own child side, events.py `CHILD_FILES`), and the process's resident memory."""

from __future__ import annotations

import os
import sys
import threading

from xlaport.eval.check.events import CHILD_FILES


def in_stack(file_suffix: str, depth: int = 2) -> bool:
    frame = sys._getframe(depth)
    while frame is not None:
        if frame.f_code.co_filename.endswith(file_suffix):
            return True
        frame = frame.f_back
    return False


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def user_site(depth: int = 2) -> str | None:
    """`file:line` of the nearest caller outside torch_xla, torch and the check's child side."""
    return first_user_frame(sys._getframe(depth))


def in_grad_scaler(frame) -> bool:
    """Is a frame of torch's GradScaler on the stack (the found_inf read of `scaler.step`)?"""
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("torch", "amp", "grad_scaler.py")):
            return True
        frame = frame.f_back
    return False


def first_user_frame(frame) -> str | None:
    """`file:line` of `frame` or the nearest frame below it that is user code (not site-packages, not the runner or the probe)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name in CHILD_FILES or "site-packages" in name or name.startswith("<frozen")):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def main_thread_site() -> str | None:
    """`file:line` of the user code the main thread is running now."""
    return first_user_frame(sys._current_frames().get(threading.main_thread().ident))
