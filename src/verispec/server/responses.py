"""OpenAI response bodies and stream chunks built from the scheduler's events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel

from ..decoding.grammar import GrammarError
from ..decoding.logprobs import TokenLogprob
from ..decoding.stats import GenerationStats
from ..engine.requests import EngineRequest, ErrorEvent, FinishEvent, GenerationOutput, StreamChunk
from ..errors import InvalidParameterError
from ..models.tokenizer import Tokenizer
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
    """A request accepted by a handler: what the route needs to answer it. `requests` are its choices' engine
    requests (n of them, or best_of)."""

    id: str
    model: str
    requests: list[EngineRequest]
    sink: AsyncSink
    stream: bool
    include_usage: bool
    tokenizer: Tokenizer
    choices: int = 1  # n: how many of the requests' outputs are answered
    logprobs: bool = False  # whether the client asked for them (best_of ranks by them either way)
    grammar_param: str | None = None  # the field that asked for structured output, if any

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs


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


def usage(outputs: list[GenerationOutput]) -> Usage:
    prompt, completion = len(outputs[0].prompt_ids), sum(len(output.token_ids) for output in outputs)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def best(job: Job, outputs: list[GenerationOutput]) -> list[GenerationOutput]:
    """The job's n answers: all outputs, or with best_of the n of highest mean logprob per token (OpenAI's
    rule), best first."""
    if len(outputs) == job.choices:
        return outputs

    def mean_logprob(output: GenerationOutput) -> float:
        values = [entry.logprob for entry in output.logprobs or []]
        return sum(values) / len(values) if values else float("-inf")

    return sorted(outputs, key=mean_logprob, reverse=True)[: job.choices]


def _stats(outputs: list[GenerationOutput], queue_seconds: float) -> VerispecStats:
    return VerispecStats.from_stats(GenerationStats.merged([output.stats for output in outputs]), queue_seconds)


def completion_body(job: Job, outputs: list[GenerationOutput], queue_seconds: float) -> Completion:
    choices = [
        CompletionChoice(
            index=i, text=output.text, finish_reason=output.finish_reason,
            logprobs=completion_logprobs(job.tokenizer, output.logprobs) if job.wants_logprobs else None,
        )
        for i, output in enumerate(best(job, outputs))
    ]  # fmt: skip
    stats = _stats(outputs, queue_seconds)
    return Completion(id=job.id, model=job.model, choices=choices, usage=usage(outputs), verispec=stats)


def chat_completion_body(job: Job, outputs: list[GenerationOutput], queue_seconds: float) -> ChatCompletion:
    choices = [
        ChatChoice(
            index=i, message=AssistantMessage(content=output.text), finish_reason=output.finish_reason,
            logprobs=chat_logprobs(job.tokenizer, output.logprobs) if job.wants_logprobs else None,
        )
        for i, output in enumerate(outputs)
    ]  # fmt: skip
    stats = _stats(outputs, queue_seconds)
    return ChatCompletion(id=job.id, model=job.model, choices=choices, usage=usage(outputs), verispec=stats)


def event_error(event: ErrorEvent, job: Job) -> ApiError:
    """A failed request's answer: 400 when it was the request's own fault (a grammar that hit the grammar
    library's limits while generating names the constraint's field), else 500."""
    if isinstance(event.error, GrammarError):
        return ApiError(400, event.message, param=job.grammar_param, code="invalid_value")
    if isinstance(event.error, InvalidParameterError):
        return ApiError(400, event.message, code="invalid_value")
    return ApiError(500, event.message, type="server_error", code="internal")


def _error_chunk(event: ErrorEvent, job: Job) -> dict:
    return event_error(event, job).body()


async def completion_chunks(job: Job) -> AsyncIterator[BaseModel | dict]:
    """One chunk per token with new text (tagged with its choice's index), a chunk with each choice's finish
    reason (and its statistics), then usage when asked."""
    pending: dict[int, list[TokenLogprob]] = {}
    outputs: list[GenerationOutput] = []
    async for index, event in job.sink.events():
        if isinstance(event, ErrorEvent):
            yield _error_chunk(event, job)
        elif isinstance(event, FinishEvent):
            outputs.append(event.output)
            stats = VerispecStats.from_stats(event.output.stats, event.queue_seconds)
            waiting = pending.pop(index, None)
            logprobs = completion_logprobs(job.tokenizer, waiting) if waiting else None
            choice = CompletionChoice(index=index, text="", logprobs=logprobs, finish_reason=event.output.finish_reason)
            yield Completion(id=job.id, model=job.model, choices=[choice], verispec=stats)
        elif (taken := _pending_logprobs(job, event, pending.setdefault(index, []))) is not None or event.text:
            logprobs = completion_logprobs(job.tokenizer, taken) if taken is not None else None
            choice = CompletionChoice(index=index, text=event.text, logprobs=logprobs, finish_reason=None)
            yield Completion(id=job.id, model=job.model, choices=[choice])
    if job.include_usage and len(outputs) == len(job.requests):
        yield Completion(id=job.id, model=job.model, choices=[], usage=usage(outputs))


async def chat_chunks(job: Job) -> AsyncIterator[BaseModel | dict]:
    def chunk(
        index: int, delta: Delta, finish_reason: str | None = None, logprobs: list[TokenLogprob] | None = None,
        **extra,
    ) -> ChatCompletionChunk:  # fmt: skip
        entries = chat_logprobs(job.tokenizer, logprobs) if logprobs else None
        choice = ChatChunkChoice(index=index, delta=delta, logprobs=entries, finish_reason=finish_reason)
        return ChatCompletionChunk(id=job.id, model=job.model, choices=[choice], **extra)

    for index in range(len(job.requests)):
        yield chunk(index, Delta(role="assistant", content=""))
    pending: dict[int, list[TokenLogprob]] = {}
    outputs: list[GenerationOutput] = []
    async for index, event in job.sink.events():
        if isinstance(event, ErrorEvent):
            yield _error_chunk(event, job)
        elif isinstance(event, FinishEvent):
            outputs.append(event.output)
            stats = VerispecStats.from_stats(event.output.stats, event.queue_seconds)
            yield chunk(index, Delta(), event.output.finish_reason, pending.pop(index, None), verispec=stats)
        elif (taken := _pending_logprobs(job, event, pending.setdefault(index, []))) is not None or event.text:
            yield chunk(index, Delta(content=event.text), logprobs=taken)
    if job.include_usage and len(outputs) == len(job.requests):
        yield ChatCompletionChunk(id=job.id, model=job.model, choices=[], usage=usage(outputs))
