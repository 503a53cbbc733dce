"""Engine behaviour: aliases, suppression, comment keeping, imports, errors."""

import pytest
from xlaport.kb import SourceError, fix_source, lint_source, select_rules


def codes(source):
    return [f.code for f in lint_source(source)]


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch.cuda.synchronize()\n",
        "import torch as T\nT.cuda.synchronize()\n",
        "from torch import cuda\ncuda.synchronize()\n",
        "from torch.cuda import synchronize as s\ns()\n",
        "import torch.cuda as tc\ntc.synchronize()\n",
    ],
)
def test_aliases_resolve_to_the_same_qualified_name(source):
    assert "XLA204" in codes(source)


def test_local_variable_named_cuda_is_not_torch_cuda():
    assert codes("cuda = object()\ncuda.synchronize()\n") == []


def test_suppression_comment():
    src = "import torch\ntorch.cuda.synchronize()  # xlaport: ignore[XLA204]\n"
    assert codes(src) == []
    assert "XLA204" in codes("import torch\ntorch.cuda.synchronize()  # xlaport: ignore[XLA999]\n")
    assert codes("import torch\ntorch.cuda.synchronize()  # xlaport: ignore\n") == []


def test_fix_keeps_comments_and_adds_imports():
    src = "import torch\n\n# timing\ntorch.cuda.synchronize()  # wait\nx = 1  # keep\n"
    out = fix_source(src).fixed
    assert "import torch_xla.core.xla_model as xm" in out
    assert "# timing" in out and "# wait" in out and "# keep" in out


def test_removed_statement_keeps_its_leading_comment():
    src = "import torch\n# tuned for V100\ntorch.backends.cudnn.benchmark = True\nrun()\n"
    out = fix_source(src).fixed
    assert "# tuned for V100\nrun()" in out
    assert "cudnn" not in out


def test_removing_the_only_statement_of_a_block_leaves_pass():
    src = "import torch\nif fast:\n    torch.backends.cudnn.benchmark = True\n"
    out = fix_source(src).fixed
    compile(out, "x", "exec")
    assert "pass" in out


def test_unparsable_source_raises_a_clear_error():
    with pytest.raises(SourceError, match="cannot parse"):
        lint_source("def f(:\n")


def test_select_by_category_and_prefix():
    assert {r.category for r in select_rules(["C2"])} == {"C2"}
    assert all(r.code.startswith("XLA2") for r in select_rules(["XLA2"]))
    with pytest.raises(KeyError):
        select_rules(["NOPE1"])


def test_lint_pauses_the_cycle_collector_and_restores_it():
    import gc

    from xlaport.kb.engine import without_cycle_collection

    assert gc.isenabled()
    with without_cycle_collection():
        assert not gc.isenabled()
        with without_cycle_collection():  # nested (or another thread's): the outer one restores it
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    lint_source("import torch\nx = torch.ones(2).cuda()\n")
    assert gc.isenabled()
    with pytest.raises(SourceError):
        lint_source("def f(:\n")
    assert gc.isenabled()
    gc.disable()
    try:
        lint_source("import torch\n")
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
