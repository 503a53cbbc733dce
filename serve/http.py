"""The HTTP patch service (FastAPI; OpenAPI docs at /docs): a thin front over `Pipeline`.

Running submitted code (validation of a suggestion, `/v1/check`, `/v1/verify`) happens only in the sandboxed child
process of the execution check, and only when the server was started with a token (`XLAPORT_TOKEN`)
and the request carries it (`Authorization: Bearer …`). Without a server token `/v1/check` and
`/v1/verify` answer 403
and suggestions come back unvalidated, saying why. Requests are size-limited (413), time-limited (504)
and the heavy endpoints run at most `max_concurrency` at a time (more: 429).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Header, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from xlaport.eval.sandbox import host_memory_mb, sandbox_status
from xlaport.kb import SourceError
from xlaport.kb.retrieval import FixHit

from .pipeline import Pipeline, get_pipeline
from .results import CheckOutcome, FixEntry, Patch, SuggestOptions, VerifyOutcome

MAX_BODY_BYTES = 1_000_000
MAX_CONCURRENCY = 4
TIMEOUT_S = 60.0  # for requests that run no code; runs of code get their own limit plus this margin
_ENV_TOKEN = object()
T = TypeVar("T")


class SuggestRequest(BaseModel):
    source: str = Field(description="The Python file's text.")
    path: str | None = Field(None, description="Its path (shown in the diff; decides the validated file's name).")
    options: SuggestOptions = SuggestOptions()


class SearchRequest(BaseModel):
    text: str = Field(min_length=1, description="Code, a finding, or an error message / log excerpt.")
    k: int = Field(5, ge=1, le=50)


class CheckRequest(BaseModel):
    source: str = Field(description="The script to run under the XLA execution check.")
    args: list[str] = []
    timeout_s: float = Field(300.0, gt=0, le=3600)
    memory_mb: int = Field(4096, ge=256, le=65536)


class VerifyRequest(BaseModel):
    original: str = Field(description="The original (CUDA) script's text: the reference run.")
    migrated: str = Field(description="The migrated script's text.")
    name: str = Field("train.py", description="The script's file name (both are run under it).")
    args: list[str] = Field([], description="Arguments of the script, e.g. ['--steps', '40'].")
    timeout_s: float = Field(1800.0, gt=0, le=7200, description="How long the request may take in all.")


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
    sandbox: SandboxStatus


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
) -> FastAPI:
    """The ASGI app. `token` defaults to `$XLAPORT_TOKEN`; None disables running submitted code.

    `warm_up` loads the kb index and the embedding model at start-up rather than on the first search.
    """
    server_token = (os.environ.get("XLAPORT_TOKEN") if token is _ENV_TOKEN else token) or None
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["pipeline"] = pipeline or get_pipeline()
        state["slots"] = asyncio.Semaphore(max_concurrency)
        if warm_up:
            await run_in_threadpool(state["pipeline"].warm_up)
        yield

    app = FastAPI(
        title="xlaport",
        summary="Patches that move CUDA-era PyTorch code to TPUs (PyTorch/XLA), with evidence.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    def may_execute(authorization: str | None) -> bool:
        """True when the server has a token and the request carries it; 401 for a wrong one."""
        if server_token is None:
            return False
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), str(server_token).encode()):
            raise HTTPException(401, "running code needs `Authorization: Bearer <token>` with the server's token")
        return True

    async def limited(work: Callable[[], T], seconds: float) -> T:
        """Runs `work` in a thread: 429 when all slots are busy, 504 past `seconds`, 4xx for bad input."""
        slots: asyncio.Semaphore = state["slots"]
        if slots.locked():
            raise HTTPException(429, "busy: too many requests in progress, retry later", headers={"Retry-After": "5"})
        await slots.acquire()
        future = asyncio.ensure_future(run_in_threadpool(work))
        future.add_done_callback(lambda _: slots.release())  # a timed-out run keeps its slot until it ends
        try:
            return await asyncio.wait_for(asyncio.shield(future), seconds)
        except TimeoutError:
            raise HTTPException(504, f"the request took longer than {seconds:.0f} s") from None
        except SourceError as exc:
            raise HTTPException(422, str(exc)) from None
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None

    @app.get("/healthz")
    def healthz() -> Health:
        p: Pipeline = state["pipeline"]
        return Health(
            status="ok",
            fixes=len(p.fixes()),
            proposer=p.proposer.name if p.proposer else "none (rules-only)",
            execution_enabled=server_token is not None,
            max_concurrency=max_concurrency,
            sandbox=SandboxStatus(**sandbox_status().to_dict()),
        )

    @app.post("/v1/suggest")
    async def suggest(body: SuggestRequest, authorization: str | None = Header(None)) -> Patch:
        """Patch + evidence for one file. Validation runs only with the server's token."""
        execute = body.options.validate_patch and may_execute(authorization)
        seconds = timeout_s + (2 * body.options.timeout_s if execute else 0)
        return await limited(
            lambda: state["pipeline"].suggest(body.source, body.path, body.options, may_execute=execute), seconds
        )

    @app.post("/v1/search")
    async def search(body: SearchRequest) -> list[FixHit]:
        """The kb entries closest to a code snippet, finding or error message."""
        return await limited(lambda: state["pipeline"].search(body.text, body.k), timeout_s)

    @app.post("/v1/check")
    async def check(body: CheckRequest, authorization: str | None = Header(None)) -> CheckOutcome:
        """The XLA execution check of a script (sandboxed child process). Needs the server's token."""
        if server_token is None:
            raise HTTPException(403, "running submitted code is disabled: start the server with XLAPORT_TOKEN set")
        may_execute(authorization)
        if "memory_mb" in body.model_fields_set and body.memory_mb > host_memory_mb():
            raise HTTPException(
                422, f"memory_mb={body.memory_mb} is more than this machine has ({host_memory_mb()} MB)"
            )
        run = lambda: state["pipeline"].check(  # noqa: E731
            source=body.source, args=body.args, timeout_s=body.timeout_s, memory_mb=body.memory_mb
        )
        return await limited(run, timeout_s + body.timeout_s)

    @app.post("/v1/verify")
    async def verify(body: VerifyRequest, authorization: str | None = Header(None)) -> VerifyOutcome:
        """L0–L4 of a migrated script against a reference run of the original (both run, sandboxed).
        Needs the server's token."""
        if server_token is None:
            raise HTTPException(403, "running submitted code is disabled: start the server with XLAPORT_TOKEN set")
        may_execute(authorization)
        run = lambda: state["pipeline"].verify_sources(body.original, body.migrated, body.args, body.name)  # noqa: E731
        return await limited(run, timeout_s + body.timeout_s)

    @app.get("/v1/fixes")
    def fixes() -> list[dict[str, Any]]:
        """Every kb entry."""
        return state["pipeline"].fixes()

    @app.get("/v1/fixes/{code}")
    def fix_entry(code: str) -> FixEntry:
        """One kb entry in full (fields and a Markdown page)."""
        try:
            return state["pipeline"].explain(code)
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from None

    return app
