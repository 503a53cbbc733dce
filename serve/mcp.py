"""The agent tool: an MCP server whose tools call the same `Pipeline` as the CLI and the HTTP service.

Tools: `suggest_patch`, `search_fixes`, `check_xla`, `explain_fix`, `migrate_repo`, `verify_migration`.
Tools that run code (`check_xla`, `verify_migration`, validation in `suggest_patch` / `migrate_repo`) do so only in the execution check's
sandboxed child, and only when the server allows execution (on by default over stdio, where the agent
already acts for the local user; off by default over HTTP).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from xlaport.kb.retrieval import FixHit

from xlaport.files import DirtyTree

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


@contextmanager
def _as_tool_errors() -> Iterator[None]:
    """Bad input becomes a ToolError: the agent sees the message (other exceptions are crashes)."""
    try:
        yield
    except KeyError as exc:
        raise ToolError(str(exc.args[0]) if exc.args else "not found") from None
    except (ValueError, OSError, DirtyTree) as exc:  # SourceError is a ValueError
        raise ToolError(str(exc)) from None


def create_server(pipeline: Pipeline | None = None, allow_execution: bool = True) -> MCPServer:
    server = MCPServer("xlaport", instructions=INSTRUCTIONS)

    def pipe() -> Pipeline:
        # imported here: the pipeline loads libcst, every rule and the sandbox, seconds a starting
        # server need not spend before it answers `initialize` (run_server loads it in the background)
        from .pipeline import get_pipeline

        return pipeline or get_pipeline()

    @server.tool()
    def suggest_patch(
        source: str,
        path: str | None = None,
        unsafe_fixes: bool = False,
        validate: bool = False,
        args: list[str] | None = None,
        k: int = 3,
    ) -> Patch:
        """Migrate one Python file's text: unified diff, fixes applied, findings left with related fixes,
        and evidence (validated only when `validate` is set and execution is allowed)."""
        with _as_tool_errors():
            options = SuggestOptions(unsafe_fixes=unsafe_fixes, validate_patch=validate, args=args or [], k=k)
            # the fix step runs in a killable worker process (serve/isolated.py), as for the HTTP service
            return pipe().suggest(source, path, options, may_execute=allow_execution, fix_time_limit_s=FIX_TIME_LIMIT_S)

    @server.tool()
    def search_fixes(text: str, k: int = 5) -> list[FixHit]:
        """The knowledge-base fixes closest to a code snippet, a finding, or an error message / log excerpt."""
        with _as_tool_errors():
            return pipe().search(text, k)

    @server.tool()
    def explain_fix(code: str) -> FixEntry:
        """One knowledge-base entry in full (what it detects, why, example, fix safety), e.g. code XLA201."""
        with _as_tool_errors():
            return pipe().explain(code)

    @server.tool()
    def check_xla(
        script_path: str | None = None,
        source: str | None = None,
        args: list[str] | None = None,
        timeout_s: float = 300.0,
    ) -> CheckOutcome:
        """Run a script (a path, or its source) under the XLA execution check: level reached and reasons."""
        if not allow_execution:
            raise ToolError("this server does not run code (start it with --exec to allow check_xla)")
        with _as_tool_errors():
            path = Path(script_path) if script_path else None
            return pipe().check(source=source, path=path, args=args or [], timeout_s=timeout_s)

    @server.tool()
    def migrate_repo(
        src: str,
        dst: str | None = None,
        validate_cmd: str | None = None,
        verify_cmd: str | None = None,
        unsafe_fixes: bool = False,
        jobs: int | None = None,
        in_place: bool = False,
        force: bool = False,
    ) -> dict[str, Any]:
        """Migrate a whole tree into `dst` (or in place): summary, validation and verify verdicts, report paths.
        `validate_cmd` / `verify_cmd`: e.g. "python train.py --steps 20"; the same command runs the program once."""
        with _as_tool_errors():
            options = MigrateOptions(
                unsafe_fixes=unsafe_fixes,
                jobs=jobs,
                validate_cmd=validate_cmd,
                verify_cmd=verify_cmd,
                in_place=in_place,
                force=force,
            )
            result = pipe().migrate(Path(src), Path(dst) if dst else None, options, may_execute=allow_execution)
            return result.summary()

    @server.tool()
    def verify_migration(original_dir: str, migrated_dir: str, command: str) -> VerifyOutcome:
        """Grade a migrated tree against a reference run of the original (L0-L4: runs, numerics, on the XLA
        device, the goal, speed), e.g. command "python train.py --steps 40"."""
        if not allow_execution:
            raise ToolError("this server does not run code (start it with --exec to allow verify_migration)")
        with _as_tool_errors():
            return pipe().verify(Path(original_dir), Path(migrated_dir), command)

    return server


def run_server(
    transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765, allow_execution: bool | None = None
) -> None:
    """Serves over stdio or streamable HTTP; loads the index before the first call."""
    if allow_execution is None:
        allow_execution = transport == "stdio"
    # the pipeline (libcst, the rules, a fix worker, the index) loads beside the session, not before it:
    # a client waits for `initialize` and would time out (it took 10-13 s); a tool call meanwhile waits for it
    threading.Thread(target=_warm_up, name="xlaport-warm-up", daemon=True).start()
    server = create_server(None, allow_execution)
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=host, port=port)


def _warm_up() -> None:
    from .pipeline import get_pipeline

    get_pipeline().warm_up()
