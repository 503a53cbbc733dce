"""The command line of the worker (what it is: see __init__.py):

python -m xlaport.eval.testgen.worker run JOB.json      one side of the differential tests of one file
python -m xlaport.eval.testgen.worker probe JOB.json    synthesize and trial inputs for targets (ORIGINAL)
python -m xlaport.eval.testgen.worker record JOB.json -- SCRIPT ARGS... | -m MODULE ARGS...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .probe import probe
from .record import record
from .side import block_network, run_side


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("run", "probe", "record"):
        print(__doc__, file=sys.stderr)
        return 2
    command, job_path = argv[0], Path(argv[1])
    job = json.loads(job_path.read_text())
    if command != "run" or job["side"] == "original":
        os.environ.setdefault("USE_TORCH_XLA", "0")  # accelerate & co. would import torch_xla
    if command == "record":
        rest = argv[2:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        return record(job, rest)
    block_network()
    if command == "probe":
        Path(job["result"]).write_text(json.dumps(probe(job), indent=2))
        return 0
    import torch

    torch.save(run_side(job), job["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
