"""The HTTP service through its ASGI app: endpoints, bad input, the token rule, 413, 429, 504."""

import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from xlaport.kb.retrieval import FixIndex, cache_dir
from xlaport.serve.http import create_app
from xlaport.serve.pipeline import Pipeline

CLASSIFIER = Path(__file__).resolve().parent / "programs" / "verify_classifier"

CUDA_SOURCE = (
    "import torch\n\nx = torch.zeros(3).cuda()\n\n\ndef peak():\n    return torch.cuda.max_memory_allocated()\n"
)
TOKEN = "s3cret-token"
FAST = {"k": 0}  # no retrieval: the embedding model is not loaded


def client(pipeline=None, **kwargs) -> TestClient:
    kwargs.setdefault("token", None)
    kwargs.setdefault("warm_up", False)
    return TestClient(create_app(pipeline or Pipeline(), **kwargs))


class Blocking(Pipeline):
    """A pipeline whose search waits until released: holds a concurrency slot on demand."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def search(self, text, k=5):
        self.entered.set()
        self.release.wait(30)
        return []


def test_health_and_fixes():
    with client() as c:
        health = c.get("/healthz").json()
        assert health["status"] == "ok" and health["execution_enabled"] is False and health["fixes"] > 0
        fixes = c.get("/v1/fixes").json()
        assert len(fixes) == health["fixes"] and {"code", "title", "why", "before"} <= set(fixes[0])
        entry = c.get("/v1/fixes/XLA201").json()
        assert entry["entry"]["code"] == "XLA201" and entry["markdown"].startswith("# XLA201")
        missing = c.get("/v1/fixes/XLA000")
        assert missing.status_code == 404 and "XLA000" in missing.json()["detail"]
        assert c.get("/openapi.json").json()["paths"].keys() >= {"/v1/suggest", "/v1/search", "/v1/check"}


def test_suggest_returns_a_patch_with_evidence():
    with client() as c:
        response = c.post("/v1/suggest", json={"source": CUDA_SOURCE, "path": "t.py", "options": FAST})
        assert response.status_code == 200, response.text
        patch = response.json()
        assert "+x = torch.zeros(3).to(torch_xla.device())" in patch["diff"]
        assert patch["evidence"]["codes_applied"] == ["XLA201"]
        assert patch["evidence"]["validated"] is False and patch["evidence"]["status"] == "unvalidated"
        assert [m["finding"]["code"] for m in patch["manual"]] == ["XLA601"]


def test_bad_input_is_a_4xx_with_a_clear_message():
    with client() as c:
        unparsable = c.post("/v1/suggest", json={"source": "def f(:\n", "options": FAST})
        assert unparsable.status_code == 422 and "cannot parse" in str(unparsable.json()["detail"])
        unknown = c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": {"k": 0, "select": ["NOPE"]}})
        assert unknown.status_code == 422 and "NOPE" in str(unknown.json()["detail"])
        assert c.post("/v1/suggest", json={"path": "x.py"}).status_code == 422  # no source
        assert (
            c.post("/v1/suggest", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
        )
        assert c.post("/v1/suggest", json={"source": "x", "options": {"k": 99}}).status_code == 422
        assert c.post("/v1/search", json={"text": ""}).status_code == 422
        deep = "x = " + "(" * 5000 + ")" * 5000 + "\n"
        nested = c.post("/v1/suggest", json={"source": deep, "options": FAST})
        assert nested.status_code == 422


def test_without_a_server_token_nothing_runs():
    with client() as c:
        check = c.post("/v1/check", json={"source": "print('hi')\n"}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert check.status_code == 403 and "XLAPORT_TOKEN" in check.json()["detail"]
        options = {"k": 0, "validate_patch": True}
        patch = c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": options}).json()
        assert patch["evidence"]["status"] == "unvalidated" and patch["evidence"]["checks"] == []
        assert "not allowed" in patch["evidence"]["reason"]


def test_with_a_server_token_requests_must_carry_it(monkeypatch):
    monkeypatch.setenv("XLAPORT_TOKEN", TOKEN)
    with TestClient(create_app(Pipeline(), warm_up=False)) as c:  # token read from the environment
        assert c.get("/healthz").json()["execution_enabled"] is True
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            response = c.post("/v1/check", json={"source": "print('hi')\n"}, headers=headers)
            assert response.status_code == 401, headers
        options = {"k": 0, "validate_patch": True}
        assert c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": options}).status_code == 401
        unvalidated = c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": FAST})
        assert unvalidated.status_code == 200  # no execution asked: no token needed
        verify = {"original": "print(1)\n", "migrated": "print(1)\n"}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            assert c.post("/v1/verify", json=verify, headers=headers).status_code == 401, headers


def test_verify_needs_the_server_token_and_sane_input():
    verify = {"original": "print(1)\n", "migrated": "print(1)\n"}
    with client() as c:
        response = c.post("/v1/verify", json=verify, headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 403 and "XLAPORT_TOKEN" in response.json()["detail"]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with client(token=TOKEN) as c:
        broken = c.post("/v1/verify", json={**verify, "migrated": "def f(:\n"}, headers=auth)
        assert broken.status_code == 422 and "cannot parse" in str(broken.json()["detail"])
        outside = c.post("/v1/verify", json={**verify, "name": "../train.py"}, headers=auth)
        assert outside.status_code == 422 and "plain file name" in str(outside.json()["detail"])


def test_request_size_limit():
    with client(max_body_bytes=2000) as c:
        big = c.post("/v1/suggest", json={"source": "x = 1\n" * 1000, "options": FAST})
        assert big.status_code == 413 and "too large" in big.json()["detail"]

        def chunks():
            for _ in range(10):
                yield b" " * 500

        streamed = c.post("/v1/search", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        assert c.post("/v1/suggest", json={"source": "x = 1\n", "options": FAST}).status_code == 200


def test_busy_server_answers_429_and_keeps_serving():
    pipeline = Blocking()
    with client(pipeline, max_concurrency=1) as c:
        first = {}
        thread = threading.Thread(target=lambda: first.update(r=c.post("/v1/search", json={"text": "x"})))
        thread.start()
        assert pipeline.entered.wait(30)
        busy = c.post("/v1/search", json={"text": "y"})
        assert busy.status_code == 429 and busy.headers["retry-after"] == "5"
        assert c.get("/healthz").status_code == 200  # cheap endpoints are not limited
        pipeline.release.set()
        thread.join(30)
        assert first["r"].status_code == 200
        assert c.post("/v1/search", json={"text": "z"}).status_code == 200


def test_slow_requests_time_out_with_504():
    pipeline = Blocking()
    with client(pipeline, timeout_s=0.5) as c:
        response = c.post("/v1/search", json={"text": "x"})
        assert response.status_code == 504
        pipeline.release.set()


@pytest.mark.slow
def test_search_and_suggest_with_retrieval():
    pipeline = Pipeline(index=FixIndex.load_or_build(directory=cache_dir()))
    with TestClient(create_app(pipeline, token=None)) as c:  # the lifespan loads the index once
        hits = c.post("/v1/search", json={"text": "RuntimeError: Found no NVIDIA driver on your system", "k": 3}).json()
        assert len(hits) == 3 and all(h["score"] > 0 for h in hits)
        patch = c.post("/v1/suggest", json={"source": CUDA_SOURCE}).json()
        assert patch["manual"][0]["retrieved"][0]["code"] == "XLA601"


@pytest.mark.slow
def test_check_runs_the_script_under_xla_with_the_token():
    script = (
        "import torch\nimport torch_xla\n\nw = torch.zeros(4, device=torch_xla.device())\n"
        "for _ in range(4):\n    w = w + 1\n    torch_xla.sync()\nprint(w.sum().item())\n"
    )
    with client(token=TOKEN) as c:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        response = c.post("/v1/check", json={"source": script, "timeout_s": 240}, headers=auth)
        assert response.status_code == 200, response.text
        check = response.json()["check"]
        assert check["name"] == "xla_check" and check["level"] == "L2" and check["passed"] is True, check["reasons"]
        assert check["report"]["steps"] == 4
        failing = c.post("/v1/check", json={"source": "raise SystemExit(3)\n", "timeout_s": 60}, headers=auth).json()
        assert failing["check"]["passed"] is False and failing["check"]["level"] == "none"


@pytest.mark.slow
def test_verify_grades_a_migrated_script_against_its_original_with_the_token():
    body = {
        "original": (CLASSIFIER / "original" / "train.py").read_text(),
        "migrated": (CLASSIFIER / "migrated" / "train.py").read_text(),
        "args": ["--steps", "24"],
    }
    with client(token=TOKEN) as c:
        response = c.post("/v1/verify", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    outcome = response.json()
    assert outcome["command"] == "python train.py --steps 24"
    assert outcome["status"] in {"pass", "inconclusive"} and outcome["level"] in {"L2", "L3", "L4"}, outcome["reasons"]
    report = outcome["report"]
    assert report["check"]["level"] == "L2" and report["migrated_run"]["device"].startswith("xla")
    assert report["reference_run"]["returncode"] == 0


# --- issue 25 -------------------------------------------------------------------------------------------------
class SlowSuggest(Pipeline):
    """A pipeline whose suggest waits until released (a slow request holding a heavy slot)."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.waiting = threading.Semaphore(0)

    def suggest(self, source, path=None, options=None, **kwargs):
        self.waiting.release()
        self.release.wait(60)
        return super().suggest(source, path, options, **kwargs)

    def search(self, text, k=5):
        return []


