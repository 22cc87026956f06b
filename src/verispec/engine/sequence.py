"""A running sequence, what a verification pass decided for it, and the slots that every room of the engine reads:
who runs in which slot, who waits, which requests are active."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..decoding.adjustments import LogitAdjustments
from ..decoding.grammar import GrammarMatcher
from ..decoding.logprobs import TokenLogprob
from ..decoding.noise import KeyedNoise
from ..decoding.stats import GenerationStats
from ..decoding.stopping import StopChecker
from .admission import WaitingQueue
from .draft_model import draft_view
from .requests import EngineRequest


@dataclass
class Sequence:
    request: EngineRequest
    slot: int
    tokens: list[int]  # prompt + generated; the target cache holds all but the last
    stopper: StopChecker
    stats: GenerationStats
    noise: KeyedNoise  # what a sampled token at each position is drawn with (decoding/noise.py)
    adjustments: LogitAdjustments
    grammar: GrammarMatcher | None  # the structured-output constraint's state after the emitted tokens
    admitted: float
    last_emit: float | None = None
    queue_seconds: float = 0.0
    prefilled: int = 0  # tokens of `context` (all but the last) in the target cache
    context: list[int] | None = None  # what its prefill reads: the prompt, or after a preemption all of `tokens`
    logprobs: list[TokenLogprob] | None = None  # the emitted tokens', when the request asks for them
    draft_cut: int = 0  # where the draft model's view of the context resumes after its sink (draft_model.draft_cut_for)

    @property
    def draft_tokens(self) -> list[int] | None:
        """What the draft model reads of the context (None: all of it)."""
        return draft_view(self.tokens, self.draft_cut) if self.draft_cut else None

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prefill_ids) - 1

    @property
    def prefill_ids(self) -> list[int]:
        return self.request.prompt_ids if self.context is None else self.context


@dataclass
class Verdict:
    """What a verification pass decided for one sequence."""

    accepted: int  # drafted tokens kept
    next_token: int  # the target's own token after them
    logprobs: list[TokenLogprob] | None  # of the accepted tokens and the next one, when asked for
    path: list[int] | None = None  # a token tree's accepted tokens (a chain's are its first `accepted`)


@dataclass
class Slots:
    """Who runs in which cache slot, who waits (per tenant: admission.py), which requests are active (waiting or
    running, by id). The server's threads submit and cancel while the loop steps: changes happen under `cond`."""

    count: int
    running: dict[int, Sequence] = field(default_factory=dict)
    waiting: WaitingQueue[EngineRequest | Sequence] = field(default_factory=WaitingQueue)
    active: dict[str, EngineRequest] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    free: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.free = list(range(self.count))


def request_of(item: EngineRequest | Sequence) -> EngineRequest:
    return item.request if isinstance(item, Sequence) else item
