"""The published OpenAPI schema: FastAPI's, plus what it cannot see, so that the schema is true of the server.

- The POST routes read their raw body themselves (to answer every mistake in OpenAI's error shape), so the
  request bodies are added from the request models.
- Every field a request may leave out also takes null (the models read null as the default, as OpenAI's API
  does).
- Every answer a route gives is listed: 200 (JSON, or server-sent events when streamed), and the errors in
  OpenAI's shape with their headers (401's WWW-Authenticate, 429's Retry-After).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from .protocol import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, ErrorResponse
from .responses_api import ResponseObject
from .responses_protocol import ResponsesRequest

REQUEST_MODELS = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/responses": ResponsesRequest,
}
RESPONSE_MODELS = {
    "/v1/completions": Completion,
    "/v1/chat/completions": ChatCompletion,
    "/v1/responses": ResponseObject,
}
REF = "#/components/schemas/{model}"

# status -> when it is answered (all in OpenAI's error shape)
GUARD_ERRORS = {
    "400": "the Host header names another server (see --allowed-hosts)",
    "403": "a browser page of another origin sent the request",
}
V1_ERRORS = {"401": "the API key is missing or wrong (servers started with --api-key)"}
POST_ERRORS = {
    "400": "a value the server cannot serve: too long for the context, a grammar it cannot build or that exceeds "
    "its limits, an unsupported feature, malformed or too deeply nested JSON",
    "413": "the body exceeds the server's --max-body-bytes",
    "415": "the body is not sent as application/json",
    "422": "the body does not match the request schema",
    "429": "every sequence slot and queue place is taken; retry after Retry-After seconds",
    "503": "the server is shutting down",
}
STORE_ERRORS = {"404": "no stored response (or item) with that id in this scope: unknown, expired or deleted"}
METRICS_ERRORS = {"401": "the metrics key (or the one API key) is missing or wrong",
                  "403": "several API keys and no --metrics-key: /metrics is closed"}  # fmt: skip
HEADERS = {
    "401": {"WWW-Authenticate": {"schema": {"type": "string"}}},
    "429": {"Retry-After": {"schema": {"type": "string"}}},
}


# one server-sent event of a stream (before OpenAPI 3.2 a text/event-stream schema describes each event): a chunk
# as JSON text, an error event's JSON, or the final [DONE]
SSE_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    "required": ["data"],
}


def openapi_schema(app: FastAPI) -> dict:
    if app.openapi_schema is None:
        app.openapi_schema = _build(app)
    return app.openapi_schema


def _build(app: FastAPI) -> dict:
    from fastapi.openapi.utils import get_openapi
    from pydantic.json_schema import models_json_schema

    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    requests, definitions = models_json_schema(
        [(model, "validation") for model in REQUEST_MODELS.values()], ref_template=REF
    )
    for definition in definitions["$defs"].values():
        _null_means_default(definition)
    components.update(definitions["$defs"])
    models = [(model, "serialization") for model in (*RESPONSE_MODELS.values(), ErrorResponse)]
    responses, definitions = models_json_schema(models, ref_template=REF)
    components.update(definitions["$defs"])
    error = responses[(ErrorResponse, "serialization")]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            errors = GUARD_ERRORS | (V1_ERRORS if path.startswith("/v1/") else {})
            if method == "post" and path in REQUEST_MODELS:
                body = {"application/json": {"schema": requests[(REQUEST_MODELS[path], "validation")]}}
                operation["requestBody"] = {"required": True, "content": body}
                reply = responses[(RESPONSE_MODELS[path], "serialization")]
                content = {"application/json": {"schema": reply}, "text/event-stream": {"schema": SSE_EVENT}}
                description = "the completion; with stream: true, server-sent events of its chunks"
                operation["responses"]["200"] = {"description": description, "content": content}
                errors = errors | POST_ERRORS
                errors["400"] = POST_ERRORS["400"] + "; or " + GUARD_ERRORS["400"]
            if path == "/health":
                errors = errors | {"503": "the scheduler is not running"}
            if path.startswith("/v1/responses"):
                errors = errors | STORE_ERRORS
            if path == "/metrics":
                errors = errors | METRICS_ERRORS
            operation["responses"].pop("422", None)  # FastAPI's own validation shape is never sent
            for status, description in errors.items():
                operation["responses"][status] = _error_response(description, error, status)
    return schema


def _error_response(description: str, error: dict, status: str) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": error}}}
    if status in HEADERS:
        response["headers"] = HEADERS[status]
    return response


def _null_means_default(definition: dict) -> None:
    """Each property a model does not require also takes null (the request models drop nulls before validating)."""
    required = set(definition.get("required", ()))
    for name, prop in definition.get("properties", {}).items():
        if name in required or _takes_null(prop):
            continue
        outer = {key: prop.pop(key) for key in ("title", "default", "description") if key in prop}
        definition["properties"][name] = {"anyOf": [prop, {"type": "null"}], **outer}


def _takes_null(prop: dict) -> bool:
    return prop.get("type") == "null" or any(option.get("type") == "null" for option in prop.get("anyOf", ()))
