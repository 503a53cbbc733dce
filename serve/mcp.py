"""The agent tool: an MCP server whose tools call the same `Pipeline` as the CLI and the HTTP service.

Tools: `suggest_patch`, `search_fixes`, `check_xla`, `explain_fix`, `migrate_repo`, `verify_migration`.

What a caller may do is the server's `Access`: tools that run code (`check_xla`, `verify_migration`, validation in
`suggest_patch` / `migrate_repo`) need `execute`, and run only in the execution check's sandboxed child; tools that
write files (`migrate_repo`) need `write`. Over stdio, where the agent already acts for the local user, both are
on by default; over HTTP both are off unless the server was started with `--exec` / `--write`, and every request
must carry the server's token (`XLAPORT_TOKEN`, as for the HTTP service). Every path a tool reads or writes is
resolved (links included) and must lie inside the allowed root (`--root`, default the current folder); a
migration's every write is checked again where the file is written (`xlaport.files.writes_confined_to`).
"""

from __future__ import annotations

import hmac
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field
from xlaport.eval.sandbox import SANDBOX_USER, hidden_from_sandbox
from xlaport.kb.hits import FixHit

from xlaport.files import DirtyTree
from xlaport.targets import DEFAULT_TARGET, Target

from .results import CheckOutcome, FixEntry, MigrateOptions, Patch, SuggestOptions, VerifyOutcome

if TYPE_CHECKING:
    from .pipeline import Pipeline

FIX_TIME_LIMIT_S = 60.0  # a suggestion's fix step is stopped past this (the tool answers with the reason)
INSTRUCTIONS = (
    "xlaport moves CUDA-era PyTorch code to TPUs (PyTorch/XLA 2.9). suggest_patch rewrites one file and "
    "returns a diff with evidence; search_fixes finds kb entries for code or an error message; explain_fix "
    "shows one entry; check_xla runs a script under the XLA execution check; migrate_repo migrates a tree; "
    "verify_migration grades a migrated tree against a reference run of the original (L0-L4)."
)


TOKEN_ENV = "XLAPORT_TOKEN"
POLL_S = 0.2  # how often a stoppable call is looked at: the delay its result may wait
T = TypeVar("T")
# the bounds the HTTP service and the CLI put on the same arguments
Timeout = Annotated[float, Field(gt=0, le=3600, description="Seconds the run may take.")]
SuggestK = Annotated[int, Field(ge=0, le=20, description="Fixes retrieved per finding left for a human.")]
SearchK = Annotated[int, Field(ge=1, le=50, description="How many entries.")]
Jobs = Annotated[int | None, Field(ge=1, le=64, description="Worker processes; None: one per core for 8+ files.")]


@dataclass(frozen=True)
class Access:
    """What callers of this server may do: run code, write files, and where (`root`, resolved)."""

    root: Path
    execute: bool
    write: bool

    def path(self, given: str) -> Path:
        """`given` (relative to the root) resolved, links included; ToolError when that is outside the root."""
        resolved = Path(os.path.realpath(self.root / given))
        if not resolved.is_relative_to(self.root):
            raise ToolError(f"{given}: outside the folder this server may use ({self.root}; see --root)")
        return resolved

    def need(self, execute: bool = False, write: bool = False, tool: str = "") -> None:
        if execute and not self.execute:
            raise ToolError(f"this server does not run code (start it with --exec to allow {tool})")
        if write and not self.write:
            raise ToolError(f"this server does not write files (start it with --write to allow {tool})")


@contextmanager
def _as_tool_errors() -> Iterator[None]:
    """Bad input becomes a ToolError: the agent sees the message (other exceptions are crashes)."""
    try:
        yield
    except KeyError as exc:
        raise ToolError(str(exc.args[0]) if exc.args else "not found") from None
    except (ValueError, OSError, DirtyTree) as exc:  # SourceError is a ValueError, WriteFailed an OSError
        raise ToolError(str(exc)) from None


def get_pipeline() -> Pipeline:
    """The process-wide pipeline. Imported on first use: it loads libcst, every rule and the sandbox, seconds a
    starting server need not spend before it answers `initialize` (run_server loads it in the background)."""
    from .pipeline import get_pipeline as process_pipeline

    return process_pipeline()


def _warm_up() -> None:
    get_pipeline().warm_up()


