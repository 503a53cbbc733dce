"""At one revision (installed editable from /tmp/audit-rev): the fix snapshot's per-file hashes for examples/ (HEAD's
copy) and the 7 corpus trees, and a plain `xlaport migrate` of each tree (hashes of every written file but the
reports, and the report's per-file record). Writes JSON to argv[1]."""

import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REV = Path("/tmp/audit-rev")
EXAMPLES = Path("/tmp/audit29/examples")
CORPUS = Path("/tmp/audit29/corpus")
spec = importlib.util.spec_from_file_location("fix_snapshot", REV / "tests/kb/test_fix_snapshot.py")
snap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(snap)
snap._tree_dir = lambda name: EXAMPLES if name == "examples" else CORPUS / name
out = {"fix": {}, "migrate": {}}
for name in ["examples", *snap.TREES]:
    out["fix"][name] = snap.fixed_tree(name)
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp, "out")
        run = subprocess.run(
            [str(Path(sys.executable).parent / "xlaport"), "migrate", str(snap._tree_dir(name)), "--out", str(dst)],
            capture_output=True,
            text=True,
        )
        files = {}
        for p in sorted(dst.rglob("*")):
            if p.is_file() and not p.name.startswith("xlaport-"):
                files[str(p.relative_to(dst))] = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
        report = json.loads((dst / "xlaport-report.json").read_text()) if (dst / "xlaport-report.json").exists() else {}
        summary = run.stdout.split("\n  validation:")[0]
        out["migrate"][name] = {
            "exit": run.returncode,
            "files": files,
            "summary": summary,
            "report_keys": sorted(report),
        }
    print(
        name,
        len(out["fix"][name]),
        "fixed,",
        len(out["migrate"][name]["files"]),
        "written, exit",
        out["migrate"][name]["exit"],
        flush=True,
    )
Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True))
