"""A bounded schemathesis run over the server's published OpenAPI schema, in process on the tiny pair: requests
generated from the request models of /v1/completions and /v1/chat/completions (a few hundred), answered with
no 5xx, and every refusal of a request's content naming the field at fault.

The context is 64 tokens, so no generated max_tokens or n makes a request long."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

EXAMPLES = 150  # per route
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
        if reply.status_code >= 400:
            error = reply.json()["error"]
            assert error["param"] or error["code"] in UNNAMED, (case.body, error)

    check()
