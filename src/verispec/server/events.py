"""The bridge from the engine's thread to asyncio: `AsyncSink` turns the events of a request's choices into
one asyncio queue that an HTTP handler reads.

A stream that waits (in the queue, or while a long prompt prefills) sends something at least every
KEEP_ALIVE_SECONDS: clients give up on a silent stream (Codex CLI reconnects after 300 s without an event, and the
second request starts its prefill over; proxies close idle connections after 60 s). `events(keep_alive=...)` then
yields KEEP_ALIVE, which each stream tells in its protocol's terms (server/responses.py, responses_api.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from ..engine.requests import ErrorEvent, Event, FinishEvent

KEEP_ALIVE_SECONDS = 10.0  # the longest a stream stays silent


class KeepAlive:
    """Nothing happened for KEEP_ALIVE_SECONDS: the stream says it is alive."""


KEEP_ALIVE = KeepAlive()


class AsyncSink:
    """Receives the events of a request's n choices (engine requests) from the scheduler thread and queues them,
    tagged with the choice's index, on an event loop."""

    def __init__(
        self, choices: int = 1, loop: asyncio.AbstractEventLoop | None = None, keep_alive: float = KEEP_ALIVE_SECONDS
    ):
        self.choices = choices
        self.keep_alive = keep_alive
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    def choice(self, index: int) -> Callable[[Event], None]:
        """The sink of one choice's engine request."""

        def put(event: Event) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))

        return put

    async def events(self, keep_alive: bool = False) -> AsyncIterator[tuple[int, Event | KeepAlive]]:
        """(choice, event) until every choice has sent its FinishEvent, or one an ErrorEvent; with `keep_alive`,
        (-1, KEEP_ALIVE) whenever the sink's keep_alive seconds pass without one."""
        finished = 0
        while finished < self.choices:
            try:
                index, event = await asyncio.wait_for(self.queue.get(), self.keep_alive if keep_alive else None)
            except TimeoutError:
                yield -1, KEEP_ALIVE
                continue
            yield index, event
            if isinstance(event, ErrorEvent):
                return
            finished += isinstance(event, FinishEvent)
