"""The agent tool: an MCP server whose tools call the same `Pipeline` as the CLI and the HTTP service.

Tools: `suggest_patch`, `search_fixes`, `check_xla`, `explain_fix`, `migrate_repo`, `verify_migration`,
`optimize_migration`.

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
from xlaport.eval.sandbox import SANDBOX_USER, file_hidden_from_sandbox, hidden_from_sandbox
from xlaport.kb.hits import FixHit
from xlaport.kb.lint_config import find_config

from xlaport.files import DirtyTree, NotInside, UnreadableSource, read_bytes_inside
from xlaport.targets import DEFAULT_TARGET, Target

from .project import ProjectError, ProjectSource, ProjectTooLarge, local_project
from .results import CheckOutcome, FixEntry, MigrateOptions, Patch, SuggestOptions, VerifyOutcome
from .wording import api_wording, in_api_wording

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


def optional_text(description: str) -> Any:
    """An optional string argument (a path, a text, a command) with what it is for, as the client sees it."""
    return Annotated[str | None, Field(description=description)]


# The tools' arguments, each declared once. The bounds are those the HTTP service and the CLI put on the same
# arguments; every parameter says what it is for.
Timeout = Annotated[
    float, Field(gt=0, le=3600, description="Seconds the program's run may take (0 < t <= 3600). Default 300.")
]
SuggestK = Annotated[
    int,
    Field(ge=0, le=20, description="Knowledge-base fixes retrieved per finding left for a human (0-20). Default 3."),
]
SearchK = Annotated[int, Field(ge=1, le=50, description="How many entries to return (1-50). Default 5.")]
Jobs = Annotated[
    int | None,
    Field(ge=1, le=64, description="Worker processes (1-64). Default: one per core for 8+ files, else one."),
]
UnsafeFixes = Annotated[
    bool,
    Field(description="Also apply fixes that may change behaviour (listed as unsafe in the kb). Default false."),
]
TargetArg = Annotated[
    Target,
    Field(description='The backend to migrate to: "torch_xla" (PyTorch/XLA 2.9) or "torch_tpu". Default torch_xla.'),
]
Args = Annotated[list[str] | None, Field(description='Arguments of the script, e.g. ["--epochs", "1"]. Default none.')]
# project_root, path, source, cwd and command mean one thing in suggest_patch (the file to migrate and the project
# it is validated in), another in check_xla (a script run in a project) and in verify_migration (the migrated file
# of a project): one alias per meaning
SuggestProjectRoot = optional_text(
    "The project's folder, relative to the server's root (or absolute inside it): the file is validated "
    "in a private copy of it, where its sibling modules and data are. Default: the file alone."
)
SuggestCwd = optional_text(
    'The folder the program is run from, relative to project_root (e.g. "tutorials/mnist"), as the user '
    "would `cd` there. Default: the project's root."
)
SuggestCommand = optional_text(
    'The command validation runs, as typed in cwd, e.g. "python train.py --epochs 1" (its script may be '
    "another file that uses this one). Default: the file's own entry point with args; a module without "
    "one is validated by generated tests of its functions and classes."
)

SuggestSource = optional_text("The Python file's text. Default: read from project_root/path.")
SuggestPath = optional_text(
    'The file\'s path, relative to project_root when one is given (e.g. "train.py"); shown in the diff. '
    "Default: snippet.py."
)
ScriptPath = optional_text(
    "The script to run, relative to the server's root (or absolute inside it). Give this or source."
)
ScriptSource = optional_text("The script's text, run in a private folder (or at path inside project_root).")
ScriptCwd = optional_text(
    'The folder the script is run from (relative paths like "data/" are read there), relative to the '
    "server's root, or to project_root when given. Default: the script's folder."
)
ScriptProjectRoot = optional_text(
    "With source: the project to run it in (a private copy, the text written at path). Default none."
)
ScriptPathInProject = optional_text('With project_root: the script\'s path in the project, e.g. "train.py".')
ScriptCommand = optional_text(
    'With project_root: the command to run instead of path, as typed in cwd (e.g. "python main.py '
    '--epochs 1"); the text of path (source) is still written into the copy. Default none.'
)
VerifyCommand = Annotated[
    str,
    Field(
        description="The training command run in both trees, as typed in cwd, e.g. "
        '"python train.py --steps 40" (enough steps for a loss curve: 20 or more).'
    ),
]
VerifyCwd = optional_text(
    "The folder of both trees the command is run from, relative to their roots. Default: their roots."
)
VerifyProjectRoot = optional_text(
    "Instead of two trees: the original project's folder, relative to the server's root; both runs use a "
    "private copy of it, the migrated one with source written at path (a patch suggest_patch returned, "
    "before it is applied). Default none."
)
VerifyPath = optional_text('With project_root: the migrated file\'s path in it, e.g. "train.py".')
VerifySource = optional_text("With project_root: the migrated text of path (the patch's `migrated`).")


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
            raise tool_error(
                "outside_root",
                f"{given}: outside the folder this server may use ({self.root})",
                f"give a path inside {self.root} (relative paths are resolved there)",
            )
        return resolved

    def need(self, execute: bool = False, write: bool = False, tool: str = "") -> None:
        if execute and not self.execute:
            raise tool_error(
                "not_allowed",
                f"this server does not run code, which {tool} needs",
                "ask the user to start the xlaport MCP server with code execution allowed, or call the tool "
                "without running code (suggest_patch with validate false)",
            )
        if write and not self.write:
            raise tool_error(
                "not_allowed",
                f"this server does not write files, which {tool} needs",
                "ask the user to start the xlaport MCP server with file writes allowed",
            )


def tool_error(code: str, message: str, next_step: str) -> ToolError:
    """A tool error an agent can act on: its text is a JSON object {"code", "message", "next_step"}."""
    return ToolError(json.dumps({"code": code, "message": api_wording(message), "next_step": next_step}))


# what each kind of failure means for the caller: (code, next step)
_NEXT_STEPS: list[tuple[type[BaseException], str, str]] = [
    (ProjectTooLarge, "project_too_large", "give the program's own folder as project_root, with large data outside"),
    (ProjectError, "bad_project", "correct project_root, path or cwd as the message says and call again"),
    (DirtyTree, "dirty_tree", "commit or stash the user's changes first, or pass force true to keep backups"),
    (TimeoutError, "timeout", "give a larger timeout_s, fewer steps in args or command, or a smaller input"),
    (OSError, "file_error", "check that the path exists and may be read (or written) by the server"),
    (ValueError, "bad_input", "correct the argument the message names and call again"),
]


@contextmanager
def _as_tool_errors() -> Iterator[None]:
    """Bad input becomes a structured ToolError (code, message, next step); other exceptions are crashes."""
    try:
        yield
    except ToolError:
        raise
    except KeyError as exc:
        message = str(exc.args[0]) if exc.args else "not found"
        raise tool_error("not_found", message, "search_fixes lists the knowledge base's codes") from None
    except (ValueError, OSError, DirtyTree) as exc:  # SourceError is a ValueError, WriteFailed an OSError
        code, step = next((c, n) for kind, c, n in _NEXT_STEPS if isinstance(exc, kind))
        if type(exc).__name__ == "SourceError":  # kb's parse error (its module loads libcst: not at start-up)
            code, step = "cannot_parse", "send the file's complete Python text (it must parse with Python 3)"
        raise tool_error(code, str(exc), step) from None


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
    max_runs: int | None = None,
) -> MCPServer:
    """The MCP server; `root` (default: the current folder) bounds every path a tool is given; `max_runs` long
    calls at once (default: one per core)."""
    server = MCPServer("xlaport", instructions=INSTRUCTIONS)
    access = Access(Path(os.path.realpath(root or Path.cwd())), allow_execution, allow_writes)
    runs = RunLimit(max_runs or os.cpu_count() or 1)

    def pipe() -> Pipeline:
        return pipeline or get_pipeline()

    @server.tool()
    async def suggest_patch(
        source: SuggestSource = None,
        path: SuggestPath = None,
        unsafe_fixes: UnsafeFixes = False,
        validate: Annotated[
            bool,
            Field(
                description="Run the patched file in its project (XLA execution check and generated "
                "original-vs-migrated tests) before calling it validated; needs code execution. Default false."
            ),
        ] = False,
        args: Args = None,
        k: SuggestK = 3,
        target: TargetArg = DEFAULT_TARGET,
        project_root: SuggestProjectRoot = None,
        cwd: SuggestCwd = None,
        command: SuggestCommand = None,
        timeout_s: Timeout = 300.0,
    ) -> Patch:
        """Migrate one Python file to PyTorch/XLA: unified diff, the fixes applied, the findings left for a human
        (with related fixes, lines in the original file's numbering), and evidence: "validated" only when
        `validate` is set and every check ran and passed in the file's project; "unvalidated" says why and what
        to send."""
        with _as_tool_errors():
            project = local_project(access.path(project_root)) if project_root else None
            if project is not None and validate and access.execute:
                _refuse_hidden(access.root, project.folder)  # its copy is what the run sees
            if source is None:
                if project is None or path is None:
                    raise tool_error(
                        "bad_input",
                        "no source: give the file's text as source, or project_root and path to read it there",
                        "call again with source, or with project_root and path",
                    )
                source = _read_text(access.path(str(Path(project_root) / path)), access.root)
            options = SuggestOptions(
                unsafe_fixes=unsafe_fixes,
                validate_patch=validate,
                args=args or [],
                k=k,
                target=target,
                command=command,
                cwd=cwd,
                timeout_s=timeout_s,
            )
            if validate and access.execute:  # runs the program: stoppable
                patch = await runs.call(_suggest_validated, source, path, options, project)
            else:
                # the fix step runs in a killable worker process (serve/isolated.py), as for the HTTP service
                patch = await anyio.to_thread.run_sync(
                    lambda: pipe().suggest(
                        source,
                        path,
                        options,
                        may_execute=access.execute,
                        fix_time_limit_s=FIX_TIME_LIMIT_S,
                        project=project,
                    )
                )
            return in_api_wording(patch)

    @server.tool()
    def search_fixes(
        text: Annotated[str, Field(description="A code snippet, a finding, or a pasted error message / log excerpt.")],
        k: SearchK = 5,
    ) -> list[FixHit]:
        """The knowledge-base fixes closest to a code snippet, a finding, or an error message / log excerpt,
        best first (code, title, score)."""
        with _as_tool_errors():
            return pipe().search(text, k)

    @server.tool()
    def explain_fix(
        code: Annotated[str, Field(description='A knowledge-base code, e.g. "XLA201" (search_fixes finds them).')],
    ) -> FixEntry:
        """One knowledge-base entry in full (what it detects, why, example, fix safety), e.g. code XLA201."""
        with _as_tool_errors():
            return pipe().explain(code)

    @server.tool()
    async def check_xla(
        script_path: ScriptPath = None,
        source: ScriptSource = None,
        args: Args = None,
        timeout_s: Timeout = 300.0,
        cwd: ScriptCwd = None,
        project_root: ScriptProjectRoot = None,
        path: ScriptPathInProject = None,
        command: ScriptCommand = None,
    ) -> CheckOutcome:
        """Run a script under the XLA execution check (sandboxed, the user's files never written): the level
        reached (L2: ran on the XLA device with step barriers, no recompilation, no CPU fallback) and the reasons,
        each naming the exception, its message and the user's failing line."""
        access.need(execute=True, tool="check_xla")
        with _as_tool_errors():
            if project_root or (source is not None and path):
                project = local_project(access.path(project_root or "."))
                _refuse_hidden(access.root, project.folder)  # its copy is what the run sees
                call = (_check_in_project, project, source, path, args or [], cwd, command, timeout_s)
                return in_api_wording(await runs.call(*call))
            script = access.path(script_path) if script_path else None
            workdir = access.path(cwd) if cwd else (script.parent if script else None)
            # the script's own mode is the sandbox's to judge (a run refused says why); the folders on the way
            # are mounted back past what the sandbox user could enter
            _refuse_hidden(access.root, *[f for f in (workdir, script and script.parent) if f], trees=False)
            return in_api_wording(await runs.call(_check, source, script, args or [], timeout_s, workdir))

    @server.tool()
    async def migrate_repo(
        src: Annotated[str, Field(description="The tree to migrate, relative to the server's root.")],
        dst: Annotated[
            str | None,
            Field(description="Where the migrated copy is written (a new or empty folder). Needed unless in_place."),
        ] = None,
        validate_cmd: Annotated[
            str | None,
            Field(
                description="Validate the migrated tree with this command, run from its root, e.g. "
                '"python train.py --steps 20" (execution check + generated tests). Default: no validation.'
            ),
        ] = None,
        verify_cmd: Annotated[
            str | None,
            Field(
                description="Grade the migration against a run of the original with this command (L0-L4); "
                "the same command as validate_cmd runs the program once. Default: no verify."
            ),
        ] = None,
        unsafe_fixes: UnsafeFixes = False,
        jobs: Jobs = None,
        in_place: Annotated[
            bool,
            Field(
                description="Rewrite the files of src itself (git-clean files, or with .xlaport.bak backups); "
                "not written when validation or verify rejects the migration. Default false."
            ),
        ] = False,
        force: Annotated[
            bool,
            Field(
                description="Overwrite a non-empty dst, or rewrite files with uncommitted changes in place "
                "(keeping backups). Default false."
            ),
        ] = False,
        target: TargetArg = DEFAULT_TARGET,
    ) -> dict[str, Any]:
        """Migrate a whole tree into `dst` (or in place): summary (files changed, fixes applied, what is left for
        a human with file:line in the original files), validation and verify verdicts, report paths."""
        access.need(write=True, tool="migrate_repo")
        source, destination = access.path(src), access.path(dst) if dst else None
        with _as_tool_errors():
            config = _config_within(source, access.root)
            options = MigrateOptions(
                unsafe_fixes=unsafe_fixes,
                jobs=jobs,
                validate_cmd=validate_cmd,
                verify_cmd=verify_cmd,
                in_place=in_place,
                force=force,
                target=target,
                config=str(config) if config else None,
                isolated=config is None,
            )
            if access.execute and (validate_cmd or verify_cmd):
                _refuse_hidden(access.root, source)
            # in a process of its own, as every long call: a cancelled or abandoned call stops writing
            call = (_migrate, source, destination, options, access.execute)
            return in_api_wording(await runs.call(*call, write_root=access.root))

    @server.tool()
    async def verify_migration(
        command: VerifyCommand,
        original_dir: Annotated[
            str | None,
            Field(
                description="The original (CUDA) tree, relative to the server's root. Give this and migrated_dir, "
                "or project_root, path and source."
            ),
        ] = None,
        migrated_dir: Annotated[
            str | None, Field(description="The migrated tree, relative to the server's root.")
        ] = None,
        cwd: VerifyCwd = None,
        project_root: VerifyProjectRoot = None,
        path: VerifyPath = None,
        source: VerifySource = None,
        loss_pattern: Annotated[
            str | None,
            Field(
                description="A regular expression with a `value` group that finds the loss in the program's "
                'output, when verify reports that it found none (e.g. "Loss (?P<value>[0-9.]+)"). Default: the '
                "common formats (loss: x, loss_train: x, train_loss=x, JSON lines ...), or the project's xlaport.toml."
            ),
        ] = None,
        migrated_args: Annotated[
            list[str] | None,
            Field(
                description='Arguments added to the migrated run only, e.g. ["--device", "xla"] where the '
                "program takes its device from the command line (a finding says so). Default none."
            ),
        ] = None,
    ) -> VerifyOutcome:
        """Grade a migrated tree against a reference run of the original (L0-L4: runs, numerics, on the XLA
        device, the goal, speed): pass / fail / inconclusive, with reasons and what would decide."""
        access.need(execute=True, tool="verify_migration")
        with _as_tool_errors():
            if project_root is not None:
                if path is None or source is None:
                    raise ProjectError("with project_root, give path (the migrated file in it) and source (its text)")
                project = local_project(access.path(project_root))
                _refuse_hidden(access.root, project.folder)  # its copies are what the runs see
                call = (_verify_in_project, project, path, source, command, cwd, loss_pattern, migrated_args)
                return in_api_wording(await _stoppable(*call))
            if original_dir is None or migrated_dir is None:
                raise ProjectError("give original_dir and migrated_dir, or project_root, path and source")
            original, migrated = access.path(original_dir), access.path(migrated_dir)
            _refuse_hidden(access.root, original, migrated)
            call = (_verify, original, migrated, command, cwd, loss_pattern, migrated_args)
            return in_api_wording(await runs.call(*call))

    @server.tool()
    async def optimize_migration(
        migrated_dir: Annotated[
            str, Field(description="The migrated tree to optimize (its check must reach L2), inside the server's root.")
        ],
        validate_cmd: Annotated[
            str | None,
            Field(
                description='The command each candidate is checked with, as typed in the tree, e.g. "python '
                'train.py --steps 20". Default none: candidates are only proposed (a diff each).'
            ),
        ] = None,
        verify_cmd: Annotated[
            str | None,
            Field(
                description="The command verify runs to hold each candidate's curve against the original's (one "
                "reference run; it also stands for validate_cmd when that is not given). Default none: no curve "
                "is compared."
            ),
        ] = None,
        original_dir: Annotated[
            str | None,
            Field(description="The original (CUDA) tree verify compares with. Default: the one the migration names."),
        ] = None,
    ) -> dict[str, Any]:
        """Performance rewrites of a migrated tree (per-step logging reads, GradScaler+float16, growing
        generation, host input pipelines), each kept only when the check and verify show a cheaper step with the
        same curve. Without a command (or when this server may not run code) it only proposes; kept candidates are
        written only when it may write files."""
        migrated = access.path(migrated_dir)
        original = access.path(original_dir) if original_dir else None
        with _as_tool_errors():
            if access.execute and (validate_cmd or verify_cmd):
                _refuse_hidden(access.root, *[f for f in (migrated, original) if f is not None])
            return await runs.call(
                _optimize, migrated, validate_cmd, verify_cmd, original, access.execute, access.write,
                write_root=access.root if access.write else None,
            )  # fmt: skip

    return server


# The tools that run a program run it in a StoppableCall (serve/isolated.py): a thread cannot be stopped, and the
# SDK cancels a tool's task when the client cancels the call or closes its end of stdio; the process, and the
# sandboxed run it started, are killed then. The work is done by the process-wide pipeline of that child.
class RunLimit:
    """Long calls (a validated suggestion, check, migrate, verify, optimize) in progress: at most `limit` at once.
    Each is a process of its own and may start a sandboxed program of up to 4 GB; the holders of an HTTP server's
    token are one client, and could otherwise start runs without bound. One event loop counts: no lock needed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    async def call(self, function: Callable[..., T], *args: Any, write_root: Path | None = None) -> T:
        if self.active >= self.limit:
            raise tool_error(
                "busy",
                f"{self.active} long call(s) in progress; this server runs at most {self.limit} at once",
                "retry when one of the calls in progress has returned",
            )
        self.active += 1
        try:
            return await _stoppable(function, *args, write_root=write_root)
        finally:
            self.active -= 1


async def _stoppable(function: Callable[..., T], *args: Any, write_root: Path | None = None) -> T:
    from .isolated import StoppableCall  # the kb engine and every rule: see get_pipeline

    call = StoppableCall(function, args, write_root)
    try:
        while not call.done():
            await anyio.sleep(POLL_S)
        return call.result()  # type: ignore[return-value]
    finally:
        call.stop()


def _refuse_hidden(root: Path, *folders: Path, trees: bool = True) -> None:
    """A run shows the sandbox user what it could not read on its own: verify copies a tree into that user's
    scratch (all of it readable then), and every run mounts its folders back at their places past the folders
    above them. For a client of this server (never the user who could read the files anyway) a folder is refused
    when that user could not enter it or a folder between the server's root and it (the check suggest_patch
    makes of a file), or, for a tree that is copied (`trees`), read anything in it; the refusal names the path
    and its mode, never its content."""
    if not all(folder.is_dir() for folder in folders):
        return  # the pipeline says which is not a folder
    for folder in folders:
        hidden = file_hidden_from_sandbox(folder, root) or (hidden_from_sandbox(folder) if trees else None)
        if hidden:
            raise tool_error(
                "unreadable_to_sandbox",
                f"the sandbox user {SANDBOX_USER} cannot read {hidden}, and a tool call never shows a run what "
                "that user could not read",
                f"make it readable to other users (chmod -R o+rX on the tree, o+x on the folders above it up to "
                f"{root}) and call again, or run xlaport yourself on this machine (the CLI shows a run what you may "
                "read)",
            )


def _check(
    source: str | None, path: Path | None, args: list[str], timeout_s: float, workdir: Path | None
) -> CheckOutcome:
    return get_pipeline().check(source=source, path=path, args=args, timeout_s=timeout_s, workdir=workdir)


def _optimize(
    migrated: Path, validate_cmd: str | None, verify_cmd: str | None, original: Path | None, execute: bool, write: bool
) -> dict[str, Any]:
    return get_pipeline().optimize(migrated, validate_cmd, verify_cmd, original, may_execute=execute, write=write)


def _check_in_project(
    project: ProjectSource,
    source: str | None,
    path: str | None,
    args: list[str],
    cwd: str | None,
    command: str | None,
    timeout_s: float,
) -> CheckOutcome:
    return get_pipeline().check(
        source=source, args=args, timeout_s=timeout_s, project=project, rel_path=path, cwd=cwd, command=command
    )


def _verify(
    original: Path,
    migrated: Path,
    command: str,
    cwd: str | None = None,
    loss_pattern: str | None = None,
    migrated_args: list[str] | None = None,
) -> VerifyOutcome:
    return get_pipeline().verify(
        original, migrated, command, cwd=cwd, loss_pattern=loss_pattern, migrated_args=migrated_args
    )


def _verify_in_project(
    project: ProjectSource,
    path: str,
    source: str,
    command: str,
    cwd: str | None = None,
    loss_pattern: str | None = None,
    migrated_args: list[str] | None = None,
) -> VerifyOutcome:
    return get_pipeline().verify_in_project(
        project, {path: source}, command, cwd=cwd, loss_pattern=loss_pattern, migrated_args=migrated_args
    )


def _read_text(path: Path, root: Path) -> str:
    """The file `Access.path` checked, as it is when read: one swapped for a link since is refused, not followed;
    one the sandbox user could not read is refused as a run of it would be (its diff would show it)."""
    if not path.is_file():
        raise ProjectError(f"no such file in the project: {path}")
    if hidden := file_hidden_from_sandbox(path, root):
        raise ProjectError(
            f"the sandbox user {SANDBOX_USER} cannot read {hidden}, and a tool call shows no more than that user "
            "could read. Send the file's text as source, or make it readable to other users"
        )
    from xlaport.kb.parsing import max_source_bytes  # libcst: not at start-up

    try:
        return read_bytes_inside(path, root, max_source_bytes()).decode("utf-8", errors="replace")
    except (NotInside, UnreadableSource) as exc:
        raise ProjectError(str(exc)) from None


def _config_within(src: Path, root: Path) -> Path | None:
    """The lint configuration of `src` found no higher than the server's root: a pyproject.toml above it is not
    the caller's to read (nor to change what the migration does)."""
    return find_config(src if src.is_dir() else src.parent, within=root)


def _migrate(src: Path, dst: Path | None, options: MigrateOptions, may_execute: bool) -> dict[str, Any]:
    return get_pipeline().migrate(src, dst, options, may_execute=may_execute).summary()


def _suggest_validated(
    source: str, path: str | None, options: SuggestOptions, project: ProjectSource | None = None
) -> Patch:
    return get_pipeline().suggest(
        source, path, options, may_execute=True, fix_time_limit_s=FIX_TIME_LIMIT_S, project=project
    )


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
    max_runs: int | None = None,
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
    server = create_server(None, execute, write, root, max_runs)
    if transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app(host=host) if token is None else http_app(server, token, host)
    uvicorn.run(app, host=host, port=port, proxy_headers=False)  # a local process cannot pose as another host
