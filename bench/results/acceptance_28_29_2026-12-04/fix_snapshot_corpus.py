"""tests/kb/test_fix_snapshot.py's comparison, on the 7 corpus trees laid out (at the snapshot's commits) under
/tmp/audit29/corpus instead of /work/corpus, which this machine lacks."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("fix_snapshot", "/work/wt-audit/tests/kb/test_fix_snapshot.py")
snap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(snap)
snap.CORPUS = Path("/tmp/audit29/corpus")
expected_all = snap._snapshot()
for name in snap.TREES:
    expected = expected_all[name]
    assert snap._commit(name) == expected["commit"], name
    got = snap.fixed_tree(name)
    changed = {rel: (expected["files"].get(rel), got.get(rel)) for rel in {*got, *expected["files"]}}
    changed = {rel: pair for rel, pair in changed.items() if pair[0] != pair[1]}
    print(f"{name}: {len(got)} files, {len(changed)} changed", flush=True)
    for rel, (was, now) in sorted(changed.items()):
        print(f"   {rel}\n     snapshot {was}\n     now      {now}")
