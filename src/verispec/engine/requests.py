"""What a request hands the engine, and what the engine sends back: one event per streamed piece of text,
then the finished output (or an error)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..decoding.grammar import Grammar
from ..decoding.logprobs import TokenLogprob
from ..decoding.sampling import SamplingParams
from ..decoding.stats import GenerationStats


@dataclass
class GenerationOutput:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens or the context is full)
    stats: GenerationStats
    prompt_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked for them


@dataclass
class StreamChunk:
    """A piece of a request's output as it streams (the engine's token event, and what `stream` yields)."""

    text: str  # newly safe text, possibly empty (held back for a possible stop string)
    token_id: int | None  # the token it comes from; None for a final flush (after a stop token)
    output: GenerationOutput | None = None  # `stream`'s last chunk: the whole output
    logprob: TokenLogprob | None = None  # the token's, when the request asked for logprobs


@dataclass
class FinishEvent:
    output: GenerationOutput
    queue_seconds: float  # time from arrival to admission into a slot


@dataclass
class ErrorEvent:
    """The request failed. `error`: the request's own fault (an InvalidParameterError, such as a grammar that hit
    the grammar library's limits while generating), reported to its client as such; None: a fault of verispec's."""

    message: str
    error: Exception | None = None


Event = StreamChunk | FinishEvent | ErrorEvent

PRIVATE = "private:"  # a partition beginning so belongs to one request: no later request can read what it leaves


def is_private(partition: str) -> bool:
    """Whether no later request can share `partition`: then nothing of its request is kept once it ends (its output
    is not indexed for lookups, its prompt's blocks are not kept for reuse)."""
    return partition.startswith(PRIVATE)


@dataclass(kw_only=True)
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    sink: Callable[[Event], None]
    stop: list[str] = field(default_factory=list)
    speculative: bool = True
    ignore_eos: bool = False  # end tokens are ordinary tokens (benchmarks: every request generates max_tokens)
    logprobs: int | None = None  # None: no logprobs; N: each token's logprob and its N most likely alternatives
    grammar: Grammar | None = None  # structured output: every generated token within this grammar
    # what the request may draft from and reuse: requests of one partition share earlier outputs (suffix drafting)
    # and prefilled prompts; requests of different partitions nothing (the server's --cache-sharing: a tenant);
    # a PRIVATE one is the request's own (its n choices share it)
    partition: str = ""
    tenant: str = ""  # who is served fairly: admission takes turns between tenants (engine/admission.py)
    member: str = ""  # who within the tenant (the OpenAI `user` field): divides the tenant's share, never adds to it
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: bool = False

    @property
    def owner(self) -> tuple[str, str]:
        """(tenant, member): whose turn admission counts this request as."""
        return self.tenant, self.member
