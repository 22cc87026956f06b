"""EngineReplica: one engine (target + draft, its own KV cache slots) as a Ray Serve replica.

It answers each forwarded request with the single-process server's own app (server/app.py), called in
process over ASGI, so validation, errors, SSE chunks and statistics are those of `verispec serve` by
construction. The ASGI messages stream back to the ingress as they are sent. When the ingress cancels the
call (its client left), the app sees a disconnect and cancels the engine request, as it does over HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from .protocol import Forwarded

ASGI_SPEC = "2.3"  # below 2.4 Starlette listens for a disconnect while streaming, which is how we cancel
STOP_SECONDS = 5.0  # how long a cancelled call waits for the app to cancel its engine request


class EngineReplica:
    """The deployment's class (launch.py wraps it in serve.deployment). Ray calls `check_health` every few
    seconds (a stopped scheduler restarts the replica) and `record_routing_stats` for /metrics."""

    def __init__(self, args: argparse.Namespace, model_name: str, allowed_hosts: frozenset[str] | None) -> None:
        from ..app import ServerState, create_app
        from ..engine_from_args import build_scheduler, drafter_card
        from ..responses_store import ResponseStore

        scheduler = build_scheduler(args)
        self.state = ServerState(
            scheduler, model_name, api_keys=args.api_key, cache_sharing=args.cache_sharing, allowed_hosts=allowed_hosts,
            max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout, grammar_timeout=args.grammar_timeout,
            grammar_processes=args.grammar_workers, parse_special=args.parse_special, metrics_key=args.metrics_key,
            responses=ResponseStore(args.responses_store, args.responses_store_limits), drafter=drafter_card(args),
        )  # fmt: skip
        self.app = create_app(self.state)
        scheduler.start()  # the app's lifespan would; here no ASGI server runs it

    async def forward(self, request: Forwarded) -> AsyncIterator[dict]:
        """The app's ASGI messages (http.response.start, then http.response.body ...) for `request`."""
        messages: asyncio.Queue[dict | None] = asyncio.Queue()
        gone = asyncio.Event()
        delivered = False

        async def receive() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            await messages.put(message)

        task = asyncio.create_task(self.app(_scope(request), receive, send))
        task.add_done_callback(lambda _: messages.put_nowait(None))
        try:
            while (message := await messages.get()) is not None:
                yield message
            task.result()  # the app's own errors became 500 answers; anything left is a bug worth raising
        finally:
            gone.set()  # cancelled by the ingress: the app sees its client leave and cancels the engine request
            if not task.done():
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(task, STOP_SECONDS)

    def check_health(self) -> None:
        if not self.state.scheduler.alive:
            raise RuntimeError("the scheduler thread is not running")

    def record_routing_stats(self) -> dict:
        """Sent to the routers every few seconds: this replica's Prometheus text, for the merged /metrics."""
        return {"metrics": self.state.scheduler.metrics.render().decode(), "pid": os.getpid()}

    def __del__(self) -> None:  # Ray Serve calls it when the replica stops
        with contextlib.suppress(Exception):
            self.state.scheduler.stop()
            if self.state._grammar_workers is not None:
                self.state._grammar_workers.close()


def _scope(request: Forwarded) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": ASGI_SPEC},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.query_string,
        "headers": request.headers,
        "client": request.client,
        "server": None,
    }
