"""The bridge from the engine's thread to asyncio: `AsyncSink` turns the events of a request's choices into
one asyncio queue that an HTTP handler reads."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from ..engine.requests import ErrorEvent, Event, FinishEvent


class AsyncSink:
    """Receives the events of a request's n choices (engine requests) from the scheduler thread and queues them,
    tagged with the choice's index, on an event loop."""

    def __init__(self, choices: int = 1, loop: asyncio.AbstractEventLoop | None = None):
        self.choices = choices
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    def choice(self, index: int) -> Callable[[Event], None]:
        """The sink of one choice's engine request."""

        def put(event: Event) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))

        return put

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """(choice, event) until every choice has sent its FinishEvent, or one an ErrorEvent."""
        finished = 0
        while finished < self.choices:
            index, event = await self.queue.get()
            yield index, event
            if isinstance(event, ErrorEvent):
                return
            finished += isinstance(event, FinishEvent)
