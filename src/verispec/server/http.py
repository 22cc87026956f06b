"""The HTTP front's limits, below the application: uvicorn's h11 protocol (pure Python, the same whatever else is
installed) with

- a request head (request line and headers) of at most MAX_HEAD_BYTES (limits.py): h11 refuses a longer one with
  a 400 as it arrives, so a 96 MB request line or 52 MB of headers is never held;
- a time limit to send a request head, from the connection's start or the end of its previous answer: a client
  that connects and sends nothing, or sends its headers a byte at a time, is disconnected (uvicorn alone waited
  forever); between requests uvicorn's keep-alive (KEEP_ALIVE_SECONDS) closes idle connections sooner;
- at most `max_connections` connections at once: more are closed as they are accepted, logged once a minute.

A body's time limit is the application's (app.py reads bodies within --body-timeout).
"""

from __future__ import annotations

import asyncio
import logging
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

REFUSAL_LOG_SECONDS = 60.0

log = logging.getLogger("verispec.server")


def bounded_protocol(max_connections: int, header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a connection cap and a time limit on each request head."""
    last_refusal_log = [0.0]

    class BoundedH11Protocol(H11Protocol):
        refused = False
        head_timer: asyncio.TimerHandle | None = None
        timed_cycle: object | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                self.refused, self.transport = True, transport
                transport.close()
                now = time.monotonic()
                if now - last_refusal_log[0] >= REFUSAL_LOG_SECONDS:
                    last_refusal_log[0] = now
                    log.warning("%d connections open (--max-connections): closing new ones", len(self.connections))
                return
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            if not self.refused:
                super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not self.timed_cycle:  # a whole request head arrived
                self.timed_cycle = self.cycle
                self._disarm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.cycle.response_complete:  # no pipelined request began
                self._arm_head_timer()

        def _arm_head_timer(self) -> None:
            self._disarm_head_timer()
            self.head_timer = self.loop.call_later(header_timeout, self._head_too_slow)

        def _disarm_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_too_slow(self) -> None:
            self.head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return BoundedH11Protocol
