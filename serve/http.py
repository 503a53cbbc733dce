"""The HTTP patch service (FastAPI; OpenAPI docs at /docs): a thin front over `Pipeline`.

Running submitted code (validation of a suggestion, `/v1/check`, `/v1/verify`) happens only in the sandboxed child
process of the execution check, and only when the server was started with a token (`XLAPORT_TOKEN`)
and the request carries it (`Authorization: Bearer …`). Without a server token `/v1/check` and
`/v1/verify` answer 403
and suggestions come back unvalidated, saying why. Requests are size-limited (413) and time-limited (504).
Search and the heavy endpoints (suggest, check, verify) have separate slots, `max_concurrency` each, so a search
never waits behind slow suggestions; one client (the holders of the token, or one address) holds at most
`per_client` of them (more: 429), so one client cannot hold every slot.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import shlex
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from xlaport.eval.sandbox import host_memory_mb, sandbox_status
from xlaport.kb.hits import FixHit

from .pipeline import Pipeline, get_pipeline
from .project import ProjectFiles, ProjectTooLarge, sent_project
from .results import CheckOutcome, FixEntry, Patch, SuggestOptions, VerifyOutcome, WholeInt
from .wording import in_api_wording

MAX_BODY_BYTES = 8_000_000  # a project sent with a file (serve/project.py) included
MAX_CONCURRENCY = 4  # requests at once, for search and for the heavy endpoints each
TIMEOUT_S = 60.0  # for requests that run no code; runs of code get their own limit plus this margin
_ENV_TOKEN = object()
T = TypeVar("T")


# request bodies are taken as typed: 0 is not false, "5" is not 5 (the OpenAPI document says so)
STRICT = ConfigDict(strict=True)


class SuggestRequest(BaseModel):
    model_config = STRICT
    source: str = Field(description="The Python file's text.")
    path: str | None = Field(
        None,
        description="Its path, relative to the project's root when `project` is sent (shown in the diff; where "
        "validation writes the file).",
    )
    options: SuggestOptions = SuggestOptions()
    project: ProjectFiles | None = Field(
        None,
        description="The project the file lives in (its sibling modules, configs, small data), so that validation "
        "runs the file where it really runs: `options.command` from `options.cwd`, else the file's own entry "
        "point. Over the bounds: 413; a bad path or archive: 422. Without it the file is validated alone, and a "
        "run that misses its context is reported unvalidated, saying what to send.",
    )


class SearchRequest(BaseModel):
    model_config = STRICT
    text: str = Field(min_length=1, description="Code, a finding, or an error message / log excerpt.")
    k: WholeInt = Field(5, ge=1, le=50)


class CheckRequest(BaseModel):
    model_config = STRICT
    source: str | None = Field(
        None, description="The script to run under the XLA execution check (with `project`: optional, its text there)."
    )
    args: list[str] = Field([], description="The script's arguments, e.g. ['--epochs', '1'].")
    timeout_s: float = Field(300.0, gt=0, le=3600, description="Seconds the run may take.")
    memory_mb: WholeInt = Field(4096, ge=256, le=65536, description="Memory limit of the run, in MiB.")
    path: str | None = Field(None, description="With `project`: the script's path in it, e.g. 'train.py'.")
    project: ProjectFiles | None = Field(
        None, description="The project the script runs in (as for /v1/suggest); the run sees a private copy of it."
    )
    cwd: str | None = Field(None, description='With `project`: the folder the script is run from (default ".").')
    command: str | None = Field(
        None, description="With `project`: the command to run instead, as typed in `cwd` (e.g. 'python main.py')."
    )


class VerifyRequest(BaseModel):
    model_config = STRICT
    original: str | None = Field(
        None,
        description="The original (CUDA) script's text: the reference run. With `project`: optional, the text of "
        "`path` in the original (default: the project's file as sent).",
    )
    migrated: str = Field(description="The migrated script's text (with `project`: the migrated text of `path`).")
    name: str = Field("train.py", description="The script's file name (both are run under it); not with `project`.")
    args: list[str] = Field([], description="Arguments of the script, e.g. ['--steps', '40']; not with `project`.")
    timeout_s: float = Field(1800.0, gt=0, le=7200, description="How long the request may take in all.")
    project: ProjectFiles | None = Field(
        None,
        description="The original project (as for /v1/suggest): both runs use a private copy of it, the migrated "
        "one with `migrated` at `path` (and `migrated_files`).",
    )
    path: str | None = Field(None, description="With `project`: the migrated file's path in it, e.g. 'train.py'.")
    migrated_files: dict[str, str] = Field(
        {}, description="With `project`: further migrated files, relative path -> text (a migration of several)."
    )
    command: str | None = Field(
        None,
        description="With `project`: the training command run in both copies, as typed in `cwd`, e.g. 'python "
        "train.py --epochs 1' (enough steps for a loss curve: 20 or more). Default: `python PATH`.",
    )
    cwd: str | None = Field(None, description='With `project`: the folder the command is run from (default ".").')
    loss_pattern: str | None = Field(
        None,
        description="A regular expression with a `value` group that finds the loss in the program's output, when "
        "verify reports that it found none (e.g. 'Loss (?P<value>[0-9.]+)'). Default: the common formats.",
    )
    migrated_args: list[str] = Field(
        [], description="Arguments added to the migrated run only, e.g. ['--device', 'xla']. Default none."
    )


class OptimizeRequest(BaseModel):
    model_config = STRICT
    original: str = Field(description="The original (CUDA) script's text: the reference run.")
    migrated: str = Field(description="The migrated script's text, the one to optimize.")
    name: str = Field("train.py", description="The script's file name (both are run under it).")
    args: list[str] = Field([], description="Arguments of the script, e.g. ['--steps', '20'].")
    run: bool = Field(
        True, description="Judge each candidate by running the program (needs the token); false: propose only."
    )
    timeout_s: float = Field(3600.0, gt=0, le=7200, description="How long the request may take in all.")


class SandboxStatus(BaseModel):
    sandboxed: bool = Field(description="True only when every mechanism below holds on this machine.")
    guarantees: list[str] = Field(description="What holds for code that the server executes.")
    refused: list[str] = Field(description="Mechanisms this machine refused, and what that leaves open.")


class Health(BaseModel):
    status: str
    fixes: int
    proposer: str
    execution_enabled: bool
    max_concurrency: int
    per_client: int = Field(description="Requests of one kind one client may have in progress at once.")
    sandbox: SandboxStatus


class ErrorMessage(BaseModel):
    detail: str = Field(description="What went wrong, for a person.")


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the error responses a route really sends (422 keeps FastAPI's own)."""
    meaning = {
        400: "The body is not JSON text (e.g. not UTF-8).",
        401: "Wrong or missing token for running code.",
        403: "Running submitted code is disabled on this server.",
        404: "No such kb entry.",
        413: "Request body too large, or the project sent is over its bounds (files, bytes unpacked).",
        429: "Busy: all slots, or this client's share of them, are in use; retry after `Retry-After` seconds.",
        504: "The request took longer than its time limit; its work was stopped.",
    }
    return {code: {"model": ErrorMessage, "description": meaning[code]} for code in codes}


