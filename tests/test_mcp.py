"""The MCP agent tool, in process through the SDK's client: tools listed, typed, and calling the pipeline."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mcp
import pytest
from xlaport.kb.retrieval import FixIndex, cache_dir
from xlaport.serve.mcp import create_server
from xlaport.serve.pipeline import Pipeline

PROJECT = Path(__file__).resolve().parent / "fixtures" / "serve_project"
TOOLS = {"suggest_patch", "search_fixes", "check_xla", "explain_fix", "migrate_repo", "verify_migration"}


def call(server, name: str, arguments: dict):
    async def go():
        async with mcp.Client(server) as client:
            return await client.call_tool(name, arguments)

    return asyncio.run(go())


def test_tools_are_listed_with_typed_arguments():
    async def go():
        async with mcp.Client(create_server(Pipeline(), allow_execution=False)) as client:
            return await client.list_tools()

    tools = {t.name: t for t in asyncio.run(go()).tools}
    assert set(tools) == TOOLS
    suggest = tools["suggest_patch"].input_schema
    assert suggest["required"] == ["source"]
    assert suggest["properties"]["unsafe_fixes"]["type"] == "boolean"
    assert tools["search_fixes"].input_schema["properties"]["k"]["type"] == "integer"
    assert tools["suggest_patch"].output_schema is not None  # structured Patch
    assert all(t.description for t in tools.values())


def test_suggest_and_explain_call_the_pipeline():
    server = create_server(Pipeline(), allow_execution=False)
    result = call(
        server, "suggest_patch", {"source": "import torch\n\nx = torch.ones(2).cuda()\n", "path": "a.py", "k": 0}
    )
    assert not result.is_error
    patch = result.structured_content
    assert patch["changed"] and "torch_xla.device()" in patch["migrated"]
    assert patch["evidence"]["status"] == "unvalidated"
    explained = call(server, "explain_fix", {"code": "XLA204"})
    assert explained.structured_content["entry"]["code"] == "XLA204"


def test_bad_input_and_disabled_execution_are_clear_tool_errors():
    server = create_server(Pipeline(), allow_execution=False)
    unknown = call(server, "explain_fix", {"code": "XLA000"})
    assert unknown.is_error and "XLA000" in unknown.content[0].text
    broken = call(server, "suggest_patch", {"source": "def f(:\n", "k": 0})
    assert broken.is_error and "cannot parse" in broken.content[0].text
    check = call(server, "check_xla", {"source": "print(1)\n"})
    assert check.is_error and "does not run code" in check.content[0].text
    verify = call(server, "verify_migration", {"original_dir": ".", "migrated_dir": ".", "command": "python t.py"})
    assert verify.is_error and "does not run code" in verify.content[0].text
    missing = call(
        create_server(Pipeline()),
        "verify_migration",
        {"original_dir": "/nonexistent", "migrated_dir": ".", "command": "python t.py"},
    )
    assert missing.is_error and "not a directory" in missing.content[0].text


def test_migrate_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "traces.jsonl"))
    src = tmp_path / "project"
    shutil.copytree(PROJECT, src)
    server = create_server(Pipeline(), allow_execution=False)
    result = call(
        server, "migrate_repo", {"src": str(src), "dst": str(tmp_path / "out"), "validate_cmd": "python train.py"}
    )
    assert not result.is_error, result.content
    summary = result.structured_content
    assert summary["files_changed"] == 2 and Path(summary["reports"]["html"]).is_file()
    assert summary["validation"]["status"] == "unvalidated" and "not allowed" in summary["validation"]["reason"]
    assert json.loads((tmp_path / "out" / "xlaport-report.json").read_text())["run_id"]
    again = call(server, "migrate_repo", {"src": str(src), "dst": str(tmp_path / "out")})
    assert again.is_error and "not empty" in again.content[0].text


@pytest.mark.slow
def test_search_fixes_retrieves_from_the_index():
    server = create_server(Pipeline(index=FixIndex.load_or_build(directory=cache_dir())))
    result = call(
        server, "search_fixes", {"text": "ImportError: cannot import name 'GradScaler' from 'torch_xla.amp'", "k": 2}
    )
    hits = result.structured_content["result"]
    assert [h["code"] for h in hits][0] == "XLA105" and len(hits) == 2


@pytest.mark.slow
def test_verify_migration_grades_a_migrated_tree():
    programs = Path(__file__).resolve().parent / "programs" / "verify_classifier"
    arguments = {
        "original_dir": str(programs / "original"),
        "migrated_dir": str(programs / "migrated"),
        "command": "python train.py --steps 24",
    }
    result = call(create_server(Pipeline()), "verify_migration", arguments)
    assert not result.is_error, result.content
    outcome = result.structured_content
    assert outcome["status"] in {"pass", "inconclusive"} and outcome["level"] in {"L2", "L3", "L4"}, outcome["reasons"]
    assert outcome["report"]["check"]["level"] == "L2" and outcome["report"]["reference_run"]["returncode"] == 0


@pytest.mark.slow
def test_a_stdio_session_answers_before_the_pipeline_has_loaded(tmp_path):
    """`xlaport mcp` answers `initialize` without importing the pipeline first (libcst, the rules, a fix worker:
    10-13 s before, past some clients' start-up timeout); a tool called meanwhile waits for it and answers."""
    exe = Path(sys.executable).with_name("xlaport")
    env = {**os.environ, "XLAPORT_CACHE_DIR": str(cache_dir())}
    proc = subprocess.Popen([str(exe), "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)

    def call(message: dict) -> dict | None:
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline()) if "id" in message else None

    try:
        info = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}
        assert call({"id": 1, "method": "initialize", "params": info})["result"]["serverInfo"]["name"] == "xlaport"
        call({"method": "notifications/initialized"})
        found = call(
            {
                "id": 2,
                "method": "tools/call",
                "params": {"name": "search_fixes", "arguments": {"text": "x = x.cuda()", "k": 1}},
            }
        )
        assert "XLA201" in json.dumps(found["result"])
    finally:
        proc.stdin.close()
        proc.wait(60)
