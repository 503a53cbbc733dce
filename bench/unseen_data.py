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


def citation_graph(folder: Path, papers: int = 1600, words: int = 200, classes: int = 7, cites: int = 4) -> None:
    """Cora-style citation data (what GCN/GAT scripts read from `folder`): `cora.content`, one paper a line
    (an id, 0/1 word features, a class name; tab-separated) and `cora.cites` (cited id, citing id). Ids are not
    0..n-1, as in the real file; splits like range(500, 1500) need at least 1500 papers."""
    rng = np.random.default_rng(6)
    folder.mkdir(parents=True, exist_ok=True)
    ids = 1000 + 7 * np.arange(papers)
    topics = [f"Topic_{k}" for k in range(classes)]
    with open(folder / "cora.content", "w") as out:
        for paper in ids:
            bits = "\t".join(map(str, (rng.random(words) < 0.05).astype(int)))
            out.write(f"{paper}\t{bits}\t{topics[int(rng.integers(classes))]}\n")
    with open(folder / "cora.cites", "w") as out:
        for citing in ids:
            for cited in rng.choice(ids, size=cites, replace=False):
                if cited != citing:
                    out.write(f"{cited}\t{citing}\n")


def image_classes(root: Path, classes: int = 2, per_class: int = 12, size: int = 40) -> None:
    """An ImageFolder tree: `classes` folders of small random RGB PNG images."""
    from PIL import Image

    rng = np.random.default_rng(4)
    for index in range(classes):
        folder = root / f"class{index}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")


SYNTHETIC_MARK = ".xlaport-synthetic"  # bench/unseen.py's torchvision hook trusts files in a folder holding this


def token_shards(folder: Path, shards: int = 2, tokens: int = 100_000, vocab: int = 32000) -> None:
    """Pretokenized shards (llama2.c-style `dataNN.bin`: uint16 token ids, BOS = 1 between stories); the first
    shard is the validation split."""
    rng = np.random.default_rng(9)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        ids = rng.integers(3, vocab, tokens, dtype=np.uint16)
        ids[::200] = 1
        (folder / f"data{i:02d}.bin").write_bytes(ids.tobytes())


def texture_digits(root: Path, count: int = 128, size: int = 28, texture: int = 256) -> None:
    """A coloured-digit-on-texture set (`root`/imdb.json with `train_data`/`test_data` entries naming a digit PNG,
    a texture PNG, the texture's class and the digit's colour; `texture_classes_index`)."""
    import json

    rng = np.random.default_rng(12)
    textures = ["banded", "dotted", "woven"]
    for name in textures:
        _png(root / "textures" / f"{name}.png", rng.integers(0, 256, (texture, texture, 3), dtype=np.uint8))
    entries = []
    for i in range(count):
        digit = i % 10
        _png(root / "digits" / f"{i}.png", rng.integers(0, 256, (size, size), dtype=np.uint8))
        r, g, b = rng.random(3).round(3)
        name = textures[i % len(textures)]
        entries.append(
            {
                "digit_name": str(digit),
                "digit_image": f"digits/{i}.png",
                "texture_name": name,
                "texture_image": f"textures/{name}.png",
                "color_r": float(r),
                "color_g": float(g),
                "color_b": float(b),
            }
        )
    imdb = {
        "train_data": entries,
        "test_data": entries[:16],
        "texture_classes_index": {n: i for i, n in enumerate(textures)},
    }
    (root / "imdb.json").write_text(json.dumps(imdb))


def _mark(folder: Path) -> None:
    """torchvision's CIFAR loaders check each file's md5 against the real data set (and download on a mismatch):
    a folder carrying this mark is trusted by the bench environment's hook instead (bench/synthetic_trust.py)."""
    (folder / SYNTHETIC_MARK).write_text("synthetic stand-in written by bench/unseen_data.py\n")


def _cifar_batch(rng: np.random.Generator, count: int, label_key: str, classes: int) -> dict:
    images = rng.integers(0, 256, size=(count, 3 * 32 * 32), dtype=np.uint8)
    return {"data": images, label_key: rng.integers(0, classes, size=count).tolist()}


