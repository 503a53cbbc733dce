"""Planted fault: the script dies with an exception (no torch needed, so the check is quick)."""


def load_config(path):
    raise FileNotFoundError(f"config not found: {path}")


load_config("train.yaml")
