"""What a kb search returns, and what a finding left for a human is searched by: the half of retrieval that a
plain `migrate` and the fronts import. The search itself (`retrieval.py`) needs numpy and the embedding model
(the `[search]` extra), so it is imported only where a search is made."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from .finding import Finding


class FixHit(BaseModel):
    """One retrieved kb entry."""

    code: str
    title: str
    category: str
    fix: str  # safe | unsafe | manual
    # best passage cosine + SUMMARY_WEIGHT × summary cosine (+ SYMPTOM_BONUS) + LEXICAL_WEIGHT × BM25 / best
    # BM25 of the query: for ranking only
    score: float
    matched: str  # the passage that matched best, e.g. "symptom: RuntimeError: ..."


def finding_query(finding: Finding) -> str:
    """What to search for when a finding is left for a human: its title and message.

    Not the offending line: with it every finding of a new file was a new query for the encoder (35-47 ms each on
    one core, a file's findings up to ~0.8 s), while the findings of the corpus share few messages (1,796
    findings, 112 distinct title + message texts), whose embeddings stay cached (`FixIndex._encode`). On those
    1,796 findings, with the line -> without: the finding's own entry first 1,622 -> 1,618, among the top five
    1,788 -> 1,796; the top fives share 81% of their entries."""
    return f"{finding.title}. {finding.message}"
