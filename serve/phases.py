"""Where a migration's time goes: its phases (rewrite, related fixes, write, verify, validate, reports), each timed,
with the steps inside one (verify's migrated run, the original's runs; validation's execution check and tests).

The pipeline announces each phase and step to a listener (the CLI's progress display) as it starts, and records
what it took in the MigrationResult (`phases`), which the HTML report shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from pydantic import BaseModel, Field

Step = Callable[[str], None]  # a step of the current phase starts (the previous one ends)


class PhaseTime(BaseModel):
    name: str
    seconds: float
    phase: str | None = Field(None, description="The phase this is a step of; None for a phase.")


class PhaseListener(Protocol):
    """What a progress display is told: a phase or step starts, files of the rewrite are done."""

    def phase(self, name: str, step: str | None = None) -> None: ...

    def files(self, done: int, total: int, path: str) -> None: ...


class PhaseTimer:
    """Times the phases of one migration, in order; tells `listener` (if any) when each phase and step starts.
    `start` ends the phase before it, so the pipeline marks each phase with one line."""

    def __init__(self, listener: PhaseListener | None = None) -> None:
        self.listener = listener
        self.timings: list[PhaseTime] = []
        self._phase: tuple[str, float, int] | None = None  # name, start, where its entry goes
        self._step: tuple[str, float] | None = None

    def start(self, name: str) -> None:
        """Phase `name` starts now; the one before it ends."""
        self.stop()
        self._phase = (name, time.perf_counter(), len(self.timings))
        if self.listener is not None:
            self.listener.phase(name)

    def step(self, name: str) -> None:
        """A step of the current phase starts now; the previous step, if any, ends."""
        self._end_step()
        self._step = (name, time.perf_counter())
        if self.listener is not None:
            self.listener.phase(self._phase[0] if self._phase else name, name)

    def stop(self) -> None:
        """The current phase (and its step) ends."""
        self._end_step()
        if self._phase is not None:
            name, started, at = self._phase
            self.timings.insert(at, PhaseTime(name=name, seconds=round(time.perf_counter() - started, 3)))
            self._phase = None

    def files(self, done: int, total: int, path: str) -> None:
        """The rewrite's progress (kb/batch.py's Progress)."""
        if self.listener is not None:
            self.listener.files(done, total, path)

    def _end_step(self) -> None:
        if self._step is not None:
            name, started = self._step
            phase = self._phase[0] if self._phase else None
            self.timings.append(PhaseTime(name=name, seconds=round(time.perf_counter() - started, 3), phase=phase))
            self._step = None
