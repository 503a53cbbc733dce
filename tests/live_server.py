"""An ASGI app served for real (uvicorn on 127.0.0.1, a free port, in a thread of the test process): for tests
whose subject is what happens on the wire (authentication of a transport, concurrency between clients)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


@contextmanager
def running(app, **options) -> Iterator[str]:
    """Serves `app` until the block ends (`options`: more uvicorn.Config settings); yields its base URL, e.g.
    "http://127.0.0.1:41234"."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
