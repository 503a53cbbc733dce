"""Every place xlaport keeps things outside the user's tree: the cache root, models, traces.

One function per location, each with its environment variable, so that the kb index, the trained
models and the migration traces cannot drift onto different roots.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$XLAPORT_CACHE_DIR`, else `$XDG_CACHE_HOME/xlaport`, else `~/.cache/xlaport` (kb index, models, traces)."""
    configured = os.environ.get("XLAPORT_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "xlaport"


def models_dir() -> Path:
    """`$XLAPORT_MODELS_DIR`, else `<cache root>/models`."""
    configured = os.environ.get("XLAPORT_MODELS_DIR")
    return Path(configured).expanduser() if configured else cache_root() / "models"


def traces_path() -> Path:
    """Where `xlaport migrate --keep-trace` appends its traces and training reads them: `$XLAPORT_TRACES`,
    else `<cache root>/traces.jsonl`. Traces hold the user's source code, so nothing is written without asking."""
    return Path(os.environ.get("XLAPORT_TRACES") or cache_root() / "traces.jsonl").expanduser()
