"""Small synthetic stand-ins for the data sets real training programs download or expect beside them.

Nothing may be downloaded here, so bench/zero_edit.py writes these where a program looks for its data, in
the formats its loader reads (the loader's own existence checks pass, its parsing runs for real). Each maker
takes the folder the data set's `root` names and is deterministic.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

MNIST_FILES = {
    "train-images-idx3-ubyte": (600, True),
    "train-labels-idx1-ubyte": (600, False),
    "t10k-images-idx3-ubyte": (200, True),
    "t10k-labels-idx1-ubyte": (200, False),
}


def _idx_files(raw: Path, seed: int) -> None:
    """torchvision's MNIST family checks only that these raw files exist, then parses them."""
    rng = np.random.default_rng(seed)
    raw.mkdir(parents=True, exist_ok=True)
    for name, (count, images) in MNIST_FILES.items():
        if images:
            body = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
            header = struct.pack(">IIII", 0x803, count, 28, 28)
        else:
            body = rng.integers(0, 10, size=count, dtype=np.uint8)
            header = struct.pack(">II", 0x801, count)
        (raw / name).write_bytes(header + body.tobytes())


def mnist(root: Path) -> None:
    _idx_files(root / "MNIST" / "raw", seed=0)


def fashion_mnist(root: Path) -> None:
    _idx_files(root / "FashionMNIST" / "raw", seed=1)


def text(path: Path, lines: int = 2000) -> None:
    """A plain-text corpus of lines of words from a small vocabulary."""
    rng = np.random.default_rng(2)
    vocabulary = [f"w{i}" for i in range(400)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(" ".join(rng.choice(vocabulary, size=12)) for _ in range(lines)) + "\n")


def enwik8(path: Path, size: int = 95_000_000) -> None:
    """enwik8-style scripts read 95e6 bytes and split at 90e6: same size, random printable bytes, gzipped."""
    rng = np.random.default_rng(3)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb", compresslevel=1) as out:
        for _ in range(size // 5_000_000):
            out.write(rng.integers(32, 127, size=5_000_000, dtype=np.uint8).tobytes())


def shakespeare_char(folder: Path, size: int = 200_000) -> None:
    """nanoGPT-style character data: train.bin and val.bin (uint16 token ids, 9:1) and meta.pkl (the vocabulary)."""
    import pickle

    rng = np.random.default_rng(4)
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?'\n-"))
    ids = rng.integers(0, len(chars), size=size, dtype=np.uint16)
    folder.mkdir(parents=True, exist_ok=True)
    split = size * 9 // 10
    ids[:split].tofile(folder / "train.bin")
    ids[split:].tofile(folder / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    (folder / "meta.pkl").write_bytes(pickle.dumps(meta))


def binarized_mnist(path: Path) -> None:
    """MADE-style `binarized_mnist.npz`: arrays `train_data` and `valid_data` of 0/1 float32 rows of 784 pixels."""
    rng = np.random.default_rng(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        np.savez(
            out,
            train_data=(rng.random((1000, 784)) < 0.2).astype(np.float32),
            valid_data=(rng.random((200, 784)) < 0.2).astype(np.float32),
        )


def ppi(root: Path, graphs: int = 4, nodes: int = 60, degree: int = 4) -> None:
    """PPI-style graph splits: `{split}_graph.json` (networkx node-link), `_feats.npy` (50 features),
    `_labels.npy` (121 multi-labels), `_graph_id.npy`. Every graph has the same node and edge count, so batches
    of graphs keep one shape."""
    import json

    rng = np.random.default_rng(5)
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        count = graphs if split == "train" else 2
        total = count * nodes
        links = []
        for g in range(count):
            base = g * nodes
            for node in range(nodes):
                links.append((base + node, base + node))  # PPI has self edges
                others = [o for o in range(nodes) if o != node]
                for other in rng.choice(others, size=degree, replace=False):
                    links.append((base + node, base + int(other)))
        edges = [{"source": a, "target": b} for a, b in dict.fromkeys(links)]
        graph = {
            "directed": True,  # each edge once, as written: every graph keeps the same edge count
            "multigraph": False,
            "graph": {},
            "nodes": [{"id": i} for i in range(total)],
            "links": edges,
            "edges": edges,  # networkx 3.4+ reads "edges", older ones "links"
        }
        (root / f"{split}_graph.json").write_text(json.dumps(graph))
        np.save(root / f"{split}_feats.npy", rng.standard_normal((total, 50)).astype(np.float32))
        np.save(root / f"{split}_labels.npy", (rng.random((total, 121)) < 0.3).astype(np.float32))
        np.save(root / f"{split}_graph_id.npy", np.repeat(np.arange(1, count + 1), nodes))


def image_classes(root: Path, classes: int = 2, per_class: int = 12, size: int = 40) -> None:
    """An ImageFolder tree: `classes` folders of small random RGB PNG images."""
    from PIL import Image

    rng = np.random.default_rng(4)
    for index in range(classes):
        folder = root / f"class{index}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def labelled_jpgs(root: Path, classes: int = 6, per_split: int = 36, size: int = 64) -> None:
    """Folders `train_signs`, `val_signs`, `test_signs` of JPEGs whose file name starts with the label digit
    (`3_IMG_0007.jpg`), the layout of the SIGNS data set that cs230-style loaders parse."""
    from PIL import Image

    rng = np.random.default_rng(5)
    for split in ("train", "val", "test"):
        folder = root / f"{split}_signs"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_split):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i % classes}_IMG_{i:04d}.jpg")


MAKERS: dict[str, Callable[[Path], None]] = {
    "labelled_jpgs": labelled_jpgs,
    "shakespeare_char": shakespeare_char,
    "image_classes": image_classes,
    "mnist": mnist,
    "fashion_mnist": fashion_mnist,
    "text": text,
    "enwik8": enwik8,
    "binarized_mnist": binarized_mnist,
    "ppi": ppi,
}


def make(spec: str, repo_root: Path) -> None:
    """Writes the data set `spec` names (KIND:RELATIVE_PATH) under `repo_root`."""
    kind, _, relative = spec.partition(":")
    if kind not in MAKERS or not relative:
        raise ValueError(f"unknown data spec {spec!r}: KIND:PATH with KIND one of {sorted(MAKERS)}")
    MAKERS[kind](repo_root / relative)
