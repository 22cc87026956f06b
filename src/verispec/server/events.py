"""What a request hands the scheduler, what the scheduler sends back, and the bridge to asyncio.

The scheduler runs in its own thread; each request carries a `sink` it calls with events. `AsyncSink`
turns those calls into an asyncio queue that an HTTP handler reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ..generator import GenerationOutput
from ..sampling import SamplingParams


@dataclass
class TokenEvent:
    text: str  # newly safe text, possibly empty (held back for a possible stop string)
    token_id: int | None  # None for the final flush after a stop token


@dataclass
class FinishEvent:
    output: GenerationOutput
    queue_seconds: float  # time from arrival to admission into a slot


@dataclass
class ErrorEvent:
    message: str


Event = TokenEvent | FinishEvent | ErrorEvent


@dataclass
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    sink: Callable[[Event], None]
    stop: list[str] = field(default_factory=list)
    speculative: bool = True
    ignore_eos: bool = False  # end tokens are ordinary tokens (benchmarks: every request generates max_tokens)
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: bool = False


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
            if not isinstance(event, TokenEvent):
                return
