"""Ingress: the one HTTP entry of a cluster, a Ray Serve deployment in front of the engine replicas.

Rules:
- The guard is the single-process server's (Host, Origin, API key), applied here, before any replica works.
- Every route but /metrics is forwarded whole to an engine replica, chosen by router.py, whose answer (the
  single-process app's, replica.py) is relayed message by message: SSE streams as it is produced.
- A request whose replica fails before any byte of the body reached the client (the response's headers are
  held back until then) is sent again, to another replica, up to ATTEMPTS times; greedy and seeded answers
  are reproducible, so the client cannot tell. A stream already under way ends with an SSE error event (the
  body the server sends for a failed request), never a hang.
- Every replica busy and the ingress's own wait line (--max-queue requests) full: 429 with Retry-After. The
  ingress counts the generation requests (POST) it has admitted and not finished, against each live replica's
  slots and queue plus --max-queue: Ray Serve's own handle-side limit refuses requests of a burst that arrive
  while one is still being routed (its counter is read before routing ends), so it is not used. Other routes
  (GET /health, /v1/models) are never refused.
- /metrics: this ingress's own series (prefix affinity, retries) and every replica's series, each with a
  label replica="<Ray's replica id>", refreshed from the replicas every ROUTING_STATS_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..app import RETRY_AFTER_SECONDS, _body
from ..guard import Guard
from ..protocol import ApiError
from .metrics import replica_metrics
from .prefix import prefix_keys
from .protocol import Forwarded
from .shared import REGISTRY as ROUTER_REGISTRY
from .shared import ROUTERS

log = logging.getLogger("verispec.server.cluster")
ATTEMPTS = 3  # replicas tried for a request that no replica has started answering
RETRY_PAUSE_SECONDS = 0.2  # lets Ray mark a dead replica before the next try
FIRST_CALL_SECONDS = 10.0

REGISTRY = CollectorRegistry()
REJECTED = Counter(
    "verispec_cluster_rejected_requests", "Requests the ingress refused, by error code", ["code"], registry=REGISTRY
)
RETRIED = Counter(
    "verispec_cluster_retried_requests", "Requests sent again after their replica failed first", registry=REGISTRY
)
BROKEN = Counter(
    "verispec_cluster_broken_streams", "Streams ended with an error event: their replica failed", registry=REGISTRY
)


@dataclass(frozen=True)
class IngressConfig:
    api_keys: tuple[str, ...]
    allowed_hosts: frozenset[str] | None
    max_body_bytes: int
    body_timeout: float
    replica_capacity: int  # requests one replica runs or queues (--max-num-seqs + --max-queue)
    max_queue: int  # generation requests the ingress holds beyond what the replicas take
    replicas: int  # replicas assumed before the router has seen any
    metrics_key: str | None = None  # /metrics' own key (app.Guard)


class _ReplicaGone(Exception):
    """The replica failed before the client saw any of its answer's body: the request may be sent again."""


