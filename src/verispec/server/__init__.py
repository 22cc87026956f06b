"""OpenAI-compatible HTTP server with continuous batching and speculative decoding (`verispec serve`)."""

from ..engine.requests import EngineRequest, ErrorEvent, FinishEvent, StreamChunk
from ..engine.scheduler import QueueFullError, Scheduler, SchedulerConfig, SchedulerStoppedError
from .events import AsyncSink

__all__ = [
    "AsyncSink",
    "EngineRequest",
    "ErrorEvent",
    "FinishEvent",
    "QueueFullError",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStoppedError",
    "StreamChunk",
]
