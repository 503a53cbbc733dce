"""The MCP agent tool, in process through the SDK's client: tools listed, typed, and calling the pipeline."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import mcp
import pytest
from live_server import running
from xlaport.kb.retrieval import FixIndex, cache_dir
from xlaport.serve.mcp import create_server
from xlaport.serve.pipeline import Pipeline

PROJECT = Path(__file__).resolve().parent / "fixtures" / "serve_project"
TOOLS = {
    "suggest_patch",
    "search_fixes",
    "check_xla",
    "explain_fix",
    "migrate_repo",
    "verify_migration",
    "optimize_migration",
}


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
    assert "required" not in suggest  # the text, or project_root and path to read it there
    assert suggest["properties"]["source"]["description"]
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


def test_bad_input_and_disabled_execution_are_clear_tool_errors(tmp_path):
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
        create_server(Pipeline(), root=tmp_path),
        "verify_migration",
        {"original_dir": "nonexistent", "migrated_dir": ".", "command": "python t.py"},
    )
    assert missing.is_error and "not a directory" in missing.content[0].text


def test_migrate_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "traces.jsonl"))
    src = tmp_path / "project"
    shutil.copytree(PROJECT, src)
    server = create_server(Pipeline(), allow_execution=False, root=tmp_path)
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


def test_long_calls_beyond_the_servers_limit_are_refused_as_busy(tmp_path):
    """The holders of an HTTP server's token are one client: without a bound they could start any number of
    sandboxed runs at once. With max_runs 1, a second check while one runs is refused (busy), then accepted."""
    server = create_server(Pipeline(), allow_execution=True, root=tmp_path, max_runs=1)
    slow = {"source": "import time\ntime.sleep(8)\n", "timeout_s": 60}
    quick = {"source": "print('quick')\n", "timeout_s": 60}

    async def go():
        async with mcp.Client(server) as client:
            first = asyncio.create_task(client.call_tool("check_xla", slow))
            await asyncio.sleep(3)  # the first call holds the only run
            second = await client.call_tool("check_xla", quick)
            await first
            third = await client.call_tool("check_xla", quick)
            return first.result(), second, third

    first, second, third = asyncio.run(go())
    assert not first.is_error, first.content
    assert second.is_error, second.content
    assert "busy" in second.content[0].text, second.content
    assert not third.is_error, third.content


def test_migrate_repo_reads_no_configuration_above_the_servers_root(tmp_path, monkeypatch):
    """A pyproject.toml above the root is not the caller's to read, nor to change what the migration does; one
    inside the root is the project's own and still counts."""
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "traces.jsonl"))
    root = tmp_path / "served"
    shutil.copytree(PROJECT, root / "project")
    excluding = '[tool.xlaport]\nexclude = ["*.py"]\n'
    (tmp_path / "pyproject.toml").write_text(excluding)
    server = create_server(Pipeline(), allow_execution=False, root=root)
    result = call(server, "migrate_repo", {"src": "project", "dst": "out"})
    assert not result.is_error, result.content
    assert result.structured_content["files_changed"] == 2
    (root / "pyproject.toml").write_text(excluding)
    inside = call(server, "migrate_repo", {"src": "project", "dst": "out2"})
    assert not inside.is_error, inside.content
    assert inside.structured_content["files_changed"] == 0


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
    result = call(create_server(Pipeline(), root=programs), "verify_migration", arguments)
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


# --- issue 25 N1: an authenticated MCP server over HTTP, writes and runs off unless enabled, paths confined -------
TOKEN = "mcp-s3cret"


def call_http(url: str, name: str, arguments: dict, token: str | None):
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def go():
        transport = streamable_http_client(f"{url}/mcp", http_client=create_mcp_http_client(headers=headers))
        async with mcp.Client(transport) as client:
            return await client.call_tool(name, arguments)

    return asyncio.run(go())


def evil_and_victim(base: Path) -> tuple[Path, Path]:
    """The issue's repro: a tree that plants a key and replaces a config, and a root-only folder it aims at."""
    evil = base / "allowed" / "evil"
    evil.mkdir(parents=True)
    (evil / "authorized_keys").write_text("ssh-ed25519 AAAA attacker\n")
    (evil / "config.txt").write_text("owned\n")
    victim = base / "victim"
    victim.mkdir()
    (victim / "config.txt").write_text("original\n")
    victim.chmod(0o700)
    return evil, victim