def bad_input(message: str) -> HTTPException:
    """422 with FastAPI's validation-error shape (`detail` is a list), for input that parses but is unusable."""
    return HTTPException(422, [{"loc": ["body"], "msg": message, "type": "value_error"}])


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 without echoing the input: NaN, Infinity or 1e999 cannot be written back as JSON (a 500)."""
    detail = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors()
    ]
    return JSONResponse({"detail": detail}, status_code=422)


class Slots:
    """Requests of one kind in progress: at most `total` at once, at most `per_client` of one client."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self.held: dict[str, int] = {}

    def take(self, client: str) -> str | None:
        """Takes a slot for `client`; None when taken, else why not. One event loop calls it: no lock needed."""
        if sum(self.held.values()) >= self.total:
            return "busy: too many requests in progress, retry later"
        if self.held.get(client, 0) >= self.per_client:
            return f"busy: this client already has {self.per_client} such request(s) in progress, retry later"
        self.held[client] = self.held.get(client, 0) + 1
        return None

    def give_back(self, client: str) -> None:
        self.held[client] -= 1
        if not self.held[client]:
            del self.held[client]


class StripBom:
    """ASGI middleware: a request body that starts with a UTF-8 BOM is read without it (RFC 8259 lets a JSON
    parser ignore one; Python's refuses it)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        first = True

        async def without_bom():
            nonlocal first
            message = await receive()
            if first and message["type"] == "http.request":
                first = False
                message = {**message, "body": message.get("body", b"").removeprefix(b"\xef\xbb\xbf")}
            return message

        await self.app(scope, without_bom, send)


class BodyLimit:
    """ASGI middleware: 413 for bodies over `max_bytes`, whether declared (Content-Length) or streamed."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = {"detail": f"request body too large (limit {self.max_bytes} bytes)"}
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.max_bytes:
                await _send_json(send, 413, too_large)
                return
            await self.app(scope, receive, send)
            return
        # streamed (chunked) body: read it here, within the limit, then hand it on in one piece
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await _send_json(send, 413, too_large)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


