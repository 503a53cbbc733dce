"""A lint's or fix's analysis is freed by reference counting, not left to the cyclic garbage collector: the fix
worker (serve/isolated.py) freezes what a request leaves alive, and a cycle in there would never be collected."""

import gc
from pathlib import Path

from xlaport.kb import fix_source, lint_source
from xlaport.kb.analysis.module import ModuleAnalysis
from xlaport.kb.analysis.names import ImportNames
from xlaport.kb.analysis.positions import Positions

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "amp_classifier" / "train.py"


def test_no_analysis_is_left_in_a_reference_cycle():
    source = EXAMPLE.read_text()
    assert lint_source(source, "train.py")  # findings: positions and the alias table were built
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept in gc.garbage to look at
    try:
        lint_source(source + "# again\n", "train.py")
        fix_source(source + "# fixed\n", "train.py")
        gc.collect()
        cyclic = {type(o).__name__ for o in gc.garbage if isinstance(o, (ModuleAnalysis, ImportNames, Positions))}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    assert not cyclic