def untouched(victim: Path) -> bool:
    return (
        sorted(p.name for p in victim.iterdir()) == ["config.txt"]
        and (victim / "config.txt").read_text() == "original\n"
    )


def test_mcp_over_http_needs_the_token(tmp_path):
    from xlaport.serve.mcp import http_app

    server = create_server(Pipeline(), allow_execution=False, allow_writes=False, root=tmp_path)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    with running(http_app(server, TOKEN)) as url:
        for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": TOKEN}):
            refused = httpx.post(f"{url}/mcp", json=initialize, headers=headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer", headers
        with pytest.raises(Exception):  # noqa: B017, PT011  (the SDK wraps the 401 in its own error types)
            call_http(url, "explain_fix", {"code": "XLA201"}, "wrong-token")
        ok = call_http(url, "explain_fix", {"code": "XLA201"}, TOKEN)
        assert not ok.is_error and ok.structured_content["entry"]["code"] == "XLA201"


def test_mcp_over_http_refuses_to_start_without_a_token(monkeypatch):
    from xlaport.serve.mcp import StartRefused, run_server

    monkeypatch.delenv("XLAPORT_TOKEN", raising=False)
    with pytest.raises(StartRefused, match="XLAPORT_TOKEN"):
        run_server("http", port=0)
    with pytest.raises(StartRefused, match="cannot be combined"):
        run_server("http", port=0, allow_writes=True, unauthenticated_read_only=True)


def test_the_repro_migrate_repo_into_a_folder_outside_the_root_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "traces.jsonl"))
    evil, victim = evil_and_victim(tmp_path)
    server = create_server(Pipeline(), allow_execution=False, allow_writes=True, root=tmp_path / "allowed")
    result = call(server, "migrate_repo", {"src": str(evil), "dst": str(victim), "force": True})
    assert result.is_error and "outside the folder" in result.content[0].text
    assert untouched(victim)
    # a link inside the root that points at the victim is resolved before the check
    (tmp_path / "allowed" / "door").symlink_to(victim)
    through_link = call(server, "migrate_repo", {"src": str(evil), "dst": "door", "force": True})
    assert through_link.is_error and "outside the folder" in through_link.content[0].text
    assert untouched(victim)
    # reading outside the root is refused too: a tree the server can read is not one the caller may copy
    outside = call(server, "migrate_repo", {"src": str(victim), "dst": "copy"})
    assert outside.is_error and "outside the folder" in outside.content[0].text
    assert not (tmp_path / "allowed" / "copy").exists()


def test_force_never_writes_through_a_link_out_of_the_root(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "traces.jsonl"))
    evil, victim = evil_and_victim(tmp_path)
    dst = tmp_path / "allowed" / "out"
    dst.mkdir()
    (dst / "config.txt").symlink_to(victim / "config.txt")  # planted in a folder the caller may use
    (dst / "authorized_keys").symlink_to(victim / "authorized_keys")
    server = create_server(Pipeline(), allow_execution=False, allow_writes=True, root=tmp_path / "allowed")
    result = call(server, "migrate_repo", {"src": str(evil), "dst": str(dst), "force": True})
    assert result.is_error and "outside the allowed folder" in result.content[0].text
    assert untouched(victim)


def test_in_place_never_writes_outside_the_root(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "traces.jsonl"))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "train.py").write_text("import torch\n\nx = torch.zeros(2).cuda()\n")
    server = create_server(Pipeline(), allow_execution=False, allow_writes=True, root=tmp_path / "allowed")
    (tmp_path / "allowed").mkdir()
    result = call(server, "migrate_repo", {"src": str(victim), "in_place": True, "force": True})
    assert result.is_error and "outside the folder" in result.content[0].text
    assert "cuda()" in (victim / "train.py").read_text() and sorted(p.name for p in victim.iterdir()) == ["train.py"]


