"""A bounded schemathesis run over the server's published OpenAPI schema, in process on the tiny pair: requests
generated from the request models of /v1/completions and /v1/chat/completions (a few hundred), answered with
no 5xx, every answer as the schema documents it (its status, content type, headers and body), and every
refusal of a request's content naming the field at fault.

The context is 64 tokens, so no generated max_tokens or n makes a request long."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

EXAMPLES = 150  # per route
RESPONSE_CHECKS = [
    getattr(schemathesis.checks, name)
    for name in ("not_a_server_error", "status_code_conformance", "content_type_conformance",
                 "response_headers_conformance", "response_schema_conformance")
]  # fmt: skip
UNNAMED = {"queue_full", "invalid_json", "unsupported_media_type", "shutting_down"}  # not about one field


def test_generated_requests_get_no_5xx_and_every_4xx_names_its_field(tiny):
    from fastapi.testclient import TestClient

    from verispec.engine.scheduler import Scheduler, SchedulerConfig
    from verispec.server.app import ServerState, create_app

    target, draft = tiny
    scheduler = Scheduler(target, draft, SchedulerConfig(max_num_seqs=2, max_queue=2, max_model_len=64))
    app = create_app(ServerState(scheduler, "tiny"))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    statuses: dict[int, int] = {}
    with TestClient(app) as client:
        operations = [result.ok() for result in schema.get_all_operations()]
        for operation in [op for op in operations if op.method.upper() == "POST"]:
            _fuzz(client, operation, statuses)
    assert statuses.get(200, 0) > 20 and sum(statuses.values()) >= 2 * EXAMPLES  # valid requests ran too


def _fuzz(client, operation, statuses: dict[int, int]) -> None:
    @hypothesis.settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
    )  # fmt: skip
    @hypothesis.given(case=operation.as_strategy())
    def check(case) -> None:
        reply = client.post(operation.path, json=case.body)
        statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
        assert reply.status_code < 500, (case.body, reply.text)
        case.validate_response(reply, checks=RESPONSE_CHECKS)
        if reply.status_code >= 400:
            error = reply.json()["error"]
            assert error["param"] or error["code"] in UNNAMED, (case.body, error)

    check()


def test_the_schema_says_what_the_server_does(tiny):
    """Each disagreement a schema-driven probe found: `n: null` was accepted though the schema typed it integer;
    `{"prompt": ""}` was valid by the schema but refused; no 4xx was documented; /metrics was declared JSON but
    served as text; a 405 lost its Allow header; a stream's events were declared strings (before OpenAPI 3.2 a
    text/event-stream schema describes each event: an object with its data)."""
    from fastapi.testclient import TestClient

    from verispec.engine.scheduler import Scheduler, SchedulerConfig
    from verispec.server.app import ServerState, create_app

    target, draft = tiny
    app = create_app(ServerState(Scheduler(target, draft, SchedulerConfig(max_model_len=64)), "tiny"))
    with TestClient(app) as client:
        schema = client.get("/openapi.json").json()
        request = schema["components"]["schemas"]["CompletionRequest"]["properties"]
        assert {"type": "null"} in request["n"]["anyOf"] and client.post("/v1/completions", json={
            "prompt": "hi", "n": None, "max_tokens": 2}).status_code == 200  # fmt: skip
        assert all(option["minLength" if option["type"] == "string" else "minItems"] == 1
                   for option in request["prompt"]["anyOf"])  # fmt: skip
        assert client.post("/v1/completions", json={"prompt": ""}).status_code == 422
        post = schema["paths"]["/v1/completions"]["post"]["responses"]
        assert {"400", "401", "413", "415", "422", "429", "503"} <= set(post)
        assert post["429"]["headers"]["Retry-After"]
        metrics = schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
        assert list(metrics) == ["text/plain"] and client.get("/metrics").headers["content-type"].startswith(
            "text/plain"
        )
        refused = client.delete("/v1/completions")
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"
        operation = schemathesis.openapi.from_asgi("/openapi.json", app)["/v1/completions"]["POST"]
        case = operation.Case(body={"prompt": "hi", "max_tokens": 3, "stream": True})
        streamed = client.post("/v1/completions", json=case.body)
        assert streamed.headers["content-type"].startswith("text/event-stream")
        case.validate_response(streamed, checks=RESPONSE_CHECKS)
