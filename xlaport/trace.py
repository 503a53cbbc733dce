"""The migration trace: what `xlaport migrate` records (serve writes it) and fine-tuning learns from
(training reads it). One record type, written and read here, so both sides share one contract.

JSON Lines, one `TraceRecord` per line, schema `xlaport.trace/1`. Each run appends to
`DST/xlaport-trace.jsonl` (with --in-place: the report folder) and to `xlaport.paths.traces_path()`.
A run writes one record per file and one per function that changed or still has findings:

    schema          "xlaport.trace/1"
    run_id          str    one id per migrate run (shared by its records)
    time            str    ISO 8601 UTC, when the run finished
    src             str    absolute path of the migrated tree
    path            str    file path relative to src
    unit            "file" | "function"
    function        str | null   qualified name ("Trainer.step", "main"); "<module>" for top-level
                                 code; null for unit "file"
    original        str    source before (the whole file, or the function's text)
    migrated        str    source after ("" for a function that no longer exists)
    patch           str    unified diff original -> migrated ("" when unchanged)
    codes_applied   [str]  kb codes of the rewrites applied (a function's: those located in it)
    codes_left      [str]  kb codes of the findings left for a human
    proposed_by     [str]  "rules" and/or "model:<name>": what produced the change
    validation      {"status": "validated" | "rejected" | "unvalidated", "level": str | null,
                     "reasons": [str], "command": str | null}   the run's validation verdict
    error           str | null   why the file was not migrated (unreadable, unparsable)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

TRACE_SCHEMA = "xlaport.trace/1"
TRACE_FILE = "xlaport-trace.jsonl"
MODULE_LEVEL = "<module>"  # the `function` of a file's top-level code


@dataclass(frozen=True)
class TraceValidation:
    status: Literal["validated", "rejected", "unvalidated"] = "unvalidated"
    level: str | None = None
    reasons: list[str] = field(default_factory=list)
    command: str | None = None


@dataclass(frozen=True)
class TraceRecord:
    run_id: str
    time: str
    src: str
    path: str
    unit: Literal["file", "function"]
    function: str | None
    original: str
    migrated: str
    patch: str
    codes_applied: list[str]
    codes_left: list[str]
    proposed_by: list[str]
    validation: TraceValidation
    error: str | None = None
    schema: str = TRACE_SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> TraceRecord:
        """Raises ValueError for a record of another schema or with fields missing or unknown."""
        if data.get("schema") != TRACE_SCHEMA:
            raise ValueError(f"not a {TRACE_SCHEMA} record: schema {data.get('schema')!r}")
        try:
            return cls(**{**data, "validation": TraceValidation(**data["validation"])})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed {TRACE_SCHEMA} record: {exc}") from None


def append_records(records: Iterable[TraceRecord], path: Path) -> Path | None:
    """Appends the records to `path` in one write; None when it cannot be written (a read-only cache)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write("".join(record.to_json() + "\n" for record in records))
        return path
    except OSError:
        return None


def read_records(path: Path) -> Iterator[TraceRecord]:
    """The records of a trace file; lines that are not records of this schema (a torn last line, an
    older schema) are skipped. A missing file has no records."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError:
        return
    with handle:
        for line in handle:
            try:
                data = json.loads(line)
                if isinstance(data, dict):
                    yield TraceRecord.from_dict(data)
            except ValueError:
                continue
