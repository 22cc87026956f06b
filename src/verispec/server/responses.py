"""OpenAI response bodies and stream chunks built from the scheduler's events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel

from ..engine.requests import EngineRequest, ErrorEvent, FinishEvent, GenerationOutput
from .events import AsyncSink
from .protocol import (
    ApiError,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChoice,
    Delta,
    Usage,
    VerispecStats,
)


@dataclass
class Job:
    """A request accepted by a handler: what the route needs to answer it."""

    id: str
    model: str
    engine: EngineRequest
    sink: AsyncSink
    stream: bool
    include_usage: bool


def usage(output: GenerationOutput) -> Usage:
    prompt, completion = len(output.prompt_ids), len(output.token_ids)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def completion_body(job: Job, output: GenerationOutput, queue_seconds: float) -> Completion:
    choice = CompletionChoice(text=output.text, finish_reason=output.finish_reason)
    stats = VerispecStats.from_stats(output.stats, queue_seconds)
    return Completion(id=job.id, model=job.model, choices=[choice], usage=usage(output), verispec=stats)


def chat_completion_body(job: Job, output: GenerationOutput, queue_seconds: float) -> ChatCompletion:
    choice = ChatChoice(message=AssistantMessage(content=output.text), finish_reason=output.finish_reason)
    stats = VerispecStats.from_stats(output.stats, queue_seconds)
    return ChatCompletion(id=job.id, model=job.model, choices=[choice], usage=usage(output), verispec=stats)


def _error_chunk(event: ErrorEvent) -> dict:
    return ApiError(500, event.message, type="server_error", code="internal").body()


async def completion_chunks(job: Job) -> AsyncIterator[BaseModel | dict]:
    """One chunk per token with new text, then a chunk with the finish reason (and usage when asked)."""
    async for event in job.sink.events():
        if isinstance(event, ErrorEvent):
            yield _error_chunk(event)
        elif isinstance(event, FinishEvent):
            stats = VerispecStats.from_stats(event.output.stats, event.queue_seconds)
            choice = CompletionChoice(text="", finish_reason=event.output.finish_reason)
            yield Completion(id=job.id, model=job.model, choices=[choice], verispec=stats)
            if job.include_usage:
                yield Completion(id=job.id, model=job.model, choices=[], usage=usage(event.output))
        elif event.text:
            choice = CompletionChoice(text=event.text, finish_reason=None)
            yield Completion(id=job.id, model=job.model, choices=[choice])


async def chat_chunks(job: Job) -> AsyncIterator[BaseModel | dict]:
    def chunk(delta: Delta | None, finish_reason: str | None = None, **extra) -> ChatCompletionChunk:
        choices = [ChatChunkChoice(delta=delta, finish_reason=finish_reason)] if delta is not None else []
        return ChatCompletionChunk(id=job.id, model=job.model, choices=choices, **extra)

    yield chunk(Delta(role="assistant", content=""))
    async for event in job.sink.events():
        if isinstance(event, ErrorEvent):
            yield _error_chunk(event)
        elif isinstance(event, FinishEvent):
            stats = VerispecStats.from_stats(event.output.stats, event.queue_seconds)
            yield chunk(Delta(), event.output.finish_reason, verispec=stats)
            if job.include_usage:
                yield chunk(None, usage=usage(event.output))
        elif event.text:
            yield chunk(Delta(content=event.text))
