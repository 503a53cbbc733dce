"""Where models and datasets live (outside git) and how a trained model describes itself.

Every artifact directory holds an `xlaport.json` with at least `kind` ("dataset", "base" or "lora")
and `created` (UTC timestamp). The pipeline picks the configured model (`XLAPORT_MODEL`) or the
newest LoRA model under the models directory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from xlaport.files import atomic_write
from xlaport.paths import models_dir

META_FILE = "xlaport.json"
KINDS = ("dataset", "base", "lora")


def new_artifact_dir(kind: str, size: str, root: Path | None = None) -> Path:
    """A fresh, not yet existing directory named `<kind>-<size>-<timestamp>`."""
    root = root or models_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = root / f"{kind}-{size}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{kind}-{size}-{stamp}-{n}"
    return path


def write_meta(directory: Path, meta: dict) -> None:
    if meta.get("kind") not in KINDS:
        raise ValueError(f"artifact kind must be one of {KINDS}")
    meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **meta}
    atomic_write(directory / META_FILE, json.dumps(meta, indent=2, sort_keys=True) + "\n")


def read_meta(directory: Path) -> dict | None:
    """The artifact's description, or None when `directory` is not a complete xlaport artifact."""
    try:
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("kind") in KINDS else None


def newest(kind: str, root: Path | None = None) -> Path | None:
    """The most recently created complete artifact of `kind` under `root` (default: the models dir)."""
    root = root or models_dir()
    if not root.is_dir():
        return None
    found = []
    for child in root.iterdir():
        meta = read_meta(child) if child.is_dir() else None
        if meta and meta["kind"] == kind:
            found.append((str(meta.get("created", "")), child.name, child))
    return max(found)[2] if found else None
