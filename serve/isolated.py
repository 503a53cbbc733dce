"""Running the kb's fix step in a child process that can be killed: a request that times out stops its work
(a thread cannot be stopped), and a native crash of the parser takes down only the child.

Children are forked from a forkserver that imported the kb once, so a child starts in milliseconds and
inherits no threads (the HTTP server's, torch's) from the service.
"""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.connection import Connection

from xlaport.kb import FixResult, Rule, SourceError, fix_source, get_rule

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["xlaport.kb"])
_LOCK = threading.Lock()


class AnalysisTimeout(TimeoutError):
    """The fix step ran past its time limit; its child process was killed."""


def _child(conn: Connection, source: str, path: str, codes: list[str], unsafe: bool) -> None:
    try:
        result: object = fix_source(source, path, [get_rule(c) for c in codes], unsafe=unsafe)
    except RecursionError:
        result = SourceError("cannot parse: nested too deeply to analyse safely")
    except Exception as exc:  # sent back and raised in the parent
        result = exc if isinstance(exc, ValueError) else RuntimeError(f"{type(exc).__name__}: {exc}")
    conn.send(result)
    conn.close()


def fix_source_killable(source: str, path: str, rules: list[type[Rule]], unsafe: bool, timeout_s: float) -> FixResult:
    """`fix_source` in a child process, killed after `timeout_s` (AnalysisTimeout). Raises what fix_source raises."""
    receive, send = _CONTEXT.Pipe(duplex=False)
    with _LOCK:  # starting the forkserver once
        child = _CONTEXT.Process(target=_child, args=(send, source, path, [r.code for r in rules], unsafe), daemon=True)
        child.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            raise AnalysisTimeout(f"the analysis took longer than {timeout_s:.0f} s and was stopped")
        try:
            result = receive.recv()
        except EOFError:
            child.join(5)
            raise SourceError(
                f"cannot parse: the analysis process died (exit code {child.exitcode}); the input is refused"
            ) from None
    finally:
        if child.is_alive():
            child.kill()
        child.join(5)
        receive.close()
    if isinstance(result, BaseException):
        raise result
    return result