def cifar10(root: Path, per_batch: int = 100) -> None:
    """torchvision CIFAR10's pickled batches under `root`/cifar-10-batches-py (5 train batches, 1 test)."""
    import pickle

    rng = np.random.default_rng(6)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(pickle.dumps(_cifar_batch(rng, per_batch, "labels", 10)))
    meta = {"label_names": [f"class{i}" for i in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    _mark(folder)


def cifar100(root: Path, train: int = 500, test: int = 100) -> None:
    """torchvision CIFAR100's pickles under `root`/cifar-100-python (train, test, meta)."""
    import pickle

    rng = np.random.default_rng(7)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", train), ("test", test)):
        (folder / name).write_bytes(pickle.dumps(_cifar_batch(rng, count, "fine_labels", 100)))
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": [f"class{i}" for i in range(100)]}))
    _mark(folder)


def cora(folder: Path, papers: int = 1600, features: int = 300, edges: int = 4000) -> None:
    """Cora-style citation graph: `cora.content` (id, 0/1 features, class name) and `cora.cites` (id pairs).
    1600 papers: loaders in the Kipf style split 0-140 / 200-500 / 500-1500 by index."""
    rng = np.random.default_rng(8)
    folder.mkdir(parents=True, exist_ok=True)
    ids = rng.choice(np.arange(1000, 10_000_000), size=papers, replace=False)
    classes = [f"Topic_{i}" for i in range(7)]
    rows = []
    for paper in ids:
        bits = " ".join(str(b) for b in (rng.random(features) < 0.05).astype(int))
        rows.append(f"{paper} {bits} {classes[rng.integers(0, 7)]}")
    (folder / "cora.content").write_text("\n".join(rows) + "\n")
    pairs = rng.choice(ids, size=(edges, 2))
    (folder / "cora.cites").write_text("\n".join(f"{a} {b}" for a, b in pairs if a != b) + "\n")


def _png(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def paired_images(root: Path, count: int = 6, size: int = 64) -> None:
    """pix2pix-style pairs: `root`/{train,test}/{a,b}/N.jpg, the same file names on both sides."""
    rng = np.random.default_rng(9)
    for split in ("train", "test"):
        for side in ("a", "b"):
            for i in range(count):
                _png(root / split / side / f"{i}.jpg", rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def isic(root: Path, count: int = 6, size: int = 64) -> None:
    """ISIC-2018-style segmentation folders: `root`/{train,valid,test}/ISIC_N.jpg and
    `root`/{split}_GT/ISIC_N_segmentation.png (a binary mask)."""
    rng = np.random.default_rng(10)
    for split in ("train", "valid", "test"):
        for i in range(count):
            name = f"{i:07d}"
            _png(root / split / f"ISIC_{name}.jpg", rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
            mask = (rng.random((size, size)) < 0.3).astype(np.uint8) * 255
            _png(root / f"{split}_GT" / f"ISIC_{name}_segmentation.png", mask)


def digit_folders(root: Path, per_digit: int = 20) -> None:
    """MNIST as image files: `root`/<digit>/N.png, 28x28 grey."""
    rng = np.random.default_rng(11)
    for digit in range(10):
        for i in range(per_digit):
            _png(root / str(digit) / f"{i}.png", rng.integers(0, 256, (28, 28), dtype=np.uint8))


def face_folder(root: Path) -> None:
    """A CelebA-like ImageFolder for DCGAN-style scripts: one class of 300 small RGB images (batches of 128 make
    two full batches and a partial one per epoch)."""
    image_classes(root, classes=1, per_class=300, size=64)


def text_splits(folder: Path) -> None:
    """A word-level language-model corpus: train.txt, valid.txt and test.txt (PTB-style folder)."""
    text(folder / "train.txt", lines=2000)
    text(folder / "valid.txt", lines=200)
    text(folder / "test.txt", lines=200)


def image_splits(root: Path) -> None:
    """`train/` and `test/` ImageFolder trees of three classes (a course's food-photo layout): 16 and 4 images
    per class, so a batch of 32 gives two training steps an epoch and one test step."""
    image_classes(root / "train", classes=3, per_class=16)
    image_classes(root / "test", classes=3, per_class=4)


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


def gridworld_npz(path: Path, size: int = 8, train: int = 96, test: int = 32) -> None:
    """A value-iteration-network data file (`np.savez_compressed`, arrays arr_0..arr_7): train images (N, 2, size,
    size) of obstacle and goal maps, the agent's row and column, the action label (0-7); then the same for test."""
    rng = np.random.default_rng(8)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = []
    for count in (train, test):
        images = np.zeros((count, 2, size, size), dtype=np.float32)
        images[:, 0] = rng.random((count, size, size)) < 0.2  # obstacles
        goals = rng.integers(0, size, size=(count, 2))
        images[np.arange(count), 1, goals[:, 0], goals[:, 1]] = 10.0  # the goal's reward
        arrays += [images, rng.integers(0, size, count), rng.integers(0, size, count), rng.integers(0, 8, count)]
    np.savez_compressed(path, *arrays)


def _sr_h5(path: Path, lr_size: int, hr_size: int, count: int, grouped: bool) -> None:
    """A super-resolution data file (h5py): datasets `lr` and `hr` of uint8-range patches (count, size, size), or
    (`grouped`) groups `lr` and `hr` holding one image per index, "0", "1", ... (an evaluation file)."""
    import h5py

    rng = np.random.default_rng(9)
    path.parent.mkdir(parents=True, exist_ok=True)
    hr = rng.integers(0, 256, size=(count, hr_size, hr_size)).astype(np.float32)
    step = hr_size // lr_size
    lr = hr[:, ::step, ::step][:, :lr_size, :lr_size] if step > 1 else hr + rng.normal(0, 8, hr.shape)
    lr = lr.astype(np.float32)  # what the repositories' prepare.py writes: float32 luminance
    with h5py.File(path, "w") as f:
        if not grouped:
            f.create_dataset("lr", data=lr)
            f.create_dataset("hr", data=hr)
            return
        for name, images in (("lr", lr), ("hr", hr)):
            group = f.create_group(name)
            for index, image in enumerate(images):
                group.create_dataset(str(index), data=image)


def srcnn_train(path: Path) -> None:
    """SRCNN's training file: 33x33 low- and high-resolution patches of the same size (the low one upscaled)."""
    _sr_h5(path, 33, 33, 64, grouped=False)


def vdsr_patches(path: Path, count: int = 32, size: int = 41) -> None:
    """VDSR's `train.h5`: datasets `data` (the blurred input) and `label` (the sharp target), float32 in [0, 1],
    shaped (count, 1, size, size) as its MATLAB preparation writes them."""
    import h5py

    rng = np.random.default_rng(12)
    path.parent.mkdir(parents=True, exist_ok=True)
    label = rng.random((count, 1, size, size), dtype=np.float32)
    data = np.clip(label + rng.normal(0, 0.05, label.shape), 0, 1).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data)
        f.create_dataset("label", data=label)


def srcnn_eval(path: Path) -> None:
    _sr_h5(path, 48, 48, 4, grouped=True)


def fsrcnn_train(path: Path) -> None:
    """FSRCNN's training file at scale 3: 10x10 low-resolution patches, 30x30 high-resolution ones."""
    _sr_h5(path, 10, 30, 64, grouped=False)


def fsrcnn_eval(path: Path) -> None:
    _sr_h5(path, 16, 48, 4, grouped=True)


def cifar10_small(root: Path) -> None:
    """The same, 16 images a batch (80 to train on): a ResNet-18 step takes seconds on a shared CPU."""
    cifar10(root, per_batch=16)


def hourly_series(path: Path, hours: int = 14_400, columns: int = 7) -> None:
    """An ETT-style CSV of hourly readings: a `date` column (from 2016-07-01 00:00) and `columns` float columns,
    the last named OT (the usual target). 14,400 rows: loaders that split 12/4/4 months of 30 days need 20 months."""
    rng = np.random.default_rng(12)
    names = [f"load{i}" for i in range(columns - 1)] + ["OT"]
    start = np.datetime64("2016-07-01T00:00")
    values = np.cumsum(rng.standard_normal((hours, columns)), axis=0).round(3)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        out.write(",".join(["date", *names]) + "\n")
        for hour, row in enumerate(values):
            stamp = str(start + np.timedelta64(hour, "h")).replace("T", " ")
            out.write(stamp + ":00," + ",".join(map(str, row)) + "\n")


def image_folder_64(root: Path) -> None:
    """One class of 48 random 64x64 RGB images (scripts that only support 64x64 inputs)."""
    image_classes(root, classes=1, per_class=48, size=64)


def folder(path: Path) -> None:
    """An empty folder a program writes into but its repository does not hold (git keeps no empty folders):
    what a user creates after the first `FileNotFoundError` of a fresh clone."""
    path.mkdir(parents=True, exist_ok=True)


def car_masks(root: Path, count: int = 24, width: int = 128, height: int = 96) -> None:
    """Carvana-style segmentation pairs: `root`/imgs/N.jpg (RGB) and `root`/masks/N_mask.gif (a 0/1 palette
    mask of a random ellipse), the same stem on both sides."""
    from PIL import Image

    rng = np.random.default_rng(13)
    rows, cols = np.mgrid[0:height, 0:width]
    for i in range(count):
        _png(root / "imgs" / f"car{i:03d}.jpg", rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        cy, cx = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width
        inside = ((rows - cy) / (0.3 * height)) ** 2 + ((cols - cx) / (0.3 * width)) ** 2 < 1
        (root / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray(inside.astype(np.uint8), mode="L").save(root / "masks" / f"car{i:03d}_mask.gif")


def tagged_sentences(path: Path, sentences: int = 600, vocabulary: int = 300, tags: int = 5) -> None:
    """A sequence-labelling set already indexed by its repository's prepare step: `path` holds one sentence a
    line, `c+c+c:w c+c:w ...<TAB>t t ...` (character ids + word id per token, then a tag id per token), beside
    it `path`.char_to_idx / .word_to_idx / .tag_to_idx list the tokens one a line (line number = id; the first
    ones are <PAD>, <SOS>, <EOS>, <UNK>). Sentences of 4-14 words, so batches differ in length as real ones do."""
    rng = np.random.default_rng(14)
    specials = ["<PAD>", "<SOS>", "<EOS>", "<UNK>"]
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: list[str] = []
    while len(words) < vocabulary:  # distinct: the loader numbers the lines of its vocabulary file as a dict does
        word = "".join(rng.choice(list(letters), rng.integers(2, 8)))
        words += [] if word in words else [word]
    char_ids = {c: len(specials) + i for i, c in enumerate(letters)}
    lines = []
    for _ in range(sentences):
        picked = rng.integers(0, vocabulary, rng.integers(4, 15))
        tokens = [f"{'+'.join(str(char_ids[c]) for c in words[w])}:{len(specials) + w}" for w in picked]
        labels = [str(3 + w % tags) for w in picked]  # a tag the word decides: a learnable labelling
        lines.append(" ".join(tokens) + "\t" + " ".join(labels))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    Path(f"{path}.char_to_idx").write_text("\n".join(specials + list(letters)) + "\n")
    Path(f"{path}.word_to_idx").write_text("\n".join(specials + words) + "\n")
    Path(f"{path}.tag_to_idx").write_text("\n".join(specials[:3] + [f"T{i}" for i in range(tags)]) + "\n")


MAKERS: dict[str, Callable[[Path], None]] = {
    "cifar10_small": cifar10_small,
    "srcnn_train": srcnn_train,
    "srcnn_eval": srcnn_eval,
    "vdsr_patches": vdsr_patches,
    "fsrcnn_train": fsrcnn_train,
    "fsrcnn_eval": fsrcnn_eval,
    "gridworld_npz": gridworld_npz,
    "folder": folder,
    "hourly_series": hourly_series,
    "image_folder_64": image_folder_64,
    "labelled_jpgs": labelled_jpgs,
    "shakespeare_char": shakespeare_char,
    "image_classes": image_classes,
    "mnist": mnist,
    "fashion_mnist": fashion_mnist,
    "text": text,
    "enwik8": enwik8,
    "binarized_mnist": binarized_mnist,
    "ppi": ppi,
    "cifar10": cifar10,
    # full-batch scripts (batch 1024, drop_last) need a few thousand images for a step per epoch
    "cifar10_2k": lambda root: cifar10(root, per_batch=420),
    "token_shards": token_shards,
    "texture_digits": texture_digits,
    "cifar100": cifar100,
    "cora": cora,
    "paired_images": paired_images,
    "isic": isic,
    "digit_folders": digit_folders,
    "text_splits": text_splits,
    "face_folder": face_folder,
    "citation_graph": citation_graph,
    "image_splits": image_splits,
    "car_masks": car_masks,
    "tagged_sentences": tagged_sentences,
}


def make(spec: str, repo_root: Path) -> None:
    """Writes the data set `spec` names (KIND:RELATIVE_PATH) under `repo_root`."""
    kind, _, relative = spec.partition(":")
    if kind not in MAKERS or not relative:
        raise ValueError(f"unknown data spec {spec!r}: KIND:PATH with KIND one of {sorted(MAKERS)}")
    MAKERS[kind](repo_root / relative)
