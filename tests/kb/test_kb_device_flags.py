"""Device flags across the modules of a tree (issue 24, item 4): `use_cuda = args.cuda and torch.cuda.is_available()`
in one module, and the `.cuda()` it chooses in another (a helper's parameter, a function given the flag). The guard
flips only when the tree shows the flag choosing the device and guarding no CUDA-only call anywhere."""

from __future__ import annotations

from pathlib import Path

from xlaport.kb import fix_source
from xlaport.kb.batch import fix_file, summarize_project

HELPER = """import torch


def to_device(tensor, uses_cuda):
    return tensor.cuda() if uses_cuda else tensor
"""

TRAINER = """import torch

from helpers import to_device


class Trainer:
    def __init__(self, args):
        self.use_cuda = args.cuda and torch.cuda.is_available()
        self.net = to_device(torch.nn.Linear(2, 2), self.use_cuda)
"""


def migrate(root: Path, files: dict[str, str]) -> dict[str, str]:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    rels = sorted(Path(name) for name in files)
    project = summarize_project(root, rels)
    return {str(rel): fix_file(root / rel, display=str(rel), project=project).fixed for rel in rels}


def test_a_flag_given_to_another_modules_device_helper_flips(tmp_path):
    fixed = migrate(tmp_path, {"helpers.py": HELPER, "trainer.py": TRAINER})
    assert "self.use_cuda = args.cuda\n" in fixed["trainer.py"]
    assert "tensor.to(torch_xla.device()) if uses_cuda else tensor" in fixed["helpers.py"]


def test_the_flag_set_in_one_module_passed_in_a_second_and_tested_in_a_third(tmp_path):
    options = "import torch\n\n\ndef get_args(args):\n    args.cuda = not args.no_cuda and torch.cuda.is_available()\n"
    data = "def load(path, cuda):\n    x = read(path)\n    if cuda:\n        x = x.cuda()\n    return x\n"
    main = "from options import get_args\nfrom data import load\n\nargs = get_args(parse())\nx = load('a', args.cuda)\n"
    fixed = migrate(tmp_path, {"options.py": options, "data.py": data, "main.py": main})
    assert "args.cuda = not args.no_cuda\n" in fixed["options.py"]


def test_no_flip_when_the_flag_guards_a_cuda_only_call_anywhere_in_the_tree(tmp_path):
    timing = "import torch\n\n\ndef timed(fn, use_cuda):\n    if use_cuda:\n        torch.cuda.synchronize()\n    return fn()\n"
    trainer = TRAINER + "        timed(self.net, self.use_cuda)\n"
    trainer = trainer.replace(
        "from helpers import to_device", "from helpers import to_device\nfrom timing import timed"
    )
    fixed = migrate(tmp_path, {"helpers.py": HELPER, "timing.py": timing, "trainer.py": trainer})
    assert "args.cuda and torch.cuda.is_available()" in fixed["trainer.py"]


def test_a_module_alone_keeps_its_guard(tmp_path):
    assert "args.cuda and torch.cuda.is_available()" in fix_source(TRAINER).fixed


def test_no_flip_when_the_flag_moves_a_sparse_tensor_that_no_safe_fix_moves(tmp_path):
    """`adj.cuda()` of a sparse adjacency stays as it is by default (XLA520's densifying is unsafe): flipping the
    flag would make it run on a host without CUDA (a graph trainer crashed where it had run on the CPU)."""
    data = (
        "import torch\n\n\ndef to_sparse(m):\n    return torch.sparse.FloatTensor(m.i, m.v, m.shape)\n\n\n"
        "def load(m, cuda):\n    adj = to_sparse(m).float()\n    if cuda:\n        adj = adj.cuda()\n    return adj\n"
    )
    options = "import torch\n\n\ndef get_args(args):\n    args.cuda = not args.no_cuda and torch.cuda.is_available()\n"
    main = "from options import get_args\nfrom data import load\n\nargs = get_args(parse())\nadj = load(m, args.cuda)\n"
    fixed = migrate(tmp_path, {"options.py": options, "data.py": data, "main.py": main})
    assert "not args.no_cuda and torch.cuda.is_available()" in fixed["options.py"]
    assert "adj = adj.cuda()" in fixed["data.py"]  # never `.to(torch_xla.device())` of a sparse tensor


def test_a_name_sparse_after_one_of_its_assignments_blocks_the_flip(tmp_path):
    data = (
        "import torch\n\n\ndef to_sparse(m):\n    return torch.sparse.FloatTensor(m.i, m.v, m.shape)\n\n\n"
        "def load(m, cuda):\n    adj = graph_matrix(m)\n    adj, feats = prepare(adj)\n    adj = to_sparse(adj).float()\n"
        "    if cuda:\n        adj = adj.cuda()\n    return adj, feats\n"
    )
    options = "import torch\n\n\ndef get_args(args):\n    args.cuda = not args.no_cuda and torch.cuda.is_available()\n"
    main = "from options import get_args\nfrom data import load\n\nargs = get_args(parse())\nadj = load(m, args.cuda)\n"
    fixed = migrate(tmp_path, {"options.py": options, "data.py": data, "main.py": main})
    assert "not args.no_cuda and torch.cuda.is_available()" in fixed["options.py"]