def create_server(
    pipeline: Pipeline | None = None,
    allow_execution: bool = True,
    allow_writes: bool = True,
    root: Path | None = None,
) -> MCPServer:
    """The MCP server; `root` (default: the current folder) bounds every path a tool is given."""
    server = MCPServer("xlaport", instructions=INSTRUCTIONS)
    access = Access(Path(os.path.realpath(root or Path.cwd())), allow_execution, allow_writes)

    def pipe() -> Pipeline:
        return pipeline or get_pipeline()

    @server.tool()
    async def suggest_patch(
        source: str,
        path: str | None = None,
        unsafe_fixes: bool = False,
        validate: bool = False,
        args: list[str] | None = None,
        k: SuggestK = 3,
        target: Target = DEFAULT_TARGET,
    ) -> Patch:
        """Migrate one Python file's text: unified diff, fixes applied, findings left with related fixes,
        and evidence (validated only when `validate` is set and execution is allowed)."""
        with _as_tool_errors():
            options = SuggestOptions(
                unsafe_fixes=unsafe_fixes, validate_patch=validate, args=args or [], k=k, target=target
            )
            if validate and access.execute:  # runs the program: stoppable
                return await _stoppable(_suggest_validated, source, path, options)
            # the fix step runs in a killable worker process (serve/isolated.py), as for the HTTP service
            return await anyio.to_thread.run_sync(
                lambda: pipe().suggest(
                    source, path, options, may_execute=access.execute, fix_time_limit_s=FIX_TIME_LIMIT_S
                )
            )

    @server.tool()
    def search_fixes(text: str, k: SearchK = 5) -> list[FixHit]:
        """The knowledge-base fixes closest to a code snippet, a finding, or an error message / log excerpt."""
        with _as_tool_errors():
            return pipe().search(text, k)

    @server.tool()
    def explain_fix(code: str) -> FixEntry:
        """One knowledge-base entry in full (what it detects, why, example, fix safety), e.g. code XLA201."""
        with _as_tool_errors():
            return pipe().explain(code)

    @server.tool()
    async def check_xla(
        script_path: str | None = None,
        source: str | None = None,
        args: list[str] | None = None,
        timeout_s: Timeout = 300.0,
    ) -> CheckOutcome:
        """Run a script (a path, or its source) under the XLA execution check: level reached and reasons."""
        access.need(execute=True, tool="check_xla")
        path = access.path(script_path) if script_path else None
        with _as_tool_errors():
            return await _stoppable(_check, source, path, args or [], timeout_s)

    @server.tool()
    async def migrate_repo(
        src: str,
        dst: str | None = None,
        validate_cmd: str | None = None,
        verify_cmd: str | None = None,
        unsafe_fixes: bool = False,
        jobs: Jobs = None,
        in_place: bool = False,
        force: bool = False,
        target: Target = DEFAULT_TARGET,
    ) -> dict[str, Any]:
        """Migrate a whole tree into `dst` (or in place): summary, validation and verify verdicts, report paths.
        `validate_cmd` / `verify_cmd`: e.g. "python train.py --steps 20"; the same command runs the program once."""
        access.need(write=True, tool="migrate_repo")
        source, destination = access.path(src), access.path(dst) if dst else None
        with _as_tool_errors():
            options = MigrateOptions(
                unsafe_fixes=unsafe_fixes,
                jobs=jobs,
                validate_cmd=validate_cmd,
                verify_cmd=verify_cmd,
                in_place=in_place,
                force=force,
                target=target,
            )
            if access.execute and (validate_cmd or verify_cmd):
                _refuse_hidden(source)
            # in a process of its own, as every long call: a cancelled or abandoned call stops writing
            return await _stoppable(_migrate, source, destination, options, access.execute, write_root=access.root)

    @server.tool()
    async def verify_migration(original_dir: str, migrated_dir: str, command: str) -> VerifyOutcome:
        """Grade a migrated tree against a reference run of the original (L0-L4: runs, numerics, on the XLA
        device, the goal, speed), e.g. command "python train.py --steps 40"."""
        access.need(execute=True, tool="verify_migration")
        original, migrated = access.path(original_dir), access.path(migrated_dir)
        with _as_tool_errors():
            _refuse_hidden(original, migrated)
            return await _stoppable(_verify, original, migrated, command)

    return server


