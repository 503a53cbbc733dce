"""What a code model hands the pipeline: the `Proposal` type and the `Proposer` protocol."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, Field
from xlaport.kb import Finding


class Proposal(BaseModel):
    """A code model's rewrite of one function."""

    function_name: str
    source: str = Field(description="The whole file, with the function rewritten.")
    rationale: str = ""
    model: str = ""


@runtime_checkable
class Proposer(Protocol):
    """What the code model implements. `retrieved` holds FixHit dicts for the function's findings."""

    name: str

    def propose(
        self, source: str, function_name: str, findings: list[Finding], retrieved: list[dict]
    ) -> Proposal | None: ...
