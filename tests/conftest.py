"""Shared test setup: torch_xla runs on the CPU here (same lazy-tensor and compile path as a TPU)."""

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
