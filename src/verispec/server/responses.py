"""OpenAI response bodies and stream chunks built from the scheduler's events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel

from ..engine.requests import EngineRequest, ErrorEvent, FinishEvent, GenerationOutput, StreamChunk
from ..logprobs import TokenLogprob
from ..tokenizer import Tokenizer
from .events import AsyncSink
from .protocol import (
    ApiError,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Delta,
    TokenLogprobEntry,
    TopLogprob,
    Usage,
    VerispecStats,
)

LOWEST_LOGPROB = -9999.0  # how a logprob of -inf is sent (JSON has no infinity; vLLM sends the same)


@dataclass
class Job:
    """A request accepted by a handler: what the route needs to answer it."""

    id: str
    model: str
    engine: EngineRequest
    sink: AsyncSink
    stream: bool
    include_usage: bool
    tokenizer: Tokenizer

    @property
    def wants_logprobs(self) -> bool:
        return self.engine.logprobs is not None


# ---- logprobs -------------------------------------------------------------------------------------------
def _finite(logprob: float) -> float:
    return max(logprob, LOWEST_LOGPROB)


def completion_logprobs(tokenizer: Tokenizer, logprobs: list[TokenLogprob]) -> CompletionLogprobs:
    """The legacy shape: each position's top_logprobs holds the sampled token and the N most likely."""
    tops = []
    for entry in logprobs:
        top = {tokenizer.token_text(entry.token_id): _finite(entry.logprob)}
        for token, logprob in entry.top:
            top.setdefault(tokenizer.token_text(token), _finite(logprob))
        tops.append(top)
    return CompletionLogprobs(
        tokens=[tokenizer.token_text(entry.token_id) for entry in logprobs],
        token_logprobs=[_finite(entry.logprob) for entry in logprobs],
        top_logprobs=tops,
        text_offset=[entry.text_offset for entry in logprobs],
    )


def _top(tokenizer: Tokenizer, token: int, logprob: float) -> TopLogprob:
    text, raw = tokenizer.token_text(token), tokenizer.token_bytes(token)
    return TopLogprob(token=text, logprob=_finite(logprob), bytes=list(raw))


def chat_logprobs(tokenizer: Tokenizer, logprobs: list[TokenLogprob]) -> ChatLogprobs:
    content = [
        TokenLogprobEntry(
            **_top(tokenizer, entry.token_id, entry.logprob).model_dump(),
            top_logprobs=[_top(tokenizer, token, logprob) for token, logprob in entry.top],
        )
        for entry in logprobs
    ]
    return ChatLogprobs(content=content)


def _pending_logprobs(job: Job, event: StreamChunk, pending: list[TokenLogprob]) -> list[TokenLogprob] | None:
    """Stream chunks carry the logprobs of every token since the last chunk (a token whose text is held back
    for a possible stop string sends its logprob with the next text)."""
    if event.logprob is not None:
        pending.append(event.logprob)
    if not job.wants_logprobs or not event.text:
        return None
    taken = list(pending)
    pending.clear()
    return taken


def usage(output: GenerationOutput) -> Usage:
    prompt, completion = len(output.prompt_ids), len(output.token_ids)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def completion_body(job: Job, output: GenerationOutput, queue_seconds: float) -> Completion:
    logprobs = completion_logprobs(job.tokenizer, output.logprobs) if output.logprobs is not None else None
    choice = CompletionChoice(text=output.text, logprobs=logprobs, finish_reason=output.finish_reason)
    stats = VerispecStats.from_stats(output.stats, queue_seconds)
    return Completion(id=job.id, model=job.model, choices=[choice], usage=usage(output), verispec=stats)


def chat_completion_body(job: Job, output: GenerationOutput, queue_seconds: float) -> ChatCompletion:
    logprobs = chat_logprobs(job.tokenizer, output.logprobs) if output.logprobs is not None else None
    message = AssistantMessage(content=output.text)
    choice = ChatChoice(message=message, logprobs=logprobs, finish_reason=output.finish_reason)
    stats = VerispecStats.from_stats(output.stats, queue_seconds)
    return ChatCompletion(id=job.id, model=job.model, choices=[choice], usage=usage(output), verispec=stats)


def _error_chunk(event: ErrorEvent) -> dict:
    return ApiError(500, event.message, type="server_error", code="internal").body()


async def completion_chunks(job: Job) -> AsyncIterator[BaseModel | dict]:
    """One chunk per token with new text, then a chunk with the finish reason (and usage when asked)."""
    pending: list[TokenLogprob] = []
    async for event in job.sink.events():
        if isinstance(event, ErrorEvent):
            yield _error_chunk(event)
        elif isinstance(event, FinishEvent):
            stats = VerispecStats.from_stats(event.output.stats, event.queue_seconds)
            logprobs = completion_logprobs(job.tokenizer, pending) if pending else None
            choice = CompletionChoice(text="", logprobs=logprobs, finish_reason=event.output.finish_reason)
            yield Completion(id=job.id, model=job.model, choices=[choice], verispec=stats)
            if job.include_usage:
                yield Completion(id=job.id, model=job.model, choices=[], usage=usage(event.output))
        elif (taken := _pending_logprobs(job, event, pending)) is not None or event.text:
            logprobs = completion_logprobs(job.tokenizer, taken) if taken is not None else None
            choice = CompletionChoice(text=event.text, logprobs=logprobs, finish_reason=None)
            yield Completion(id=job.id, model=job.model, choices=[choice])


async def chat_chunks(job: Job) -> AsyncIterator[BaseModel | dict]:
    def chunk(
        delta: Delta | None, finish_reason: str | None = None, logprobs: list[TokenLogprob] | None = None, **extra
    ) -> ChatCompletionChunk:
        choices = []
        if delta is not None:  # the usage chunk has no choices
            entries = chat_logprobs(job.tokenizer, logprobs) if logprobs else None
            choices.append(ChatChunkChoice(delta=delta, logprobs=entries, finish_reason=finish_reason))
        return ChatCompletionChunk(id=job.id, model=job.model, choices=choices, **extra)

    yield chunk(Delta(role="assistant", content=""))
    pending: list[TokenLogprob] = []
    async for event in job.sink.events():
        if isinstance(event, ErrorEvent):
            yield _error_chunk(event)
        elif isinstance(event, FinishEvent):
            stats = VerispecStats.from_stats(event.output.stats, event.queue_seconds)
            yield chunk(Delta(), event.output.finish_reason, pending, verispec=stats)
            if job.include_usage:
                yield chunk(None, usage=usage(event.output))
        elif (taken := _pending_logprobs(job, event, pending)) is not None or event.text:
            yield chunk(Delta(content=event.text), logprobs=taken)