def test_writing_and_running_tools_are_off_unless_enabled(tmp_path):
    evil, victim = evil_and_victim(tmp_path)
    server = create_server(Pipeline(), allow_execution=False, allow_writes=False, root=tmp_path / "allowed")
    refused = call(server, "migrate_repo", {"src": str(evil), "dst": "out"})
    assert refused.is_error and "does not write files" in refused.content[0].text
    assert not (tmp_path / "allowed" / "out").exists()
    script = tmp_path / "allowed" / "t.py"
    script.write_text("print(1)\n")
    for name, arguments in (
        ("check_xla", {"script_path": str(script)}),
        ("verify_migration", {"original_dir": str(evil), "migrated_dir": str(evil), "command": "python t.py"}),
    ):
        result = call(server, name, arguments)
        assert result.is_error and "does not run code" in result.content[0].text


def test_paths_of_running_tools_are_confined_to_the_root(tmp_path):
    secret = tmp_path / "secret.py"
    secret.write_text("print('secret')\n")
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "alias.py").symlink_to(secret)
    server = create_server(Pipeline(), allow_execution=True, allow_writes=False, root=tmp_path / "allowed")
    for path in (str(secret), "alias.py", "../secret.py"):
        result = call(server, "check_xla", {"script_path": path})
        assert result.is_error and "outside the folder" in result.content[0].text, path
    verify = call(server, "verify_migration", {"original_dir": str(tmp_path), "migrated_dir": ".", "command": "x"})
    assert verify.is_error and "outside the folder" in verify.content[0].text


def test_out_of_range_arguments_are_refused_as_over_http(tmp_path):
    """N13: MCP accepted timeout_s <= 0 and any k, which HTTP and the CLI refuse."""
    server = create_server(Pipeline(), allow_execution=True, allow_writes=True, root=tmp_path)
    (tmp_path / "src").mkdir()
    for name, arguments in (
        ("check_xla", {"source": "print(1)\n", "timeout_s": 0}),
        ("check_xla", {"source": "print(1)\n", "timeout_s": -5}),
        ("check_xla", {"source": "print(1)\n", "timeout_s": 1e9}),
        ("suggest_patch", {"source": "x = 1\n", "k": 99}),
        ("suggest_patch", {"source": "x = 1\n", "k": -1}),
        ("search_fixes", {"text": "cuda", "k": 0}),
        ("search_fixes", {"text": "cuda", "k": 51}),
        ("migrate_repo", {"src": "src", "dst": "out", "jobs": 0}),
    ):
        result = call(server, name, arguments)
        assert result.is_error, (name, arguments)
        assert any(word in result.content[0].text for word in ("greater", "less")), result.content[0].text
    assert not (tmp_path / "out").exists()
    whole = call(server, "suggest_patch", {"source": "x = 1\n", "k": 2.0})
    assert not whole.is_error, whole.content


