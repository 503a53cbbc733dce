"""`migrate` pays for what is asked (issue 28, item 4): without --related, --validate or --verify it loads no
search model, no torch, no plotting and no evaluation code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parent.parent / "examples" / "amp_classifier" / "train.py"
HEAVY = ("torch", "torch_xla", "faiss", "sentence_transformers", "transformers", "matplotlib", "xlaport.eval")

PROBE = """
import json, sys
from pathlib import Path
from xlaport.serve.cli import migrate
try:
    migrate(Path(sys.argv[1]), out=Path(sys.argv[2]))
except SystemExit:
    pass
except BaseException as exc:  # typer.Exit
    if type(exc).__name__ != "Exit":
        raise
heavy = sorted({m for m in sys.modules for h in json.loads(sys.argv[3]) if m == h or m.startswith(h + ".")})
print(json.dumps(heavy))
"""


def test_a_plain_migrate_imports_nothing_heavy_and_says_related_fixes_were_not_searched(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(EXAMPLE.read_text())
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(src), str(tmp_path / "out"), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    report = json.loads((tmp_path / "out" / "xlaport-report.json").read_text())
    assert any("related kb fixes not searched" in note for note in report["notes"])
    assert report["files"][0]["manual"] and all(not m["retrieved"] for m in report["files"][0]["manual"])
