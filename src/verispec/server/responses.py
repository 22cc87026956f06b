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
from .events import KEEP_ALIVE, AsyncSink
from .harmony import HarmonyStream, read_answer
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
    PromptTokensDetails,
    TokenLogprobEntry,
    TopLogprob,
    Usage,
    VerispecStats,
)
from .tools import ParsedCall, ToolRequest, ToolStream, answer_calls, parse_calls

# what a chat or completions stream sends while it waits: an SSE comment, which every SSE reader skips (the OpenAI
# clients and the agent frameworks on them); the bytes keep the client's read timeout and idle proxies from closing it
SSE_COMMENT = ": keep-alive"
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
    tools: ToolRequest | None = None  # the request's tools: its answers may hold tool calls (tools.py)
    harmony: bool = False  # its answers are harmony messages (gpt-oss: harmony.py), read into reasoning and content

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
    """Tokens of the prompt (once, whatever n), of every answer, and of the prompt served from the prefix cache before
    the request (the fewest any choice took: the others also take what the first of them prefilled)."""
    prompt, completion = len(outputs[0].prompt_ids), sum(len(output.token_ids) for output in outputs)
    cached = PromptTokensDetails(cached_tokens=min(output.stats.cached_tokens for output in outputs))
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
        prompt_tokens_details=cached,
    )  # fmt: skip


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
    choices = []
    for i, output in enumerate(outputs):
        message, finish_reason = _message(job, output, i)
        logprobs = chat_logprobs(job.tokenizer, output.logprobs) if job.wants_logprobs else None
        choices.append(ChatChoice(index=i, message=message, finish_reason=finish_reason, logprobs=logprobs))
    stats = _stats(outputs, queue_seconds)
    return ChatCompletion(id=job.id, model=job.model, choices=choices, usage=usage(outputs), verispec=stats)


def _message(job: Job, output: GenerationOutput, choice: int) -> tuple[AssistantMessage, str]:
    """The answer's message and finish reason: its text, or with tools its content and tool calls (finish reason
    "tool_calls"; "function_call" for the legacy `functions`)."""
    tools = job.tools
    if job.harmony:
        return _harmony_message(job, output, choice)
    if tools is None or tools.choice == "none":
        return AssistantMessage(content=output.text), output.finish_reason
    text = job.tokenizer.decode(output.token_ids, keep_special=True)
    content, parsed = parse_calls(tools, text, cut=output.finish_reason == "length")
    if not parsed:
        return AssistantMessage(content=output.text if content == text else content), output.finish_reason
    calls = answer_calls(tools, parsed, choice)
    reason = (
        output.finish_reason if output.finish_reason != "stop" else "function_call" if tools.legacy else "tool_calls"
    )
    if tools.legacy:
        return AssistantMessage(content=content, function_call=calls[0].function), reason
    return AssistantMessage(content=content, tool_calls=calls), reason


def _harmony_message(job: Job, output: GenerationOutput, choice: int) -> tuple[AssistantMessage, str]:
    """A harmony answer's message: its analysis channel as reasoning_content, its final (and commentary) text as
    content, its messages to functions.NAME as tool calls where the request has tools (else their arguments are
    content, as written)."""
    read = read_answer(job.tokenizer, output.token_ids, job.tools, choice, cut=output.finish_reason == "length")
    calls = [ParsedCall(name, arguments) for name, arguments in read.taken]
    content, reasoning = read.content, read.reader.reasoning or None
    if not calls:
        return AssistantMessage(content=content, reasoning_content=reasoning), output.finish_reason
    reason = output.finish_reason if output.finish_reason != "stop" else "tool_calls"
    made = answer_calls(job.tools, calls, choice)
    if job.tools.legacy:
        return AssistantMessage(content=content or None, reasoning_content=reasoning, function_call=made[0].function), (
            "function_call" if reason == "tool_calls" else reason
        )
    return AssistantMessage(content=content or None, reasoning_content=reasoning, tool_calls=made), reason


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


async def _stream_events(job: Job) -> AsyncIterator[tuple[int, StreamChunk | FinishEvent | str | dict]]:
    """A chat or completions stream's events: (choice, event), a keep-alive as SSE_COMMENT and an error as its chunk
    in the event's place."""
    async for index, event in job.sink.events(keep_alive=True):
        if event is KEEP_ALIVE:
            yield index, SSE_COMMENT
        elif isinstance(event, ErrorEvent):
            yield index, _error_chunk(event, job)
        else:
            yield index, event


async def completion_chunks(job: Job) -> AsyncIterator[BaseModel | dict]:
    """One chunk per token with new text (tagged with its choice's index), a chunk with each choice's finish
    reason (and its statistics), then usage when asked."""
    pending: dict[int, list[TokenLogprob]] = {}
    outputs: list[GenerationOutput] = []
    async for index, event in _stream_events(job):
        if isinstance(event, str | dict):  # a keep-alive or an error: said as it is
            yield event
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


def _tool_deltas(job: Job, news: tuple) -> list[Delta]:
    """A tool stream's news as deltas, a chunk each: reasoning (a harmony stream's), content, then one call piece a
    chunk (OpenAI's form: a call's name, then its arguments; clients such as LlamaIndex read only a chunk's first
    entry). The legacy `functions` get the first call's pieces as function_call."""
    *reasoning, content, pieces = news
    deltas = [Delta(reasoning_content=reasoning[0])] if reasoning and reasoning[0] else []
    deltas += [Delta(content=content)] if content else []
    if job.tools.legacy:
        return deltas + [Delta(function_call=piece.function) for piece in pieces if piece.index == 0]
    return deltas + [Delta(tool_calls=[piece]) for piece in pieces]


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
    calling = job.tools is not None and job.tools.choice != "none"
    streams = {i: ToolStream(job.tools, job.tokenizer, i) for i in range(len(job.requests))} if calling else {}
    if job.harmony:
        streams = {i: HarmonyStream(job.tokenizer, job.tools, i) for i in range(len(job.requests))}
    async for index, event in _stream_events(job):
        if isinstance(event, str | dict):  # a keep-alive or an error: said as it is
            yield event
        elif isinstance(event, FinishEvent):
            outputs.append(event.output)
            stats = VerispecStats.from_stats(event.output.stats, event.queue_seconds)
            reason = event.output.finish_reason
            if index in streams:
                for delta in _tool_deltas(job, streams[index].finish(cut=reason == "length")):
                    yield chunk(index, delta)
                if streams[index].calls and reason == "stop":
                    reason = "function_call" if job.tools.legacy else "tool_calls"
            yield chunk(index, Delta(), reason, pending.pop(index, None), verispec=stats)
        elif index in streams:  # logprobs go with the next delta (the rest with the finish reason)
            if event.logprob is not None and job.wants_logprobs:
                pending.setdefault(index, []).append(event.logprob)
            if event.token_id is not None:
                for delta in _tool_deltas(job, streams[index].feed(event.token_id)):
                    yield chunk(index, delta, logprobs=pending.pop(index, None))
        elif (taken := _pending_logprobs(job, event, pending.setdefault(index, []))) is not None or event.text:
            yield chunk(index, Delta(content=event.text), logprobs=taken)
    if job.include_usage and len(outputs) == len(job.requests):
        yield ChatCompletionChunk(id=job.id, model=job.model, choices=[], usage=usage(outputs))
