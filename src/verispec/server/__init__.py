"""OpenAI-compatible HTTP server with continuous batching and speculative decoding (`verispec serve`)."""

from .events import AsyncSink, EngineRequest, ErrorEvent, FinishEvent, TokenEvent
from .scheduler import QueueFullError, Scheduler, SchedulerConfig, SchedulerStoppedError

__all__ = [
    "AsyncSink",
    "EngineRequest",
    "ErrorEvent",
    "FinishEvent",
    "QueueFullError",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStoppedError",
    "TokenEvent",
]