def running_with(marker: str) -> list[int]:
    """Pids of the processes whose command line holds `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.mark.slow
def test_stdio_server_stops_a_running_tool_on_cancel_and_on_eof(tmp_path):
    """N12: a running check went on after the client cancelled the call or closed stdin (the server waited for it)."""
    start = f"from pathlib import Path; from xlaport.serve.mcp import create_server; create_server(root=Path({str(tmp_path)!r})).run('stdio')"
    server = subprocess.Popen(
        [sys.executable, "-c", start], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )

    def send(message: dict) -> None:
        server.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        server.stdin.flush()

    def answer(request_id: int) -> dict:
        while True:
            message = json.loads(server.stdout.readline())
            if message.get("id") == request_id:
                return message

    sleeper = {"source": "import time\ntime.sleep(600)\n", "timeout_s": 900}
    try:
        client = {"name": "test", "version": "1"}
        send(
            {
                "id": 1,
                "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client},
            }
        )
        assert "result" in answer(1)
        send({"method": "notifications/initialized"})
        first, second = f"--marker-{uuid.uuid4().hex}", f"--marker-{uuid.uuid4().hex}"
        send(
            {
                "id": 2,
                "method": "tools/call",
                "params": {"name": "check_xla", "arguments": {**sleeper, "args": [first]}},
            }
        )
        assert wait_for(lambda: running_with(first), 120), "the check never started"
        send({"method": "notifications/cancelled", "params": {"requestId": 2}})
        assert wait_for(lambda: not running_with(first), 15), "the cancelled check still runs"
        send({"id": 3, "method": "tools/call", "params": {"name": "explain_fix", "arguments": {"code": "XLA201"}}})
        assert not answer(3)["result"].get("isError")  # the server goes on serving
        send(
            {
                "id": 4,
                "method": "tools/call",
                "params": {"name": "check_xla", "arguments": {**sleeper, "args": [second]}},
            }
        )
        assert wait_for(lambda: running_with(second), 120), "the check never started"
        server.stdin.close()  # the client goes away
        assert server.wait(30) == 0
        assert wait_for(lambda: not running_with(second), 15), "the check outlived the server"
    finally:
        if server.poll() is None:
            server.kill()


class StdioServer:
    """`xlaport mcp` over real stdio pipes, spoken to in JSON-RPC lines."""

    def __init__(self, root: Path) -> None:
        start = f"from pathlib import Path; from xlaport.serve.mcp import create_server; create_server(root=Path({str(root)!r})).run('stdio')"
        self.process = subprocess.Popen(
            [sys.executable, "-c", start], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        client = {"name": "test", "version": "1"}
        params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
        self.send({"id": 1, "method": "initialize", "params": params})
        assert "result" in self.answer(1)
        self.send({"method": "notifications/initialized"})

    def send(self, message: dict) -> None:
        self.process.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        self.process.stdin.flush()

    def answer(self, request_id: int) -> dict:
        while True:
            message = json.loads(self.process.stdout.readline())
            if message.get("id") == request_id:
                return message


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cancel", "eof"])
def test_a_plain_migrate_repo_stops_between_files_over_stdio(tmp_path, how):
    """A migration that runs no program, in place, stopped by the client (a cancel, or stdin closed) while it
    writes: the process was killed wherever it was, leaving a half-written backup, a backup beside a file never
    rewritten, or a temporary. It now finishes the file it is writing and stops: each file is either untouched
    (no backup) or migrated with a complete backup of its original, nothing else is left, and files after the
    stop are not written."""
    src = tmp_path / "project"
    src.mkdir()
    body = "".join(f"def f{i}(x):\n    return x.cuda() * {i}\n\n" for i in range(30))
    originals = {f"m{n:03}.py": f"import torch\n# file {n}\n\n" + body + "x" * 200_000 + " = 1\n" for n in range(300)}
    for name, text in originals.items():
        (src / name).write_text(text)
    server = StdioServer(tmp_path)
    try:
        arguments = {"src": "project", "in_place": True, "jobs": 1}
        server.send({"id": 2, "method": "tools/call", "params": {"name": "migrate_repo", "arguments": arguments}})
        assert wait_for(lambda: any(src.glob("*.xlaport.bak")), 600), "the migration never started writing"
        if how == "cancel":
            server.send({"method": "notifications/cancelled", "params": {"requestId": 2}})
            server.send(
                {"id": 3, "method": "tools/call", "params": {"name": "explain_fix", "arguments": {"code": "XLA201"}}}
            )
            assert not server.answer(3)["result"].get("isError")  # answered once the call was stopped
        else:
            server.process.stdin.close()
            assert server.process.wait(60) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()
    written = 0
    for name, original in originals.items():
        text, backup = (src / name).read_text(), src / f"{name}.xlaport.bak"
        if backup.exists():
            assert backup.read_text() == original and "torch_xla" in text, name
            written += 1
        else:
            assert text == original, name
    left = sorted(p.name for p in src.iterdir() if p.name not in originals and not p.name.endswith(".xlaport.bak"))
    assert left == [] and 0 < written < len(originals)
    time.sleep(2)  # nothing goes on writing after the stop
    assert len(list(src.glob("*.xlaport.bak"))) == written


@pytest.mark.slow
def test_migrate_repo_in_place_with_validation_stages_outside_the_root(tmp_path, monkeypatch):
    """Confined writes still let the in-place migration write its own staging copy (in the temporary folder)."""
    monkeypatch.setenv("XLAPORT_TRACES", str(tmp_path / "traces.jsonl"))
    src = tmp_path / "project"
    shutil.copytree(PROJECT, src)
    tmp_path.chmod(0o755)  # the server's root: the sandbox user may enter it (a 0700 root is refused)
    server = create_server(Pipeline(), allow_execution=True, allow_writes=True, root=tmp_path)
    result = call(server, "migrate_repo", {"src": "project", "in_place": True, "validate_cmd": "python train.py"})
    assert not result.is_error, result.content
    summary = result.structured_content
    assert summary["validation"]["status"] != "unvalidated" or "outside" not in str(summary["validation"]["reason"])
    assert summary["written"] and "torch_xla" in (src / "train.py").read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox user exists only for root")
def test_verify_of_a_tree_the_sandbox_user_cannot_read_is_refused_without_its_content():
    """A run copies the tree into the sandbox user's scratch, where a root-only 0600 file became readable and
    verify_migration's output quoted it. A client's call is refused, naming the path and its mode."""
    import tempfile

    from xlaport.eval.sandbox import hidden_from_sandbox

    base = Path(tempfile.mkdtemp(prefix="xlaport-test-hidden-", dir="/tmp"))
    try:
        base.chmod(0o755)
        for side in ("original", "migrated"):
            (base / side).mkdir()
            (base / side / "train.py").write_text("print(open('secret.txt').read())\n")
        assert hidden_from_sandbox(base / "original") is None
        secret = base / "original" / "secret.txt"
        secret.write_text("hunter2\n")
        secret.chmod(0o600)
        assert str(secret) in hidden_from_sandbox(base / "original")
        server = create_server(Pipeline(), allow_execution=True, root=base)
        result = call(
            server,
            "verify_migration",
            {"original_dir": "original", "migrated_dir": "migrated", "command": "python train.py"},
        )
        text = result.content[0].text
        assert result.is_error and f"cannot read {secret} (-rw-------" in text and "hunter2" not in text
    finally:
        shutil.rmtree(base)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox user exists only for root")
def test_suggest_patch_of_a_file_the_sandbox_user_cannot_read_shows_nothing_of_it():
    """suggest_patch(project_root, path) answered with the diff of a root-only 0600 file: the client saw what
    only the server's user could read. Refused like a run of it, naming the path and its mode."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="xlaport-test-hidden-", dir="/tmp"))
    try:
        base.chmod(0o755)
        (base / "project").mkdir()
        secret = base / "project" / "train.py"
        secret.write_text("import torch\nTOKEN = 'hunter2'\nx = torch.zeros(2).cuda()\n")
        secret.chmod(0o600)
        server = create_server(Pipeline(), allow_execution=False, root=base)
        result = call(server, "suggest_patch", {"project_root": "project", "path": "train.py", "k": 0})
        text = result.content[0].text
        assert result.is_error and f"cannot read {secret} (-rw-------" in text and "hunter2" not in text
        secret.chmod(0o644)
        readable = call(server, "suggest_patch", {"project_root": "project", "path": "train.py", "k": 0})
        assert not readable.is_error and "torch_xla" in readable.structured_content["migrated"]
    finally:
        shutil.rmtree(base)


