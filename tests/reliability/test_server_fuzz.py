"""Fuzz the OpenAPI spec the server publishes (schemathesis): every operation of an encoder server and of
a decoder server, with requests valid under the spec and requests that break it. No answer is a 5xx, and
every rejection is a 4xx whose JSON body says what was wrong ({"error": {"message": ...}})."""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from test_serve import decoder, smol_tok, tiny_classifier  # noqa: F401 - fixtures

from attnlab.serve import Limits, create_app

# small limits keep generation short (max_new_tokens) and let the fuzzer reach every limit
LIMITS = Limits(max_input_tokens=48, max_new_tokens=4, max_queued=64, request_timeout=20, max_body_bytes=8192,
                num_blocks=64, block_size=8, max_texts=8)
EXAMPLES = 25  # per operation and server
OPERATIONS = ["GET /health", "GET /metrics", "GET /viz", "GET /v1/models", "POST /v1/embeddings", "POST /v1/classify",
              "POST /v1/completions", "POST /v1/chat/completions"]


@pytest.fixture(scope="module")
def apps(decoder, smol_tok, tiny_classifier):  # noqa: F811
    """Both servers, called in-process through ASGI (no lifespan there, so the engine is started here)."""
    # schemathesis calls an ASGI app with Host: testserver, which the server refuses unless allowed
    made = {"decoder": create_app(decoder, smol_tok, name="tiny-lm", limits=LIMITS, allowed_hosts=["testserver"]),
            "encoder": create_app(*tiny_classifier, name="tiny-clf", limits=LIMITS, allowed_hosts=["testserver"])}
    made["decoder"].state.engine.start()
    yield made
    made["decoder"].state.engine.stop()
    for app in made.values():
        app.state.worker.stop()


def check(case) -> None:
    response = case.call()
    where = (response.status_code, response.text[:500], case.as_curl_command())
    assert response.status_code < 500, where
    if response.status_code >= 400:
        error = response.json().get("error") or {}
        assert isinstance(error.get("message"), str) and error["message"], where


# the adapter list is a generation server's (serve --adapter NAME=DIR); an encoder server does not publish it
CASES = [(kind, label) for kind in ("decoder", "encoder") for label in OPERATIONS
         if not (kind == "encoder" and label == "GET /v1/models")]


@pytest.mark.parametrize("kind,label", CASES)
def test_fuzzed_requests_never_get_500(apps, kind, label):
    # schemathesis 4's pytest plugin does not run under pytest 9, so cases are drawn from
    # `operation.as_strategy` under hypothesis directly
    schema = schemathesis.openapi.from_asgi("/openapi.json", apps[kind])
    published = {f"{op.method.upper()} {op.path}" for op in (r.ok() for r in schema.get_all_operations())}
    assert published <= {lab for k, lab in CASES if k == kind} | {"GET /openapi.json", "GET /docs"}, \
        "an operation the fuzzer skips"
    method, path = label.split(" ", 1)
    op = schema[path][method]
    modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if len(op.body) or len(op.query) else [])

    @given(st.one_of(*[op.as_strategy(generation_mode=m) for m in modes]))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def fuzz(case):
        check(case)
    fuzz()
