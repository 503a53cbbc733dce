"""Issue 13: inputs and faults that used to crash, hang or lose data — each front (CLI, HTTP, MCP) holds."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import mcp
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner
from xlaport.kb import SourceError, lint_source
from xlaport.serve.http import create_app
from xlaport.serve.mcp import create_server
from xlaport.serve.pipeline import Pipeline

from xlaport.cli import app

CUDA_SOURCE = "import torch\n\nx = torch.zeros(2).cuda()\n"
AND_CHAIN = "y = " + " and ".join(["x"] * 10_000) + "\n"  # segfaulted libcst's native parser
OR_CHAIN = "y = " + " or ".join(["x"] * 10_000) + "\n"
PLUS_CHAIN = "x = " + "+".join(["1"] * 1_000) + "\n"  # RecursionError in libcst's visitors
STRING_CHAIN = "x = (" + " ".join(['"a"'] * 1_000) + ")\n"  # implicit concatenation nests like a chain


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a child process: a native crash shows as rc -11 / 139, not as a test crash."""
    env = {**os.environ, "USE_TORCH_XLA": "0"}
    return subprocess.run(
        [sys.executable, "-m", "xlaport", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def call_tool(server, name: str, arguments: dict):
    async def go():
        async with mcp.Client(server) as client:
            return await client.call_tool(name, arguments)

    return asyncio.run(go())


# --- 1, 2: pathological nesting is refused with a reason, never a crash ------------------------------------
@pytest.mark.parametrize("source", [AND_CHAIN, OR_CHAIN, PLUS_CHAIN, STRING_CHAIN], ids=["and", "or", "plus", "str"])
def test_pathological_nesting_is_a_source_error(source):
    with pytest.raises(SourceError, match="nested too deeply"):
        lint_source(source)


def test_parse_limits_are_configurable(monkeypatch):
    source = "x = " + "+".join(["1"] * 20) + "\n"
    assert lint_source(source) == []
    monkeypatch.setenv("XLAPORT_MAX_NESTING", "10")
    with pytest.raises(SourceError, match="over 10 levels"):
        lint_source(source)
    monkeypatch.delenv("XLAPORT_MAX_NESTING")
    monkeypatch.setenv("XLAPORT_MAX_NODES", "5")
    with pytest.raises(SourceError, match="too large"):
        lint_source(source)


def test_cli_lint_and_fix_report_the_bad_file_and_fix_the_others(tmp_path: Path):
    (tmp_path / "and.py").write_text(AND_CHAIN)
    (tmp_path / "plus.py").write_text(PLUS_CHAIN)
    (tmp_path / "good.py").write_text(CUDA_SOURCE)
    linted = cli("lint", str(tmp_path))
    assert linted.returncode == 1, linted.stderr[-2000:]
    assert "and.py: cannot parse: nested too deeply" in linted.stderr
    assert "Traceback" not in linted.stderr
    fixed = cli("fix", str(tmp_path))
    assert fixed.returncode == 1 and "Traceback" not in fixed.stderr, fixed.stderr[-2000:]
    assert "plus.py: cannot parse: nested too deeply" in fixed.stderr
    assert "torch_xla" in (tmp_path / "good.py").read_text()  # the good file was still fixed
    assert (tmp_path / "and.py").read_text() == AND_CHAIN


def test_migrate_in_parallel_reports_the_bad_file(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "and.py").write_text(AND_CHAIN)
    (src / "good.py").write_text(CUDA_SOURCE)
    (src / "other.py").write_text(CUDA_SOURCE)
    done = cli("migrate", str(src), "--out", str(tmp_path / "out"), "-j", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "and.py: cannot parse: nested too deeply" in done.stderr
    assert (tmp_path / "out" / "and.py").read_text() == AND_CHAIN
    assert "torch_xla" in (tmp_path / "out" / "good.py").read_text()


def test_http_suggest_refuses_deep_nesting_and_keeps_serving():
    with TestClient(create_app(Pipeline(), token=None, warm_up=False)) as c:
        for source in (AND_CHAIN, PLUS_CHAIN):
            refused = c.post("/v1/suggest", json={"source": source, "options": {"k": 0}})
            assert refused.status_code == 422 and "nested too deeply" in str(refused.json()["detail"])
        ok = c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": {"k": 0}})
        assert ok.status_code == 200 and ok.json()["changed"]


def test_mcp_suggest_refuses_deep_nesting_with_the_reason():
    server = create_server(Pipeline(), allow_execution=False)
    for source in (AND_CHAIN, PLUS_CHAIN):
        result = call_tool(server, "suggest_patch", {"source": source, "k": 0})
        assert result.is_error and "nested too deeply" in result.content[0].text