async def _send_json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def create_app(
    pipeline: Pipeline | None = None,
    token: str | None | object = _ENV_TOKEN,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_concurrency: int = MAX_CONCURRENCY,
    timeout_s: float = TIMEOUT_S,
    warm_up: bool = True,
    per_client: int | None = None,
) -> FastAPI:
    """The ASGI app. `token` defaults to `$XLAPORT_TOKEN`; None disables running submitted code.

    `warm_up` loads the kb index and the embedding model at start-up rather than on the first search.
    `per_client` (default: half of `max_concurrency`, at least 1): slots of one kind one client may hold.
    """
    per_client = per_client or max(1, max_concurrency // 2)
    server_token = (os.environ.get("XLAPORT_TOKEN") if token is _ENV_TOKEN else token) or None
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["pipeline"] = pipeline or get_pipeline()
        state["search"] = Slots(max_concurrency, per_client)  # search never waits behind suggest
        state["heavy"] = Slots(max_concurrency, per_client)
        if warm_up:
            await run_in_threadpool(state["pipeline"].warm_up)
        yield

    app = FastAPI(
        title="xlaport",
        summary="Patches that move CUDA-era PyTorch code to TPUs (PyTorch/XLA), with evidence.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.add_middleware(StripBom)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # added last: runs first
    app.add_exception_handler(RequestValidationError, _validation_error)

    def may_execute(authorization: str | None) -> bool:
        """True when the server has a token and the request carries it; 401 for a wrong one."""
        if server_token is None:
            return False
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), str(server_token).encode()):
            raise HTTPException(401, "running code needs `Authorization: Bearer <token>` with the server's token")
        return True

    def client_of(request: Request, authorization: str | None) -> str:
        """Who holds a slot: the holders of the server's token are one client, any other caller its address."""
        scheme, _, given = (authorization or "").partition(" ")
        if server_token is not None and scheme.lower() == "bearer":
            if hmac.compare_digest(given.strip().encode(), str(server_token).encode()):
                return "token"
        return f"address {request.client.host if request.client else 'unknown'}"

    async def limited(work: Callable[[], T], seconds: float, kind: str, client: str) -> T:
        """Runs `work` in a thread: 429 when `kind`'s slots (or this client's share) are busy, 504 past `seconds`,
        4xx for bad input."""
        slots: Slots = state[kind]
        refused = slots.take(client)
        if refused:
            raise HTTPException(429, refused, headers={"Retry-After": "5"})
        future = asyncio.ensure_future(run_in_threadpool(work))
        future.add_done_callback(lambda _: slots.give_back(client))  # a timed-out run keeps its slot until it ends
        try:
            return await asyncio.wait_for(asyncio.shield(future), seconds)
        except TimeoutError:
            raise HTTPException(504, f"the request took longer than {seconds:.0f} s") from None
        except ProjectTooLarge as exc:
            raise HTTPException(413, str(exc)) from None
        except ValueError as exc:  # SourceError (unparsable or too big to analyse) is a ValueError
            raise bad_input(str(exc)) from None

    def project_of(body: SuggestRequest | CheckRequest | VerifyRequest):
        """The sent project, checked before any work: 413 over the bounds, 422 for a bad path or archive."""
        if body.project is None:
            return None
        try:
            return sent_project(body.project)
        except ProjectTooLarge as exc:
            raise HTTPException(413, str(exc)) from None
        except ValueError as exc:
            raise bad_input(str(exc)) from None

    @app.get("/healthz")
    def healthz() -> Health:
        p: Pipeline = state["pipeline"]
        return Health(
            status="ok",
            fixes=len(p.fixes()),
            proposer=p.proposer.name if p.proposer else "none (rules-only)",
            execution_enabled=server_token is not None,
            max_concurrency=max_concurrency,
            per_client=per_client,
            sandbox=SandboxStatus(**sandbox_status().to_dict()),
        )

    @app.post("/v1/suggest", responses=_errors(400, 401, 413, 429, 504))
    async def suggest(body: SuggestRequest, request: Request, authorization: str | None = Header(None)) -> Patch:
        """Patch + evidence for one file. Validation runs only with the server's token."""
        execute = body.options.validate_patch and may_execute(authorization)
        project = project_of(body)
        seconds = timeout_s + (3 * body.options.timeout_s if execute else 0)  # a run, a recorded run, the tests
        # the fix step runs in a child killed just before the time limit: a timed-out request frees its slot
        run = lambda: state["pipeline"].suggest(  # noqa: E731
            body.source,
            body.path,
            body.options,
            may_execute=execute,
            fix_time_limit_s=0.9 * timeout_s,
            project=project,
        )
        return in_api_wording(await limited(run, seconds, "heavy", client_of(request, authorization)))

    @app.post("/v1/search", responses=_errors(400, 413, 429, 504))
    async def search(body: SearchRequest, request: Request, authorization: str | None = Header(None)) -> list[FixHit]:
        """The kb entries closest to a code snippet, finding or error message."""
        run = lambda: state["pipeline"].search(body.text, body.k)  # noqa: E731
        return await limited(run, timeout_s, "search", client_of(request, authorization))

    @app.post("/v1/check", responses=_errors(400, 401, 403, 413, 429, 504))
    async def check(body: CheckRequest, request: Request, authorization: str | None = Header(None)) -> CheckOutcome:
        """The XLA execution check of a script (sandboxed child process). Needs the server's token."""
        if server_token is None:
            raise HTTPException(403, "running submitted code is disabled: start the server with XLAPORT_TOKEN set")
        may_execute(authorization)
        if "memory_mb" in body.model_fields_set and body.memory_mb > host_memory_mb():
            raise bad_input(f"memory_mb={body.memory_mb} is more than this machine has ({host_memory_mb()} MB)")
        project = project_of(body)
        if project is None and body.source is None:
            raise bad_input("send the script's `source`, or a `project` and the script's `path` in it")
        run = lambda: state["pipeline"].check(  # noqa: E731
            source=body.source,
            args=body.args,
            timeout_s=body.timeout_s,
            memory_mb=body.memory_mb,
            project=project,
            rel_path=body.path,
            cwd=body.cwd,
            command=body.command,
        )
        return in_api_wording(
            await limited(run, timeout_s + body.timeout_s, "heavy", client_of(request, authorization))
        )

    @app.post("/v1/verify", responses=_errors(400, 401, 403, 413, 429, 504))
    async def verify(body: VerifyRequest, request: Request, authorization: str | None = Header(None)) -> VerifyOutcome:
        """L0–L4 of a migrated script against a reference run of the original (both run, sandboxed).
        Needs the server's token."""
        if server_token is None:
            raise HTTPException(403, "running submitted code is disabled: start the server with XLAPORT_TOKEN set")
        may_execute(authorization)
        project = project_of(body)
        if project is None:
            if body.original is None:
                raise bad_input("send the original script's text (`original`), or a `project` and the `path` in it")
            run = lambda: state["pipeline"].verify_sources(body.original, body.migrated, body.args, body.name)  # noqa: E731
        else:
            if body.path is None:
                raise bad_input("`path` is needed with a project: the migrated file's path in it, e.g. 'train.py'")
            migrated = {**body.migrated_files, body.path: body.migrated}
            run = lambda: state["pipeline"].verify_in_project(  # noqa: E731
                project,
                migrated,
                body.command or shlex.join(["python", body.path]),
                original={body.path: body.original} if body.original is not None else None,
                cwd=body.cwd,
                loss_pattern=body.loss_pattern,
                migrated_args=body.migrated_args,
            )
        return in_api_wording(
            await limited(run, timeout_s + body.timeout_s, "heavy", client_of(request, authorization))
        )

    @app.post("/v1/optimize", responses=_errors(400, 401, 403, 413, 429, 504))
    async def optimize(body: OptimizeRequest, request: Request, authorization: str | None = Header(None)) -> dict:
        """Performance rewrites of a migrated script, each kept only when a run shows a cheaper step and the
        same curve (xlaport optimize). Running needs the server's token; `run: false` only proposes (diffs)."""
        if body.run:
            if server_token is None:
                raise HTTPException(403, "running submitted code is disabled: start the server with XLAPORT_TOKEN set")
            may_execute(authorization)
        run = lambda: state["pipeline"].optimize_sources(  # noqa: E731
            body.original, body.migrated, body.args, body.name, run=body.run
        )
        return await limited(run, timeout_s + body.timeout_s, "heavy", client_of(request, authorization))

    @app.get("/v1/fixes")
    def fixes() -> list[dict[str, Any]]:
        """Every kb entry."""
        return state["pipeline"].fixes()

    @app.get("/v1/fixes/{code}", responses=_errors(404))
    def fix_entry(code: str) -> FixEntry:
        """One kb entry in full (fields and a Markdown page)."""
        try:
            return state["pipeline"].explain(code)
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from None

    return app
