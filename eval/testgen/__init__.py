"""Generated differential unit tests: the ORIGINAL (CUDA) code on the CPU versus the MIGRATED code on XLA.

`generate_tests(original, migrated, out)` finds the functions and nn.Module classes that the migration
changed (or all public ones), chooses inputs for each (recorded from a real run with `record`, else
synthesized from signatures and first layers, then tried once on the original), and writes readable
pytest files to `out`. Each generated test calls `run_differential`, which runs each side in its own
child process (`xlaport.eval.testgen.worker`) and compares the results with dtype-aware tolerances.
`run_generated_tests(out)` runs those tests in a sandboxed pytest and counts the outcome.

User code runs only in sandboxed children, on copies of the trees (with links to the folders beside them,
so `../data` resolves), from the tree root as working directory, the script's folder first on sys.path and
the recorded command's arguments in sys.argv, with no network. A script run as `__main__` is recorded under
its module name, so its classes and functions replay by importing it in another process.

Targets that cannot be driven are listed with their reason, in the result, the README and the test file.

Files: `targets.py` what changed, `sources.py` the file pairs, `inputs.py` recorded or synthesized inputs,
`render.py` the test files, `generate.py` the entry point, `differential.py` what the generated tests call
(their imports from this package must keep working: generated files live in users' trees), `run.py`
running them, `results.py` the result types, `worker/` the child side, `cli.py` the `xlaport testgen` command.
"""

from .differential import (
    DEFAULT_SEED,
    TOLERANCES,
    Case,
    DifferentialResult,
    Inputs,
    Side,
    compare_values,
    device,
    randint,
    randn,
    recorded,
    run_cases,
    run_differential,
)
from .generate import generate_tests
from .inputs import copy_tree
from .render import render_test_file
from .results import GeneratedTest, TestFailure, TestgenError, TestgenResult, TestRunResult, Undrivable
from .run import run_generated_tests
from .sources import SourcePair, source_pairs
from .targets import Target, find_targets

__all__ = [
    "DEFAULT_SEED",
    "TOLERANCES",
    "Case",
    "DifferentialResult",
    "GeneratedTest",
    "Inputs",
    "Side",
    "SourcePair",
    "Target",
    "TestFailure",
    "TestRunResult",
    "TestgenError",
    "TestgenResult",
    "Undrivable",
    "compare_values",
    "copy_tree",
    "device",
    "find_targets",
    "generate_tests",
    "randint",
    "randn",
    "recorded",
    "render_test_file",
    "run_cases",
    "run_differential",
    "run_generated_tests",
    "source_pairs",
]
