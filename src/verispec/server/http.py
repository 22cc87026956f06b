"""The HTTP front's limits, below the application: uvicorn's h11 protocol (pure Python, the same whatever else is
installed) with

- a request head (request line and headers) of at most MAX_HEAD_BYTES (limits.py): h11 refuses a longer one with
  a 400 as it arrives, so a 96 MB request line or 52 MB of headers is never held;
- a time limit to send a request head, from the connection's start or the end of its previous answer: a client
  that connects and sends nothing, or sends its headers a byte at a time, is disconnected (uvicorn alone waited
  forever); between requests uvicorn's keep-alive (KEEP_ALIVE_SECONDS) closes idle connections sooner;
- at most `max_connections` connections at once: at the cap, a new connection takes the place of the oldest one
  that has not sent a whole request (idle, or sending its head slowly), so that idle connections cannot lock
  clients out; only when every connection has a request under way is the new one closed (logged once a minute).

A body's time limit is the application's (app.py reads bodies within --body-timeout).
"""

from __future__ import annotations

import asyncio
import logging
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

REFUSAL_LOG_SECONDS = 60.0

log = logging.getLogger("verispec.server")


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and a time limit on each request head (bounded_protocol sets
    the limits, in a subclass per server)."""

    max_connections = 0
    header_timeout = 0.0
    last_refusal_log = [0.0]  # when a refusal was last logged (one list per subclass)
    refused = False
    head_timer: asyncio.TimerHandle | None = None  # armed while a connection waits for a request head
    timed_cycle: object | None = None
    opened = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections and not self._evict_an_idle_one():
            self.refused, self.transport = True, transport
            transport.close()
            now = time.monotonic()
            if now - self.last_refusal_log[0] >= REFUSAL_LOG_SECONDS:
                self.last_refusal_log[0] = now
                log.warning("%d connections open (--max-connections): closing new ones", len(self.connections))
            return
        super().connection_made(transport)
        self.opened = time.monotonic()
        self._arm_head_timer()

    def _evict_an_idle_one(self) -> bool:
        """Close the oldest connection waiting for a request head (it has none under way); False if none."""
        idle = [c for c in self.connections if isinstance(c, BoundedH11Protocol) and c.head_timer is not None]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.opened)
        oldest._disarm_head_timer()
        oldest.transport.close()
        self.connections.discard(oldest)
        return True

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
        self.head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _disarm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_too_slow(self) -> None:
        self.head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(max_connections: int, header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with these limits: at most `max_connections` open, `header_timeout` seconds for a
    request head."""
    limits = {"max_connections": max_connections, "header_timeout": header_timeout, "last_refusal_log": [0.0]}
    return type("BoundedH11Protocol", (BoundedH11Protocol,), limits)
