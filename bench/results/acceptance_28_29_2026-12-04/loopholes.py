"""Each loophole tree of issue #29 item 4 (and a planted kb circle) through the checker before the fix
(tests/layers.py at 51638ad^) and now (the worktree's): what each returns."""

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path("/work/wt-audit")
PYPROJECT = (REPO / "pyproject.toml").read_text()
FOLDERS = ["xlaport", "kb", "model", "serve", "training", "eval"]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


old = load("/tmp/audit_layers_old.py", "layers_old")
new = load(REPO / "tests" / "layers.py", "layers_new")


def tree(files, pyproject=PYPROJECT, folders=FOLDERS):
    root = Path(tempfile.mkdtemp(prefix="audit29-"))
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject)
    for f in folders:
        (root / f).mkdir(parents=True, exist_ok=True)
        (root / f / "__init__.py").write_text("")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


moved = PYPROJECT.replace('"xlaport.kb" = "kb"', '"xlaport.kb" = "src/kb"')
CASES = {
    "empty tree (no pyproject, no module)": tree({}, pyproject=None, folders=[]),
    "hard-coded folders: kb kept in src/kb, importing serve": tree(
        {"src/kb/engine.py": "from xlaport.serve import pipeline\n"},
        pyproject=moved,
        folders=[f for f in FOLDERS if f != "kb"],
    ),
    "unknown xlaport.* module counted as core (kb imports xlaport.serving)": tree(
        {"kb/engine.py": "import xlaport.serving\n"}
    ),
    "importlib.import_module('xlaport.serve') in kb": tree(
        {"kb/engine.py": 'import importlib\nSERVE = importlib.import_module("xlaport.serve")\n'}
    ),
    "__import__('xlaport.serve') in kb": tree({"kb/engine.py": 'SERVE = __import__("xlaport.serve")\n'}),
    "kb circle: analysis/module <-> analysis/project": tree(
        {
            "kb/analysis/__init__.py": "",
            "kb/analysis/module.py": "from .project import P\n",
            "kb/analysis/project.py": "from .module import walk\nP = 1\n",
        }
    ),
}
# the "synthetic tree with four violations": all four loopholes at once
CASES["the four at once"] = tree(
    {
        "src/kb/a.py": "import xlaport.serving\n",
        "src/kb/b.py": 'X = __import__("xlaport.serve")\n',
        "src/kb/c.py": 'import importlib\nY = importlib.import_module("xlaport.serve")\n',
    },
    pyproject=moved,
    folders=[f for f in FOLDERS if f != "kb"],
)

for name, root in CASES.items():
    before = old.check_tree(root)
    after = new.check_tree(root)
    print(f"## {name}\n  before (51638ad^): {len(before)} error(s) {[v.why[:90] for v in before][:2]}")
    print(f"  now:               {len(after)} error(s) {[(v.file, v.why[:110]) for v in after][:3]}")
    shutil.rmtree(root)
