"""The target seam (#30) on every front: lint, fix, migrate and suggest on the command line, HTTP `/v1/suggest`, and
the MCP tools `suggest_patch` and `migrate_repo` all take the target, and the same CUDA line becomes the target's
device (torch_xla: `torch_xla.device()`; torch_tpu: the native `tpu` device). Default: torch_xla."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import mcp
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner
from xlaport.kb.finding import Edit
from xlaport.kb.text_edits import apply_edits
from xlaport.serve.http import create_app
from xlaport.serve.mcp import create_server
from xlaport.serve.pipeline import Pipeline

from xlaport.cli import app

SOURCE = "import torch\n\nx = torch.zeros(3).cuda()\n"
EXPECTED = {"torch_xla": "x = torch.zeros(3).to(torch_xla.device())", "torch_tpu": 'x = torch.zeros(3).to("tpu")'}


def target_args(target: str | None) -> list[str]:
    return [] if target is None else ["--target", target]


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code in (0, 1), result.output
    return result.stdout


def lint(tmp_path: Path, target: str | None) -> str:
    """The source with the edits of lint's JSON findings applied (what an editor does with them)."""
    (tmp_path / "train.py").write_text(SOURCE)
    found = json.loads(cli("lint", "--format", "json", str(tmp_path / "train.py"), *target_args(target)))["findings"]
    return apply_edits(SOURCE, [Edit(**edit) for f in found for edit in f["edits"]])


def fix(tmp_path: Path, target: str | None) -> str:
    (tmp_path / "train.py").write_text(SOURCE)
    return cli("fix", "--diff", str(tmp_path / "train.py"), *target_args(target))


def migrate(tmp_path: Path, target: str | None) -> str:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(SOURCE)
    cli("migrate", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "-j", "1", *target_args(target))
    return (tmp_path / "out" / "train.py").read_text()


def suggest(tmp_path: Path, target: str | None) -> str:
    (tmp_path / "train.py").write_text(SOURCE)
    return json.loads(cli("suggest", str(tmp_path / "train.py"), "--format", "json", *target_args(target)))["migrated"]


def http(tmp_path: Path, target: str | None) -> str:
    options = {"k": 0} | ({} if target is None else {"target": target})
    with TestClient(create_app(Pipeline(), token=None, warm_up=False)) as client:
        response = client.post("/v1/suggest", json={"source": SOURCE, "path": "train.py", "options": options})
    assert response.status_code == 200, response.text
    return response.json()["migrated"]


def call_mcp(server, name: str, arguments: dict):
    async def go():
        async with mcp.Client(server) as client:
            return await client.call_tool(name, arguments)

    result = asyncio.run(go())
    assert not result.is_error, result.content
    return result.structured_content


def mcp_suggest(tmp_path: Path, target: str | None) -> str:
    arguments = {"source": SOURCE, "path": "train.py", "k": 0} | ({} if target is None else {"target": target})
    return call_mcp(create_server(Pipeline(), allow_execution=False), "suggest_patch", arguments)["migrated"]


def mcp_migrate(tmp_path: Path, target: str | None) -> str:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(SOURCE)
    arguments = {"src": str(tmp_path / "src"), "dst": str(tmp_path / "out")}
    server = create_server(Pipeline(), allow_execution=False, root=tmp_path)
    call_mcp(server, "migrate_repo", arguments | ({} if target is None else {"target": target}))
    return (tmp_path / "out" / "train.py").read_text()


FRONTS: dict[str, Callable[[Path, str | None], str]] = {
    "lint": lint,
    "fix": fix,
    "migrate": migrate,
    "suggest": suggest,
    "http": http,
    "mcp-suggest_patch": mcp_suggest,
    "mcp-migrate_repo": mcp_migrate,
}


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("target", ["torch_tpu", "torch_xla", None])
def test_every_front_takes_the_target(front: str, target: str | None, tmp_path: Path):
    text = FRONTS[front](tmp_path, target)
    assert EXPECTED[target or "torch_xla"] in text, text
    if target == "torch_tpu":
        assert "torch_xla" not in text
