"""Shared test setup: torch_xla runs on the CPU here (same lazy-tensor and compile path as a TPU)."""

import os
import tempfile

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Tests never read or write the user's models and traces (the kb index cache may be shared: it is
# keyed by the kb's content).
_isolated = tempfile.mkdtemp(prefix="xlaport-tests-")
os.environ["XLAPORT_MODELS_DIR"] = os.path.join(_isolated, "models")
os.environ["XLAPORT_TRACES"] = os.path.join(_isolated, "traces.jsonl")
