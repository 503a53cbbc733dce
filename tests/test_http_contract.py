"""The HTTP service against its own OpenAPI document (schemathesis, all checks, bounded examples), and the
numeric inputs that JSON allows but FastAPI could not echo back (NaN, Infinity, 1e999)."""

from __future__ import annotations

import os
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from xlaport.kb.retrieval import FixIndex
from xlaport.serve.http import create_app
from xlaport.serve.pipeline import Pipeline

EXAMPLES = int(os.environ.get("XLAPORT_CONTRACT_EXAMPLES", "20"))  # per operation and phase; 20 keeps CI fast


class HashingEncoder:
    """Hashed bag of words: a real FAISS index whose answers are real FixHits, without the 30 s model load
    (retrieval quality is tested in test_retrieval.py; this file tests the HTTP contract)."""

    def encode(self, texts):
        vectors = np.zeros((len(texts), 384), np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                vectors[row, zlib.crc32(word.encode()) % 384] += 1.0
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-6)


INDEX = FixIndex.load_or_build(encoder=HashingEncoder(), directory=Path(tempfile.mkdtemp(prefix="xlaport-contract-")))
app = create_app(Pipeline(index=INDEX), token=None, warm_up=False)
# A schema cannot say "valid Python" or "a known rule code": text that is a string but not Python is a 422 with
# the reason, which all checks accept once 422 is an expected answer to schema-valid data.
ACCEPTED = ["2xx", "401", "403", "404", "409", "422", "429"]
config = SchemathesisConfig.from_dict({"checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}}})
schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_matches_the_contract(case):
    """No 5xx, and every status, header and body is one the OpenAPI document declares."""
    case.call_and_validate()


POSTS = {
    "/v1/suggest": {"source": "x = 1\n", "options": {"k": "VALUE"}},
    "/v1/search": {"text": "cuda", "k": "VALUE"},
    "/v1/check": {"source": "print(1)\n", "timeout_s": "VALUE"},
    "/v1/verify": {"original": "x = 1\n", "migrated": "x = 1\n", "timeout_s": "VALUE"},
    "/v1/optimize": {"original": "x = 1\n", "migrated": "x = 1\n", "timeout_s": "VALUE"},
}


@pytest.mark.parametrize("route", POSTS)
@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_a_4xx_on_every_post_route(route, number):
    body = str(POSTS[route]).replace("'", '"').replace('"VALUE"', number)
    with TestClient(create_app(Pipeline(), token=None, warm_up=False)) as c:
        response = c.post(route, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert isinstance(response.json()["detail"], list) and response.json()["detail"][0]["msg"]
