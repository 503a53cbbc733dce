"""bench/perf.py measures a command's own peak memory, not the bench's: a child spawned straight from a large
process reports that process's peak as its own (Linux keeps the high-water mark across exec)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def perf():
    sys.path.insert(0, str(BENCH))  # perf.py imports bench/serve.py as `serve`
    saved = sys.modules.pop("serve", None)
    try:
        spec = importlib.util.spec_from_file_location("perf_bench", BENCH / "perf.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))
        sys.modules.pop("serve", None)
        if saved is not None:
            sys.modules["serve"] = saved


def test_a_command_run_from_a_large_bench_reports_its_own_peak_memory(perf):
    held = bytearray(300 * 2**20)  # the bench holding 300 MB, as after its service part
    held[:: 2**12] = b"\1" * len(held[:: 2**12])  # touched: resident
    small = perf.timed_command([sys.executable, "-c", "pass"])
    grows = perf.timed_command([sys.executable, "-c", "b = bytearray(200 * 2**20); b[::4096] = b'1' * len(b[::4096])"])
    assert small["peak_rss_mb"] < 60, small
    assert 200 <= grows["peak_rss_mb"] < 300, grows
    assert small["exit"] == 0 and small["seconds"] > 0 and small["cpu_seconds"] >= 0
    del held


def test_the_command_s_exit_code_and_output_come_back(perf):
    found = perf.timed_command([sys.executable, "-c", "print('out'); raise SystemExit(1)"])
    assert found["exit"] == 1 and found["stdout"] == "out\n"
