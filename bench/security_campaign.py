"""Issue 25's campaign, rerun against the real fronts: the `xlaport` CLI, `xlaport serve` and `xlaport mcp --transport
http` on 127.0.0.1 (uvicorn), and `xlaport mcp` over stdio, through the python MCP client.

Each case replays an item of the issue (N1..N18, F5, F10, F12, F13, F17), a variant of it in our own words, or
what round 3 left (R1: trees the sandbox user cannot reach, R2: a folder swapped for a link between a confined
write's check and the write, R3: a plain migrate_repo stopped by its client), and records whether it was handled. Run as root (the sandbox's cases need it) on a scratch folder:

    .venv/bin/python bench/security_campaign.py [--out bench/results/security_campaign_DATE.txt] [--quick]

`--quick` leaves out the cases that run programs under the execution check (tens of seconds each here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import mcp

BIN = Path(sys.executable).with_name("xlaport")
TOKEN = "campaign-" + os.urandom(8).hex()
CUDA = "import torch\n\nx = torch.zeros(2).cuda()\nprint(x)\n"
SECRET = "root:$6$campaign-secret-hash:19000:0:99999:7:::\n"


@dataclass
class Case:
    item: str
    what: str
    handled: bool
    detail: str = ""


CASES: list[Case] = []


def case(item: str, what: str) -> Callable:
    """Runs the decorated check now; it returns (handled, detail) or raises (a defect, with the error)."""

    def run(check: Callable[[], tuple[bool, str]]) -> Callable:
        start = time.monotonic()
        try:
            handled, detail = check()
        except Exception as exc:  # noqa: BLE001  (a crash of the case is a finding, recorded)
            handled, detail = False, f"{type(exc).__name__}: {exc} | {traceback.format_exc().splitlines()[-3]}"
        took = time.monotonic() - start
        CASES.append(Case(item, what, handled, f"{detail} ({took:.1f} s)"))
        print(f"{'ok ' if handled else 'BAD'} {item:8} {what}: {detail[:200]} ({took:.1f} s)", flush=True)
        return check

    return run


def cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN), *args], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A front started as its CLI starts it, on 127.0.0.1; its output kept (for tokens in logs)."""

    def __init__(self, args: list[str], env: dict, path: str) -> None:
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [str(BIN), *args, "--port", str(self.port)],
            env={**os.environ, **env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                httpx.get(self.url + path, timeout=2)
                break
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{args} did not start: {self.output()[-500:]}") from None
                time.sleep(0.5)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def mcp_calls(transport, calls: list[tuple[str, dict]]) -> list:
    """Each call's result through one MCP session: (is_error, text) or the exception the client raised."""

    async def go():
        out = []
        async with mcp.Client(transport) as client:
            for name, arguments in calls:
                try:
                    result = await client.call_tool(name, arguments)
                    out.append((result.is_error, result.content[0].text if result.content else ""))
                except Exception as exc:  # noqa: BLE001
                    out.append(exc)
        return out

    return asyncio.run(go())


def mcp_http(url: str, token: str | None):
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return streamable_http_client(f"{url}/mcp", http_client=create_mcp_http_client(headers=headers))


def mcp_stdio(root: Path):
    from mcp.client.stdio import StdioServerParameters

    return StdioServerParameters(command=str(BIN), args=["mcp", "--root", str(root)], env=dict(os.environ))


def refused(result, *words: str) -> bool:
    if isinstance(result, Exception):
        return False
    is_error, text = result
    return is_error and all(w in text for w in words)


def tree(base: Path, files: dict[str, str]) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)
    return base


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def git_repo(folder: Path) -> None:
    git(folder, "init", "-q")
    git(folder, "-c", "user.email=c@c", "-c", "user.name=c", "add", "-A")
    git(folder, "-c", "user.email=c@c", "-c", "user.name=c", "commit", "-qm", "x")


