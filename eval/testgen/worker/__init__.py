"""The child-process side of `xlaport testgen`: runs user code, so xlaport's own process never imports it. Started as
`python -m xlaport.eval.testgen.worker run|probe|record JOB.json` (see __main__.py).

The ORIGINAL side runs with the CUDA→CPU shim and never imports torch_xla; the MIGRATED side runs on
`torch_xla.device()`. Inputs are built on the CPU from a seed (or loaded from a recording) and only then
moved to the side's device, so both sides see the same numbers.

Files: `values.py` builds inputs and flattens outputs, `side.py` runs one side of a test, `probe.py`
synthesizes inputs, `record.py` records them from a real run, `__main__.py` the command line.
"""
