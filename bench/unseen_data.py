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


def image_classes(root: Path, classes: int = 2, per_class: int = 12, size: int = 40) -> None:
    """An ImageFolder tree: `classes` folders of small random RGB PNG images."""
    from PIL import Image

    rng = np.random.default_rng(4)
    for index in range(classes):
        folder = root / f"class{index}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")


MAKERS: dict[str, Callable[[Path], None]] = {
    "image_classes": image_classes,
    "mnist": mnist,
    "fashion_mnist": fashion_mnist,
    "text": text,
    "enwik8": enwik8,
}


def make(spec: str, repo_root: Path) -> None:
    """Writes the data set `spec` names (KIND:RELATIVE_PATH) under `repo_root`."""
    kind, _, relative = spec.partition(":")
    if kind not in MAKERS or not relative:
        raise ValueError(f"unknown data spec {spec!r}: KIND:PATH with KIND one of {sorted(MAKERS)}")
    MAKERS[kind](repo_root / relative)