class Ingress:
    """Ray Serve's ingress deployment (launch.py wraps it): `__serve_build_asgi_app__` gives Ray the app."""

    def __init__(self, engine: DeploymentHandle, config: IngressConfig) -> None:
        self.engine = engine.options(method_name="forward", stream=True)
        self.config = config
        self.admitted = 0  # generation requests between admission and their answer's end

    def _room(self) -> bool:
        live = max((len(router.curr_replicas) for router in ROUTERS), default=self.config.replicas)
        return self.admitted < live * self.config.replica_capacity + self.config.max_queue

    def __serve_build_asgi_app__(self):
        def refused(label: str) -> None:
            REJECTED.labels(code=label).inc()

        return Guard(
            self._dispatch,
            self.config.api_keys,
            allowed_hosts=self.config.allowed_hosts,
            refused=refused,
            metrics_key=self.config.metrics_key,
        )

    async def _dispatch(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] != "http":
            return
        elif scope["path"] == "/metrics":
            await self._metrics(scope, receive, send)
        else:
            await self._forward(scope, receive, send)

    async def _metrics(self, scope, receive, send) -> None:
        if not ROUTERS:  # the handle makes its router at its first request: one that reaches no model
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._drain(Forwarded("GET", "/health", query_string=b"", headers=[], body=b"")), FIRST_CALL_SECONDS
                )
        text = generate_latest(REGISTRY) + generate_latest(ROUTER_REGISTRY) + replica_metrics()
        await Response(text, media_type=CONTENT_TYPE_LATEST)(scope, receive, send)

    async def _drain(self, request: Forwarded) -> None:
        async for _ in self.engine.remote(request):
            pass

    async def _forward(self, scope, receive, send) -> None:
        try:
            body = await _body(Request(scope, receive), self.config.max_body_bytes, self.config.body_timeout)
        except ApiError as error:
            await _answer(error, scope, receive, send)
            return
        client = tuple(scope["client"]) if scope.get("client") else None
        path = scope["path"]
        request = Forwarded(
            scope["method"],
            path,
            query_string=scope["query_string"],
            headers=list(scope["headers"]),
            body=body,
            client=client,
            prefix=prefix_keys(path, body),
        )
        if request.method != "POST":
            await self._serve(request, scope, receive, send)
        elif not self._room():
            await _answer(_queue_full(), scope, receive, send)
        else:
            self.admitted += 1
            try:
                await self._serve(request, scope, receive, send)
            finally:
                self.admitted -= 1

    async def _serve(self, request: Forwarded, scope, receive, send) -> None:
        for attempt in range(ATTEMPTS):
            try:
                await self._relay(request, send)
                return
            except _ReplicaGone as exc:
                log.warning("a replica failed before answering (%s); attempt %d of %d", exc, attempt + 1, ATTEMPTS)
                RETRIED.inc()
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
            except BackPressureError:  # not configured (launch.py); kept so a Ray default never becomes a 500
                await _answer(_queue_full(), scope, receive, send)
                return
        error = ApiError(503, "no replica could serve the request", type="server_error", code="unavailable")
        await _answer(error, scope, receive, send)

    async def _relay(self, request: Forwarded, send) -> None:
        """Send the replica's answer on as it comes; raises _ReplicaGone while nothing of the body was sent."""
        stream = self.engine.remote(request)
        held: dict | None = None  # the response's start, sent with the first body message
        started = finished = False
        try:
            async for message in stream:
                if message["type"] == "http.response.start":
                    held = message
                    continue
                if held is not None:
                    await send(held)
                    held, started = None, True
                await send(message)
                finished = not message.get("more_body", False)
            finished = True
        except RayActorError as exc:
            if not started:
                raise _ReplicaGone(type(exc).__name__) from None
            BROKEN.inc()
            await _end_broken_stream(send)
            finished = True
        finally:
            if not finished:
                stream.cancel()  # the client left (Ray cancelled this task): the replica cancels its request


def _queue_full() -> ApiError:
    message = "every replica is busy and the ingress's queue is full; retry shortly"
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return ApiError(429, message, type="rate_limit_error", code="queue_full", headers=headers)


async def _end_broken_stream(send) -> None:
    """The last message of a body whose replica failed mid-answer: an SSE error event, as the server sends for
    a request that fails mid-stream (a JSON body cannot be mended: it ends short)."""
    error = ApiError(500, "the replica serving this request failed", type="server_error", code="replica_failed")
    event = f"data: {json.dumps(error.body())}\n\n".encode()
    await send({"type": "http.response.body", "body": event, "more_body": False})


async def _answer(error: ApiError, scope, receive, send) -> None:
    if error.status < 499:
        REJECTED.labels(code=error.code or error.type).inc()
    await JSONResponse(error.body(), status_code=error.status, headers=error.headers)(scope, receive, send)


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