def test_one_client_cannot_hold_every_slot_and_search_never_waits_behind_suggest():
    """F5: four unauthenticated slow requests blocked every client, search included. Real HTTP: clients are told
    apart by their address and by the token, as a deployed server sees them."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from live_server import running

    pipeline = SlowSuggest()
    body = {"source": CUDA_SOURCE, "options": FAST}
    with running(create_app(pipeline, token=TOKEN, warm_up=False, max_concurrency=4)) as url:
        with ThreadPoolExecutor(4) as pool:
            slow = [pool.submit(httpx.post, f"{url}/v1/suggest", json=body, timeout=60) for _ in range(2)]
            for _ in slow:
                assert pipeline.waiting.acquire(timeout=30)  # both hold a heavy slot
            # the same client (same address, no token) gets no third slot ...
            third = httpx.post(f"{url}/v1/suggest", json=body, timeout=30)
            assert third.status_code == 429 and "this client" in third.json()["detail"]
            # ... while search answers at once, and another client (the token's holders) still gets a slot
            start = time.monotonic()
            assert httpx.post(f"{url}/v1/search", json={"text": "cuda"}, timeout=30).status_code == 200
            assert time.monotonic() - start < 5
            auth = {"Authorization": f"Bearer {TOKEN}"}
            other = pool.submit(httpx.post, f"{url}/v1/suggest", json=body, headers=auth, timeout=60)
            assert pipeline.waiting.acquire(timeout=30)
            pipeline.release.set()
            assert [f.result().status_code for f in [*slow, other]] == [200, 200, 200]
        health = httpx.get(f"{url}/healthz").json()
        assert health["per_client"] == 2 and health["max_concurrency"] == 4


def test_unusable_names_and_arguments_are_a_422_with_the_reason():
    """N7/N8/N9: a file name over 255 bytes, an argument over 128 KB, or a NUL in one was a 500 (or a 200 with the
    sandbox's traceback)."""
    long_name = "a" * 252 + ".py"  # 255 bytes: allowed
    too_long = "é" * 130 + ".py"  # 263 bytes in UTF-8, 133 characters
    with client(token=TOKEN) as c:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (
            c.post("/v1/suggest", json={"source": CUDA_SOURCE, "path": long_name, "options": FAST}).status_code == 200
        )
        cases = [
            ("/v1/suggest", {"source": CUDA_SOURCE, "path": too_long, "options": FAST}, "at most 255"),
            ("/v1/suggest", {"source": CUDA_SOURCE, "path": "a\0.py", "options": FAST}, "NUL"),
            ("/v1/verify", {"original": "x = 1\n", "migrated": "x = 1\n", "name": too_long}, "at most 255"),
            ("/v1/verify", {"original": "x = 1\n", "migrated": "x = 1\n", "args": ["a" * 131_072]}, "at most 131,071"),
            ("/v1/check", {"source": "x = 1\n", "args": ["--x", "a" * 200_000]}, "argument 2"),
            ("/v1/check", {"source": "x = 1\n", "args": ["a\0b"]}, "NUL"),
            ("/v1/suggest", {"source": CUDA_SOURCE, "options": {"k": 0, "args": ["a\0b"]}}, "NUL"),
        ]
        for route, request, reason in cases:
            response = c.post(route, json=request, headers=auth)
            assert response.status_code == 422, (route, response.text[:300])
            detail = response.json()["detail"]
            assert isinstance(detail, list) and reason in detail[0]["msg"], (route, detail)


def test_422_details_are_arrays_and_whole_number_floats_are_integers():
    """F17: one 422 detail was a string; 43.0 was refused for an integer field."""
    with client(token=TOKEN) as c:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        too_much = c.post("/v1/check", json={"source": "x = 1\n", "memory_mb": 65536}, headers=auth)
        if too_much.status_code == 422:  # only on a machine with less than 64 GB
            assert isinstance(too_much.json()["detail"], list)
        assert c.post("/v1/search", json={"text": "cuda", "k": 3.0}).status_code == 200
        assert c.post("/v1/suggest", json={"source": CUDA_SOURCE, "options": {"k": 0.0}}).status_code == 200
        for bad in (3.5, True, "3"):
            assert c.post("/v1/search", json={"text": "cuda", "k": bad}).status_code == 422, bad


def test_memory_over_the_host_is_a_422_with_an_array_detail(monkeypatch):
    monkeypatch.setattr("xlaport.serve.http.host_memory_mb", lambda: 1024)
    with client(token=TOKEN) as c:
        response = c.post(
            "/v1/check", json={"source": "x = 1\n", "memory_mb": 2048}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert response.status_code == 422
    assert (
        isinstance(response.json()["detail"], list) and "more than this machine" in response.json()["detail"][0]["msg"]
    )


def test_a_leading_bom_is_accepted():
    """F12: a BOM at the start of the body, or of the source text, was refused."""
    import json

    with client() as c:
        body = json.dumps({"source": "\ufeff" + CUDA_SOURCE, "options": FAST}).encode()
        for data in (body, b"\xef\xbb\xbf" + body):
            response = c.post("/v1/suggest", content=data, headers={"content-type": "application/json"})
            assert response.status_code == 200, response.text[:300]
            assert "torch_xla" in response.json()["migrated"]