@pytest.mark.slow
def test_a_cancelled_migrate_repo_stops_writing(tmp_path, monkeypatch):
    """N12 for the migration that runs no program: it ran in a thread, which a cancel cannot stop, so a
    cancelled call still wrote its whole tree afterwards. In a process of its own it is killed."""
    import multiprocessing

    import anyio

    src = tmp_path / "project"
    src.mkdir()
    body = "".join(f"def f{i}(x):\n    return x.cuda() * {i}\n\n" for i in range(40))
    for n in range(150):
        (src / f"m{n}.py").write_text("import torch\n\n" + body)
    server = create_server(Pipeline(), allow_execution=False, allow_writes=True, root=tmp_path)

    async def cancelled_after(seconds: float) -> None:
        async with mcp.Client(server) as client:
            with anyio.move_on_after(seconds):
                await client.call_tool("migrate_repo", {"src": "project", "dst": "cancelled", "jobs": 1})

    asyncio.run(cancelled_after(1.0))
    start = time.monotonic()
    whole = call(server, "migrate_repo", {"src": "project", "dst": "whole", "jobs": 1})
    assert not whole.is_error and (tmp_path / "whole" / "xlaport-report.json").is_file()
    time.sleep(min(time.monotonic() - start, 60))  # as long again as a whole migration took
    assert not (tmp_path / "cancelled" / "xlaport-report.json").exists()
    assert not [p for p in multiprocessing.active_children() if p.name == "xlaport-tool-call"]
