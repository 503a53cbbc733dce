"""The service's fix workers (serve/isolated.py): warm processes reused across requests, killed and replaced
on a timeout, a death or a memory limit, answering exactly what fix_source answers in-process."""

from __future__ import annotations

import os
import signal

import pytest
from xlaport.kb import SourceError, all_rules, fix_source
from xlaport.serve.isolated import AnalysisTimeout, FixWorkers

pytestmark = pytest.mark.slow  # child processes

CUDA_SOURCE = "import torch\n\nmodel = torch.nn.Linear(2, 2).cuda()\nx = torch.zeros(2, device='cuda')\n"
HEAVY = "import torch\n" + "\n".join(f"x{i} = torch.zeros({i}).cuda()" for i in range(3000)) + "\n"  # minutes


@pytest.fixture
def workers():
    pool = FixWorkers(max_idle=1)
    yield pool
    pool.close()


def _pid(pool: FixWorkers) -> int:
    (worker,) = pool._idle
    return worker.process.pid


def test_a_worker_is_reused_and_answers_like_fix_source(workers):
    rules = all_rules()
    first = workers.fix(CUDA_SOURCE, "a.py", rules, unsafe=False, timeout_s=60)
    pid = _pid(workers)
    second = workers.fix(CUDA_SOURCE + "y = 1\n", "a.py", rules, unsafe=False, timeout_s=60)
    assert _pid(workers) == pid  # the same process served both
    expected = fix_source(CUDA_SOURCE, "a.py", rules)
    assert first.fixed == expected.fixed and "torch_xla" in first.fixed
    assert [f.code for f in first.applied] == [f.code for f in expected.applied]
    assert second.fixed.endswith("y = 1\n")


def test_a_timed_out_worker_is_killed_and_replaced(workers):
    workers.warm(1)
    old = workers._idle[0].process
    with pytest.raises(AnalysisTimeout):
        workers.fix(HEAVY, "heavy.py", all_rules(), unsafe=False, timeout_s=1)
    assert not old.is_alive()  # its work was stopped
    assert _pid(workers) != old.pid  # a warm replacement waits
    assert "torch_xla" in workers.fix(CUDA_SOURCE, "a.py", all_rules(), unsafe=False, timeout_s=60).fixed


def test_a_dead_worker_is_replaced_before_the_next_request(workers):
    workers.warm(1)
    (worker,) = workers._idle
    os.kill(worker.process.pid, signal.SIGKILL)  # e.g. the kernel's OOM killer, between two requests
    worker.process.join(10)
    assert "torch_xla" in workers.fix(CUDA_SOURCE, "a.py", all_rules(), unsafe=False, timeout_s=60).fixed


def test_a_file_over_the_memory_limit_is_refused_with_the_reason(workers, monkeypatch):
    monkeypatch.setenv("XLAPORT_WORKER_MEMORY_MB", "150")
    big = "import torch\n" + "".join(f"x{i} = torch.zeros({i}, device='cuda') + {i}\n" for i in range(5_000))
    with pytest.raises(SourceError, match="memory limit"):
        workers.fix(big, "big.py", all_rules(), unsafe=False, timeout_s=120)
    monkeypatch.delenv("XLAPORT_WORKER_MEMORY_MB")
    assert "torch_xla" in workers.fix(CUDA_SOURCE, "a.py", all_rules(), unsafe=False, timeout_s=60).fixed


def test_unparsable_text_is_a_source_error_and_the_worker_stays(workers):
    workers.warm(1)
    pid = _pid(workers)
    with pytest.raises(SourceError, match="cannot parse"):
        workers.fix("def (:\n", "bad.py", all_rules(), unsafe=False, timeout_s=60)
    assert _pid(workers) == pid


def test_a_long_module_is_fixed_or_refused_with_a_reason_that_names_the_recursion_limit(workers):
    # libcst's import-adding rewrite recurses once per top-level statement after a docstring: 1,200 of them and
    # a fix that adds `import torch_xla` hit Python's limit. Fixed, or refused with that reason (never a 500)
    source = (
        '"""doc."""\nimport torch\n' + "".join(f"a{i} = {i}\n" for i in range(1_200)) + "x = torch.zeros(1).cuda()\n"
    )
    try:
        result = workers.fix(source, "long.py", all_rules(), unsafe=False, timeout_s=120)
    except SourceError as exc:
        assert "recursion limit was hit" in str(exc)
    else:
        assert "torch_xla" in result.fixed
