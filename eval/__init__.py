"""Validation: the XLA execution check, generated differential unit tests, the L0–L4 assessment, benchmarks."""