# The tools that run a program run it in a StoppableCall (serve/isolated.py): a thread cannot be stopped, and the
# SDK cancels a tool's task when the client cancels the call or closes its end of stdio; the process, and the
# sandboxed run it started, are killed then. The work is done by the process-wide pipeline of that child.
async def _stoppable(function: Callable[..., T], *args: Any, write_root: Path | None = None) -> T:
    from .isolated import StoppableCall  # the kb engine and every rule: see get_pipeline

    call = StoppableCall(function, args, write_root)
    try:
        while not call.done():
            await anyio.sleep(POLL_S)
        return call.result()  # type: ignore[return-value]
    finally:
        call.stop()


def _refuse_hidden(*folders: Path) -> None:
    """A run copies a tree into the sandbox user's scratch, where all of it becomes readable: for a client of
    this server (never the user who could read the files anyway) a tree with anything the sandbox user could
    not read on its own is refused, naming the path and its mode, never its content (as check_xla does)."""
    if not all(folder.is_dir() for folder in folders):
        return  # the pipeline says which is not a folder
    for folder in folders:
        if hidden := hidden_from_sandbox(folder):
            raise ValueError(
                f"the sandbox user {SANDBOX_USER} cannot read {hidden}, and a tool call never shows a run what "
                "that user could not read. Make the tree readable to other users (chmod -R o+rX), or run the "
                "verification yourself on this machine"
            )


def _check(source: str | None, path: Path | None, args: list[str], timeout_s: float) -> CheckOutcome:
    return get_pipeline().check(source=source, path=path, args=args, timeout_s=timeout_s)


def _verify(original: Path, migrated: Path, command: str) -> VerifyOutcome:
    return get_pipeline().verify(original, migrated, command)


def _migrate(src: Path, dst: Path | None, options: MigrateOptions, may_execute: bool) -> dict[str, Any]:
    return get_pipeline().migrate(src, dst, options, may_execute=may_execute).summary()


def _suggest_validated(source: str, path: str | None, options: SuggestOptions) -> Patch:
    return get_pipeline().suggest(source, path, options, may_execute=True, fix_time_limit_s=FIX_TIME_LIMIT_S)


class BearerToken:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <token>` (compared in constant time);
    401 otherwise. Host/Origin checks keep browsers out, not the other processes of the machine."""

    def __init__(self, app, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("latin-1"), self.token):
                body = json.dumps({"error": "unauthorized: send `Authorization: Bearer <XLAPORT_TOKEN>`"}).encode()
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def http_app(server: MCPServer, token: str, host: str = "127.0.0.1"):
    """The streamable-HTTP ASGI app of `server`, behind the token."""
    return BearerToken(server.streamable_http_app(host=host), token)


class StartRefused(RuntimeError):
    """The server was asked for an unsafe combination of options: the reason and the fix."""


def run_server(
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    allow_execution: bool | None = None,
    allow_writes: bool | None = None,
    root: Path | None = None,
    unauthenticated_read_only: bool = False,
) -> None:
    """Serves over stdio or streamable HTTP; loads the index before the first call.

    Over HTTP the server needs `$XLAPORT_TOKEN` (StartRefused without it), unless `unauthenticated_read_only`:
    then any local process may call it, and nothing runs code or writes files.
    """
    token = os.environ.get(TOKEN_ENV) or None
    if transport == "stdio":
        execute, write = allow_execution is not False, allow_writes is not False
    else:
        execute, write = bool(allow_execution), bool(allow_writes)
        if token is None and not unauthenticated_read_only:
            raise StartRefused(
                f"the MCP server over HTTP needs a token: set {TOKEN_ENV} (clients send `Authorization: Bearer "
                "<token>`), or pass --unauthenticated-read-only for a local server whose tools run no code and "
                "write no files"
            )
        if token is None and (execute or write):
            raise StartRefused("--unauthenticated-read-only cannot be combined with --exec or --write")
    # the pipeline (libcst, the rules, a fix worker, the index) loads beside the session, not before it:
    # a client waits for `initialize` and may give up (it took 10-13 s); a tool called meanwhile waits for it
    threading.Thread(target=_warm_up, name="xlaport-warm-up", daemon=True).start()
    server = create_server(None, execute, write, root)
    if transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app(host=host) if token is None else http_app(server, token, host)
    uvicorn.run(app, host=host, port=port)
