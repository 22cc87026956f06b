"""The bridge from the engine's thread to asyncio: `AsyncSink` turns a request's events into an asyncio
queue that an HTTP handler reads."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ..engine.requests import Event, StreamChunk


class AsyncSink:
    """Receives events from the scheduler thread and queues them on an event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    def __call__(self, event: Event) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    async def events(self) -> AsyncIterator[Event]:
        """Events until (and including) the request's FinishEvent or ErrorEvent."""
        while True:
            event = await self.queue.get()
            yield event
            if not isinstance(event, StreamChunk):
                return