# ---------------------------------------------------------------------------------------------------------------
def campaign(base: Path, quick: bool) -> None:
    root = base / "root"  # the MCP servers' --root
    outside = base / "outside"
    outside.mkdir(parents=True)
    secret = outside / "shadow"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    tree(root / "evil", {"authorized_keys": "ssh-ed25519 AAAA attacker\n", "config.txt": "owned\n"})
    victim = tree(base / "victim", {"config.txt": "original\n"})
    victim.chmod(0o700)
    tree(root / "proj", {"train.py": CUDA, "util.py": "def f():\n    return 1\n"})
    (root / "proj" / "data").symlink_to(outside)
    (root / "door").symlink_to(victim)
    (root / "alias.py").symlink_to(secret)

    def planted_by(arguments: dict) -> list[str]:
        """The file this call's arguments aimed outside the root, if it was written (each call names its own)."""
        names = re.findall(r"planted-\d+\.py", json.dumps(arguments))
        return [name for name in names if (outside / name).exists()]

    def victim_untouched() -> bool:
        return (
            sorted(p.name for p in victim.iterdir()) == ["config.txt"]
            and (victim / "config.txt").read_text() == "original\n"
        )

    # --- N1: MCP over HTTP ------------------------------------------------------------------------------------
    no_token = {k: v for k, v in os.environ.items() if k != "XLAPORT_TOKEN"}
    started = subprocess.run(
        [str(BIN), "mcp", "--transport", "http", "--port", str(free_port()), "--root", str(root)],
        env=no_token,
        capture_output=True,
        text=True,
        timeout=120,
    )
    case("N1", "MCP over HTTP without XLAPORT_TOKEN refuses to start")(
        lambda: (started.returncode != 0 and "XLAPORT_TOKEN" in started.stdout + started.stderr, started.stderr[-150:])
    )
    mcp_args = ["mcp", "--transport", "http", "--root", str(root)]
    reader = Served(mcp_args, {"XLAPORT_TOKEN": TOKEN}, "/mcp")
    try:
        for token in (None, "wrong", TOKEN.upper()):

            @case("N1", f"MCP over HTTP with token {token!r}: every request refused")
            def _(token=token):
                status = httpx.post(reader.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize"})
                if token:
                    status = httpx.post(
                        reader.url + "/mcp",
                        json={"jsonrpc": "2.0", "id": 1, "method": "initialize"},
                        headers={"Authorization": f"Bearer {token}"},
                    )
                return status.status_code == 401, f"HTTP {status.status_code}"

        results = mcp_calls(
            mcp_http(reader.url, TOKEN),
            [
                ("migrate_repo", {"src": "evil", "dst": str(victim), "force": True}),
                ("check_xla", {"source": "print(1)\n"}),
                ("explain_fix", {"code": "XLA201"}),
            ],
        )
        case("N1", "token, no --write: migrate_repo refused, victim untouched")(
            lambda: (refused(results[0], "does not write") and victim_untouched(), str(results[0])[:120])
        )
        case("N1", "token, no --exec: check_xla refused")(
            lambda: (refused(results[1], "does not run code"), str(results[1])[:120])
        )
        case("N1", "token: a read-only tool answers")(lambda: (results[2][0] is False, str(results[2])[:80]))
    finally:
        reader.stop()

    writer = Served([*mcp_args, "--write", "--exec"], {"XLAPORT_TOKEN": TOKEN}, "/mcp")
    try:
        # every path argument of every tool, given outside the root: absolutely, through `..`, through a link
        outs = {"absolute": str(victim), "dotdot": f"../{victim.name}", "link": "door"}
        calls = []
        for how, path in outs.items():
            calls += [
                (f"migrate_repo dst {how}", "migrate_repo", {"src": "evil", "dst": path, "force": True}),
                (f"migrate_repo src {how}", "migrate_repo", {"src": path, "dst": "copy"}),
                (f"migrate_repo in_place {how}", "migrate_repo", {"src": path, "in_place": True, "force": True}),
                (f"verify_migration original {how}", "verify_migration", {"original_dir": path, "migrated_dir": "proj", "command": "python train.py"}),
                (f"verify_migration migrated {how}", "verify_migration", {"original_dir": "proj", "migrated_dir": path, "command": "python train.py"}),
                (f"optimize_migration migrated {how}", "optimize_migration", {"migrated_dir": path}),
                (f"optimize_migration original {how}", "optimize_migration", {"migrated_dir": "proj", "original_dir": path}),
                (f"check_xla script_path {how}", "check_xla", {"script_path": f"{path}/config.txt"}),
                (f"check_xla cwd {how}", "check_xla", {"source": "print(1)\n", "cwd": path}),
                (f"check_xla project_root {how}", "check_xla", {"source": "print(1)\n", "project_root": path, "path": "t.py"}),
                (f"suggest_patch project_root {how}", "suggest_patch", {"project_root": path, "path": "config.txt"}),
                (f"suggest_patch path {how}", "suggest_patch", {"project_root": ".", "path": f"{path}/config.txt"}),
            ]  # fmt: skip
        calls += [
            ("check_xla script_path link to a root-only file", "check_xla", {"script_path": "alias.py"}),
            ("suggest_patch path link to a root-only file", "suggest_patch", {"project_root": ".", "path": "alias.py"}),
            ("check_xla project path absolute", "check_xla", {"source": "print(1)\n", "project_root": "proj", "path": f"{outside}/planted-1.py"}),
            ("check_xla project path ..", "check_xla", {"source": "print(1)\n", "project_root": "proj", "path": f"../../../../../..{outside}/planted-2.py"}),
            ("check_xla project path through the project's link", "check_xla", {"source": "print(1)\n", "project_root": "proj", "path": "data/planted-3.py"}),
            ("suggest_patch validated, path through the project's link", "suggest_patch", {"source": CUDA, "project_root": "proj", "path": "data/planted-4.py", "validate": True, "k": 0}),
            ("suggest_patch validated, absolute path", "suggest_patch", {"source": CUDA, "project_root": "proj", "path": f"{outside}/planted-5.py", "validate": True, "k": 0}),
            ("check_xla project cwd ..", "check_xla", {"source": "print(1)\n", "project_root": "proj", "path": "t.py", "cwd": "../.."}),
            ("verify_migration cwd ..", "verify_migration", {"original_dir": "proj", "migrated_dir": "proj", "command": "python train.py", "cwd": "../../.."}),
        ]  # fmt: skip
        results = mcp_calls(mcp_http(writer.url, TOKEN), [(name, args) for _, name, args in calls])
        for (what, _, what_args), result in zip(calls, results, strict=True):
            leaked = not isinstance(result, Exception) and "campaign-secret" in result[1]
            case("N1+", f"MCP HTTP {what}: refused")(
                lambda result=result, leaked=leaked, what_args=what_args: (
                    refused(result) and not leaked and victim_untouched() and not planted_by(what_args),
                    str(result)[:160],
                )
            )
        log = writer.output()
        case("tokens", f"MCP HTTP server log holds no token after {len(calls)} calls")(
            lambda: (TOKEN not in log, f"{len(log)} bytes of log")
        )
    finally:
        writer.stop()

    # --- N13, N12, N3 through MCP stdio ---------------------------------------------------------------------
    stdio_calls = [
        ("check_xla", {"source": "print(1)\n", "timeout_s": 0}),
        ("check_xla", {"source": "print(1)\n", "timeout_s": -5}),
        ("suggest_patch", {"source": CUDA, "k": 1000}),
        ("search_fixes", {"text": "cuda", "k": 0}),
        ("search_fixes", {"text": "x" * 2_000_000, "k": 1}),
        ("search_fixes", {"text": "torch.cuda\0.synchronize() ☃ \u202e", "k": 1}),
        ("suggest_patch", {"source": "\ufeff" + CUDA, "k": 0}),
        ("suggest_patch", {"source": CUDA, "path": "a\0b.py", "k": 0}),
        ("suggest_patch", {"source": CUDA, "path": "é" * 200 + ".py", "k": 0}),
        ("suggest_patch", {"source": "type Alias = list[int]\n" + CUDA, "k": 0}),
        ("explain_fix", {"code": "../../etc/passwd"}),
    ]
    results = mcp_calls(mcp_stdio(root), stdio_calls)
    for i, label in enumerate(["timeout_s 0", "timeout_s -5", "k 1000"]):
        case("N13", f"MCP stdio {label} refused")(lambda r=results[i]: (refused(r), str(r)[:120]))
    case("N13", "MCP stdio search k 0 refused")(lambda: (refused(results[3]), str(results[3])[:120]))
    case("huge", "MCP stdio search of a 2 MB text answers or refuses cleanly")(
        lambda: (not isinstance(results[4], Exception), str(results[4])[:120])
    )
    case("unicode", "MCP stdio search with a NUL, a snowman and a right-to-left mark")(
        lambda: (not isinstance(results[5], Exception), str(results[5])[:120])
    )
    case("F12", "MCP stdio suggest of a source starting with a BOM")(
        lambda: (not isinstance(results[6], Exception) and not results[6][0], str(results[6])[:100])
    )
    case("N7/NUL", "MCP stdio suggest path with a NUL refused")(lambda: (refused(results[7]), str(results[7])[:120]))
    case("N7", "MCP stdio suggest path of 402 bytes refused")(lambda: (refused(results[8]), str(results[8])[:120]))
    case("N10", "MCP stdio suggest of 3.12 syntax: refused as newer than the tool's Python, not the user's error")(
        lambda: (refused(results[9], "newer than the Python", "not an error in the file"), str(results[9])[:100])
    )
    case("paths", "MCP stdio explain_fix of a path-like code: not found, nothing read")(
        lambda: (refused(results[10], "not_found"), str(results[10])[:120])
    )

    @case("N12", "MCP stdio: a client closing stdin mid-check stops the server and the program it ran")
    def _():
        marker = f"--campaign-{os.urandom(6).hex()}"
        server = subprocess.Popen([str(BIN), "mcp", "--root", str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip

        def send(message: dict) -> None:
            server.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
            server.stdin.flush()

        def running() -> bool:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                        return True
                except OSError:
                    continue
            return False

        info = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "campaign", "version": "1"}}
        send({"id": 1, "method": "initialize", "params": info})
        server.stdout.readline()
        send({"method": "notifications/initialized"})
        sleeper = {"source": "import time\ntime.sleep(600)\n", "timeout_s": 900, "args": [marker]}
        send({"id": 2, "method": "tools/call", "params": {"name": "check_xla", "arguments": sleeper}})
        deadline = time.monotonic() + 180
        while not running() and time.monotonic() < deadline:
            time.sleep(0.5)
        started = running()
        server.stdin.close()
        code = server.wait(60)
        deadline = time.monotonic() + 15
        while running() and time.monotonic() < deadline:
            time.sleep(0.5)
        return (
            started and not running(),
            f"program started {started}, server exit {code}, program alive after {running()}",
        )

    # --- HTTP service -------------------------------------------------------------------------------------------
    served = Served(["serve"], {"XLAPORT_TOKEN": TOKEN}, "/healthz")
    try:
        url, auth = served.url, {"Authorization": f"Bearer {TOKEN}"}

        def post(route: str, body, headers=None, raw: bytes | None = None) -> httpx.Response:
            if raw is not None:
                return httpx.post(url + route, content=raw, headers={"content-type": "application/json", **(headers or {})}, timeout=300)  # fmt: skip
            return httpx.post(url + route, json=body, headers=headers or {}, timeout=300)

        http_cases = [
            ("N7", "/v1/suggest path of 263 bytes", "/v1/suggest", {"source": CUDA, "path": "é" * 130 + ".py", "options": {"k": 0}}, 422),
            ("N7", "/v1/verify name of 263 bytes", "/v1/verify", {"original": "x=1\n", "migrated": "x=1\n", "name": "é" * 130 + ".py"}, 422),
            ("N8", "/v1/check argument of 200 KB", "/v1/check", {"source": "x=1\n", "args": ["a" * 200_000]}, 422),
            ("N9", "/v1/check NUL in args", "/v1/check", {"source": "x=1\n", "args": ["a\0b"]}, 422),
            ("N9", "/v1/suggest NUL in options.args", "/v1/suggest", {"source": CUDA, "options": {"k": 0, "args": ["\0"]}}, 422),
            ("F17", "/v1/search k 3.0 accepted", "/v1/search", {"text": "cuda", "k": 3.0}, 200),
            ("F17", "/v1/search k 3.5 refused", "/v1/search", {"text": "cuda", "k": 3.5}, 422),
            ("paths", "/v1/check project path absolute", "/v1/check", {"source": "x=1\n", "project": {"files": {"t.py": "x=1\n"}}, "path": f"{outside}/planted-6.py"}, 422),
            ("paths", "/v1/check project path ..", "/v1/check", {"source": "x=1\n", "project": {"files": {"t.py": "x=1\n"}}, "path": f"../../../../../..{outside}/planted-7.py"}, 422),
            ("paths", "/v1/suggest project file ..", "/v1/suggest", {"source": CUDA, "project": {"files": {"../x.py": "x=1\n"}}, "path": "t.py", "options": {"k": 0, "validate_patch": True}}, 422),
            ("paths", "/v1/suggest validated, path absolute", "/v1/suggest", {"source": CUDA, "project": {"files": {"t.py": "x=1\n"}}, "path": f"{outside}/planted-8.py", "options": {"k": 0, "validate_patch": True}}, 422),
            ("paths", "/v1/check project cwd ..", "/v1/check", {"source": "x=1\n", "project": {"files": {"t.py": "x=1\n"}}, "path": "t.py", "cwd": "../../.."}, 422),
            ("huge", "/v1/suggest source of 400k characters", "/v1/suggest", {"source": "x = 1\n" * 70_000, "options": {"k": 0}}, 422),
            ("unicode", "/v1/suggest unicode path", "/v1/suggest", {"source": CUDA, "path": "données/模型 ☃.py", "options": {"k": 0}}, 200),
        ]  # fmt: skip
        for item, what, route, body, expected in http_cases:

            @case(item, f"HTTP {what} -> {expected}")
            def _(route=route, body=body, expected=expected):
                response = post(route, body, auth)
                detail = response.json().get("detail") if response.status_code == 422 else None
                shape = detail is None or isinstance(detail, list)
                planted = planted_by(body)
                return response.status_code == expected and shape and not planted, f"HTTP {response.status_code} {response.text[:120]}"  # fmt: skip

        @case("F12", "HTTP body starting with a BOM")
        def _():
            raw = b"\xef\xbb\xbf" + json.dumps({"source": "\ufeff" + CUDA, "options": {"k": 0}}).encode()
            response = post("/v1/suggest", None, raw=raw)
            return response.status_code == 200, f"HTTP {response.status_code}"

        @case("tokens", "a wrong token is never echoed, the right one never in answers or the log")
        def _():
            answers = [
                post("/v1/check", {"source": "x=1\n"}, {"Authorization": f"Bearer {TOKEN}x"}),
                post("/v1/check", {"source": "x=1\n", "args": ["\0"]}, auth),
                httpx.get(url + "/healthz"),
                httpx.get(url + "/openapi.json"),
            ]
            texts = [a.text for a in answers] + [served.output()]
            return not any(TOKEN in t for t in texts), f"statuses {[a.status_code for a in answers]}"

        if not quick:

            @case("tokens", "the sandboxed child never sees XLAPORT_TOKEN")
            def _():
                script = "import os\nprint(sorted(k for k in os.environ if 'TOKEN' in k or 'XLAPORT' in k))\n"
                response = post("/v1/check", {"source": script, "timeout_s": 240}, auth)
                out = json.dumps(response.json())
                return response.status_code == 200 and TOKEN not in out and "XLAPORT_TOKEN" not in out, out[:150]

        @case("F5", "one local process naming a new X-Forwarded-For per request gets no more than its share")
        def _():
            from concurrent.futures import ThreadPoolExecutor

            big = {"source": "import torch\n" + "x = torch.zeros(2).cuda()\n" * 10_000, "options": {"k": 0}}

            def slow(i: int) -> httpx.Response:
                return httpx.post(
                    url + "/v1/suggest", json=big, headers={"X-Forwarded-For": f"10.9.9.{i}"}, timeout=600
                )

            with ThreadPoolExecutor(2) as pool:
                held = [pool.submit(slow, i) for i in (1, 2)]
                time.sleep(1.5)  # both hold a heavy slot (each takes seconds to fix)
                third = httpx.post(url + "/v1/suggest", json={"source": CUDA, "options": {"k": 0}}, headers={"X-Forwarded-For": "10.9.9.3"}, timeout=600)  # fmt: skip
                busy = all(not f.done() for f in held)
                [f.result() for f in held]
            return (
                third.status_code == 429 or not busy,
                f"third: HTTP {third.status_code} (the two still running: {busy})",
            )

        @case("F5", "HTTP healthz states per-client slots")
        def _():
            health = httpx.get(url + "/healthz").json()
            return 0 < health["per_client"] < health["max_concurrency"], f"{health['per_client']} of {health['max_concurrency']}"  # fmt: skip
    finally:
        served.stop()

    # --- the CLI on the user's files ------------------------------------------------------------------------
    work = base / "cli"

    @case("N2", "fix keeps a user's file that looks like a temporary; migrate copies it")
    def _():
        folder = tree(work / "n2", {"train.py": CUDA, ".notes.txt.abcd1234.tmp": "precious\n", ".train.py.a1b2c3d4.xlaport.tmp": "mine\n"})  # fmt: skip
        cli("fix", ".", cwd=folder)
        kept = (folder / ".notes.txt.abcd1234.tmp").exists() and (folder / ".train.py.a1b2c3d4.xlaport.tmp").exists()
        cli("migrate", str(folder), "--out", str(work / "n2-out"))
        copied = (work / "n2-out" / ".notes.txt.abcd1234.tmp").exists()
        return kept and copied, f"kept {kept}, copied {copied}"

    @case("N5", "skip-worktree and assume-unchanged files with local edits get a backup")
    def _():
        found = []
        for flag in ("--skip-worktree", "--assume-unchanged"):
            folder = tree(work / f"n5{flag}", {"train.py": CUDA})
            git_repo(folder)
            git(folder, "update-index", flag, "train.py")
            (folder / "train.py").write_text(CUDA + "# my local edit\n")
            cli("fix", ".", cwd=folder)
            found.append((folder / "train.py.xlaport.bak").exists())
        return all(found), str(found)

    @case("N6", "reports and the kept trace are no more readable than a 0600 source")
    def _():
        folder = tree(work / "n6", {"train.py": CUDA})
        (folder / "train.py").chmod(0o600)
        env = {"XLAPORT_TRACES": str(work / "n6-traces.jsonl")}
        cli("migrate", str(folder), "--out", str(work / "n6-out"), "--keep-trace", env=env)
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (work / "n6-out").iterdir() if p.name.startswith("xlaport-")}  # fmt: skip
        modes["traces.jsonl"] = oct((work / "n6-traces.jsonl").stat().st_mode & 0o777)
        quoting = {k: v for k, v in modes.items() if k != "xlaport-rules.html"}
        return all(int(v, 8) & 0o077 == 0 for v in quoting.values()) and len(quoting) >= 4, str(modes)

    @case("N6+", "optimize's report (it quotes each candidate's diff) is no more readable than a 0600 source")
    def _():
        loop = "import torch\nimport torch_xla\n\nw = torch.zeros(2, device=torch_xla.device())\nfor step in range(3):\n    loss = (w + 1).sum()\n    print('loss', loss.item())\n    torch_xla.sync()\n"  # fmt: skip
        folder = tree(work / "n6-optimize", {"train.py": loop})
        (folder / "train.py").chmod(0o600)
        out = cli("optimize", str(folder))
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in folder.glob("xlaport-optimize.*")}
        return len(modes) == 2 and all(int(m, 8) & 0o077 == 0 for m in modes.values()), f"{modes} {out.stderr[-100:]}"

    @case("F10", "the backup of another user's 0600 file is theirs, 0600")
    def _():
        folder = tree(work / "f10", {"train.py": CUDA})
        os.chown(folder / "train.py", 4242, 4242)
        (folder / "train.py").chmod(0o600)
        cli("fix", ".", cwd=folder)
        backup = (folder / "train.py.xlaport.bak").stat()
        fixed = (folder / "train.py").stat()
        ok = (backup.st_uid, backup.st_mode & 0o777, fixed.st_uid, fixed.st_mode & 0o777) == (4242, 0o600, 4242, 0o600)
        return ok, f"backup uid {backup.st_uid} {oct(backup.st_mode & 0o777)}, file uid {fixed.st_uid}"

    @case("N11/F13", "a file reached twice (a link beside it, a path given twice) is fixed once, counted once")
    def _():
        folder = tree(work / "n11", {"train.py": CUDA})
        (folder / "again.py").symlink_to("train.py")
        out = cli("fix", ".", "train.py", "--diff", cwd=folder)
        return out.stdout.count("+++ ") == 1, f"{out.stdout.count('+++ ')} diffs"

    @case("N18", "fix DIR never writes outside DIR through a file link")
    def _():
        elsewhere = tree(work / "n18-elsewhere", {"lib.py": CUDA})
        folder = tree(work / "n18", {"train.py": CUDA})
        (folder / "lib.py").symlink_to(elsewhere / "lib.py")
        cli("fix", str(folder))
        return (elsewhere / "lib.py").read_text() == CUDA, "outside file unchanged" if (elsewhere / "lib.py").read_text() == CUDA else "REWRITTEN"  # fmt: skip

    @case("N17", "SARIF URIs percent-encoded, an unparsable file is a notification")
    def _():
        folder = tree(work / "n17", {"my file#1.py": CUDA, "broken.py": "def (:\n"})
        out = cli("lint", str(folder), "--format", "sarif", "--exit-zero")
        log = json.loads(out.stdout)
        uris = [loc["physicalLocation"]["artifactLocation"]["uri"] for r in log["runs"][0]["results"] for loc in r["locations"]]  # fmt: skip
        notes = json.dumps(log["runs"][0].get("invocations", []))
        return all("%20" in u and "%23" in u for u in uris if "file" in u) and "broken.py" in notes, f"{uris[:1]} notes {'broken.py' in notes}"  # fmt: skip

    @case("N10", "lint of valid 3.12 syntax: said to be newer than the tool's Python, not the user's error")
    def _():
        folder = tree(work / "n10", {"t.py": "type Pair[T] = tuple[T, T]\n\ndef f[T](x: T) -> T:\n    return x\n"})
        out = cli("lint", str(folder), "--format", "json", "--exit-zero")
        text = " ".join((out.stdout + out.stderr).split())
        return "newer than the Python" in text and "not an error in the file" in text, text[-160:]

    @case("N4", "a file edited between the analysis and the write keeps the edit")
    def _():
        from xlaport.files import ChangedMeanwhile, write_with_backup

        path = tree(work / "n4", {"t.py": CUDA}) / "t.py"
        path.write_text(CUDA + "# edited meanwhile\n")
        try:
            write_with_backup(path, "fixed\n", backup=True, expected=CUDA)
        except ChangedMeanwhile:
            pass
        return path.read_text().endswith("# edited meanwhile\n") and not list(path.parent.glob("*.bak")), "edit kept, no stray backup"  # fmt: skip

    @case("ro", "fix of a read-only tree (read-only bind mount) fails clearly, nothing stray")
    def _():
        folder = tree(work / "ro", {"train.py": CUDA})
        mount = subprocess.run(
            ["mount", "--bind", "-o", "ro", str(folder), str(folder)], capture_output=True, text=True
        )
        if mount.returncode != 0:
            return True, f"not testable here: {mount.stderr.strip()}"
        try:
            out = cli("fix", ".", cwd=folder)
        finally:
            subprocess.run(["umount", str(folder)], check=False)
        clean = sorted(p.name for p in folder.iterdir()) == ["train.py"] and (folder / "train.py").read_text() == CUDA
        return out.returncode != 0 and "Traceback" not in out.stderr and clean, (out.stdout + out.stderr).strip()[-150:]

    @case("conc", "two fix runs at once on the same tree: every file fixed once, parses, no temporaries left")
    def _():
        folder = tree(work / "conc", {f"m{i}.py": CUDA for i in range(60)})
        runs = [subprocess.Popen([str(BIN), "fix", "."], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]  # fmt: skip
        errs = [r.communicate(600)[1].decode() for r in runs]
        texts = [(folder / f"m{i}.py").read_text() for i in range(60)]
        one = texts[0]
        compile(one, "m0.py", "exec")
        leftovers = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
        return all(t == one for t in texts) and "cuda()" not in one and not leftovers and "Traceback" not in "".join(errs), f"leftovers {leftovers}; {errs[1][-120:]}"  # fmt: skip

    @case("kill-9", "fix killed (SIGKILL) mid-run 6 times: no file torn, the rerun finishes the job")
    def _():
        folder = tree(work / "kill", {f"m{i}.py": CUDA * 30 for i in range(80)})
        for delay in (0.8, 1.2, 1.6, 2.0, 2.5, 3.0):
            proc = subprocess.Popen([str(BIN), "fix", "."], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            time.sleep(delay)
            proc.kill()
            proc.wait()
            for i in range(80):
                compile((folder / f"m{i}.py").read_text(), f"m{i}.py", "exec")  # torn -> SyntaxError or short
        cli("fix", ".", cwd=folder)
        texts = {(folder / f"m{i}.py").read_text() for i in range(80)}
        return len(texts) == 1 and "cuda()" not in texts.pop(), "all 80 files fixed alike after the rerun"

    @case("N14", "migrate -j 2 killed with SIGKILL leaves no worker behind")
    def _():
        folder = tree(work / "n14", {f"m{i}.py": CUDA * 40 for i in range(120)})
        proc = subprocess.Popen([str(BIN), "migrate", str(folder), "--out", str(work / "n14-out"), "-j", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

        def descendants() -> list[str]:
            found, todo = [], [str(proc.pid)]
            while todo:
                kids = subprocess.run(["pgrep", "-P", todo.pop()], capture_output=True, text=True).stdout.split()
                found += kids
                todo += kids
            return found

        deadline = time.monotonic() + 120
        while len(descendants()) < 4 and time.monotonic() < deadline:  # the pool's two workers are forked
            time.sleep(0.5)
        children = descendants()
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30  # a worker still importing notices its parent's death once it is done
        while any(Path(f"/proc/{c}").exists() for c in children) and time.monotonic() < deadline:
            time.sleep(0.5)
        alive = [c for c in children if Path(f"/proc/{c}").exists()]
        return len(
            children
        ) >= 4 and not alive, f"{len(children)} descendants before the kill, alive 30 s after: {alive}"

    # --- the sandbox ---------------------------------------------------------------------------------------------
    if not quick:

        @case("N3", "CLI check of the user's script under a 0700 folder: run as nobody through a view, never root")
        def _():
            private = tree(work / "n3-private" / "proj", {"t.py": "import os\nprint('uid', os.getuid())\n"})
            (work / "n3-private").chmod(0o700)
            out = cli("check", str(private / "t.py"), "--format", "json", timeout=300)
            ran_as = json.loads(out.stdout).get("stdout_tail", "") if out.stdout.startswith("{") else out.stderr
            return ran_as.strip() == "uid 65534" or "allow-unsandboxed" in ran_as, ran_as.strip()[-160:]

        @case("N3", "MCP stdio check_xla of a root-only 0600 file: not run (the reason), no token of it in the answer")
        def _():
            script = tree(root / "n3", {"priv.py": "hunter2_secret_token = 1\n"}) / "priv.py"
            script.chmod(0o600)
            (result,) = mcp_calls(mcp_stdio(root), [("check_xla", {"script_path": "n3/priv.py", "timeout_s": 120})])
            text = str(result)
            return "not run" in text and "cannot read" in text and "hunter2" not in text, text[-260:]

    @case("N16", "no user namespace can be made inside the sandbox")
    def _():
        from xlaport.eval.sandbox import run_sandboxed

        result = run_sandboxed(["unshare", "-U", "true"], timeout_s=30)
        return result.returncode != 0, f"exit {result.returncode}: {result.stderr.strip()[-100:]}"

    @case("N15", "forked workers sharing 300 MB are counted once")
    def _():
        from xlaport.eval.sandbox import run_sandboxed

        code = "import os, time\nb = bytearray(300 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\npids = [os.fork() or (time.sleep(3), os._exit(0)) for _ in range(3)]\nfor p in pids: os.waitpid(p, 0)\n"  # fmt: skip
        result = run_sandboxed([sys.executable, "-c", code], memory_mb=1024, timeout_s=60)
        return result.ok and result.peak_rss_mb < 700, f"peak {result.peak_rss_mb:.0f} MB, ok {result.ok}"

    @case("hardlink", "an unprivileged user cannot hard-link a root-only file into the root (protected_hardlinks)")
    def _():
        target = root / "hl"
        shared = base / "shared"
        shared.mkdir(mode=0o1777, exist_ok=True)
        shared.chmod(0o1777)
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "ln", str(secret), str(shared / "hl")], capture_output=True, text=True)  # fmt: skip
        setting = Path("/proc/sys/fs/protected_hardlinks").read_text().strip()
        return out.returncode != 0 and not target.exists(), f"protected_hardlinks={setting}: {out.stderr.strip()[-80:]}"

    # --- round 3b: what round 3 left ---------------------------------------------------------------------------
    private = root / "r1-private"
    for side in ("original", "migrated"):
        tree(
            private / side, {"train.py": "print('hunter2_r1')\nfor i in range(3):\n    print(f'loss: {1 / (i + 1)}')\n"}
        )
    private.chmod(0o700)  # the trees' files are 0644: only the folder keeps the sandbox user out

    @case("R1", "MCP stdio verify_migration and check_xla of trees inside a 0700 folder of the root: refused, not run")
    def _():
        calls = [
            ("verify_migration", {"original_dir": "r1-private/original", "migrated_dir": "r1-private/migrated", "command": "python train.py"}),
            ("verify_migration", {"project_root": "r1-private/original", "path": "train.py", "source": "print(1)\n", "command": "python train.py"}),
            ("check_xla", {"script_path": "r1-private/original/train.py", "timeout_s": 120}),
            ("check_xla", {"source": "print(1)\n", "cwd": "r1-private/original", "timeout_s": 120}),
        ]  # fmt: skip
        results = mcp_calls(mcp_stdio(root), calls)
        handled = all(refused(r, "unreadable_to_sandbox", "r1-private (drwx------") for r in results)
        return handled and "hunter2_r1" not in str(results), f"{len(results)} calls: " + str(results[0])[-200:]

    @case("R2", "a folder swapped for a link out of the root between the check and the write: nothing written outside")
    def _():
        from xlaport import files

        checked, written = files.check_writable, []
        for writer in ("atomic_write", "write_with_backup", "copy_file"):
            folder = tree(root / f"r2-{writer}" / "pkg", {"train.py": "old\n"})
            escape = outside / f"r2-{writer}"
            escape.mkdir()

            def check_then_swap(path: Path, folder: Path = folder, escape: Path = escape) -> None:
                checked(path)
                if not folder.is_symlink():
                    folder.rename(folder.with_name("moved"))
                    folder.symlink_to(escape)

            files.check_writable = check_then_swap
            try:
                with files.writes_confined_to(root):
                    if writer == "atomic_write":
                        files.atomic_write(folder / "train.py", "new\n")
                    elif writer == "write_with_backup":
                        files.write_with_backup(folder / "train.py", "new\n", backup=True)
                    else:
                        files.copy_file(
                            secret.with_name("nothing") if False else root / "proj" / "util.py", folder / "train.py"
                        )
            except files.WriteFailed:
                pass
            finally:
                files.check_writable = checked
            written += [f"{writer}:{p.name}" for p in escape.iterdir()]
        return written == [], f"written outside: {written}"

    def stdio_migration_stopped(how: str) -> tuple[bool, str]:
        src = root / f"r3-{how}"
        body = "".join(f"def f{i}(x):\n    return x.cuda() * {i}\n\n" for i in range(30))
        originals = {f"m{n:03}.py": f"import torch\n# file {n}\n\n{body}{'x' * 200_000} = 1\n" for n in range(300)}
        tree(src, originals)
        server = subprocess.Popen([str(BIN), "mcp", "--root", str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip

        def send(message: dict) -> None:
            server.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
            server.stdin.flush()

        def answer(request_id: int) -> dict:
            while True:
                message = json.loads(server.stdout.readline())
                if message.get("id") == request_id:
                    return message

        try:
            params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}
            send({"id": 1, "method": "initialize", "params": params})
            answer(1)
            send({"method": "notifications/initialized"})
            arguments = {"src": src.name, "in_place": True, "jobs": 1}
            send({"id": 2, "method": "tools/call", "params": {"name": "migrate_repo", "arguments": arguments}})
            deadline = time.monotonic() + 600
            while not any(src.glob("*.xlaport.bak")) and time.monotonic() < deadline:
                time.sleep(0.1)
            if how == "cancel":
                send({"method": "notifications/cancelled", "params": {"requestId": 2}})
                send(
                    {
                        "id": 3,
                        "method": "tools/call",
                        "params": {"name": "explain_fix", "arguments": {"code": "XLA201"}},
                    }
                )
                answer(3)
            else:
                server.stdin.close()
                server.wait(60)
        finally:
            if server.poll() is None:
                server.kill()
        time.sleep(2)
        written, bad = 0, []
        for name, original in originals.items():
            text, backup = (src / name).read_text(), src / f"{name}.xlaport.bak"
            if backup.exists():
                written += 1
                if backup.read_text() != original or "torch_xla" not in text:
                    bad.append(name)
            elif text != original:
                bad.append(name)
        stray = [p.name for p in src.iterdir() if p.name not in originals and not p.name.endswith(".xlaport.bak")]
        ok = not bad and not stray and 0 < written < len(originals)
        return ok, f"{written} of {len(originals)} written (each with its backup), broken {bad[:3]}, stray {stray[:3]}"

    if not quick:

        @case("R3", "MCP stdio: a plain in-place migrate_repo cancelled while it writes stops between files")
        def _():
            return stdio_migration_stopped("cancel")

        @case("R3", "MCP stdio: a plain in-place migrate_repo whose client closes stdin stops between files")
        def _():
            return stdio_migration_stopped("eof")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="xlaport-campaign-"))
    start = time.monotonic()
    try:
        campaign(base, args.quick)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    handled = sum(c.handled for c in CASES)
    lines = [f"{'ok ' if c.handled else 'BAD'} {c.item:9} {c.what}: {c.detail}" for c in CASES]
    summary = (
        f"cases {len(CASES)}, handled {handled}, not handled {len(CASES) - handled} ({time.monotonic() - start:.0f} s)"
    )
    print(summary)
    if args.out:
        args.out.write_text("\n".join([summary, *lines]) + "\n")


if __name__ == "__main__":
    main()
