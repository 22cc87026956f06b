"""When drafting pays: the scheduler's rule for suspending speculation, from costs measured online.

A step over B running sequences, S of which may draft, either
    drafts:  yields sum(E_i for the S drafting) + (B - S) tokens in  draft(S) + verify(B)  seconds, or
    doesn't: yields B tokens                                      in  plain(B)              seconds,
where E_i is sequence i's measured tokens per speculative round (1 + accepted drafts; the prior for a new
sequence is the server-wide average), draft(S) the time to draft k tokens for S sequences, verify(B) one
target pass over B rows of k+1 tokens and plain(B) one over B rows of 1 token. The scheduler drafts when
the first rate (tokens/s) beats the second.

The three times are medians of the last 9 steps per batch size, taken from the steps the server actually
runs (a median, so that one step slowed by other load cannot flip the decision), and drafting must win by
`margin` (5%), since resuming it also costs the draft model's catch-up, which the rates leave out. A
batch size seen for the first time tries drafting, then plain decoding, so both are measured; after that
every `probe_every`-th step at a batch size runs the mode that was *not* chosen, so the numbers follow the
machine (warm-up, other load) and a decision can flip back. A probe costs a slow step, so the interval
doubles (up to `max_probe_interval`) each time the decision stays the same, and drops back to
`probe_every` when it changes; and probes are spaced so that their measured cost (time spent at the
lower rate, plus the draft model catching up on the tokens it skipped while suspended) stays under
`probe_budget` of the throughput. Catching up is kept out of draft(S), which is the steady-state cost;
its price is the draft's measured seconds per caught-up token times the tokens the draft now lacks, which
grows the longer drafting stays suspended (a median of past catch-ups would underestimate it).

On a GPU the target is memory-bound and verify(B) ~ plain(B) until B*(k+1) tokens fill the chip; on a
2-core CPU the target is compute-bound already at a few rows, verify(B) ~ (k+1)*plain(B), and drafting
stops paying at a small batch. The rule needs no per-machine constant for either case.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict, deque
from dataclasses import dataclass, field

POLICIES = ("auto", "always", "never")


@dataclass
class _Average:
    """Exponential moving average (for tokens per round, whose mean is what matters)."""

    value: float | None = None

    def add(self, sample: float, smoothing: float) -> None:
        self.value = sample if self.value is None else (1 - smoothing) * self.value + smoothing * sample


@dataclass
class _Median:
    """Median of the last samples (for step times: one step slowed by other load must not flip a decision)."""

    window: int = 9
    samples: deque[float] = field(default_factory=deque)

    @property
    def value(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    def add(self, sample: float) -> None:
        self.samples.append(sample)
        if len(self.samples) > self.window:
            self.samples.popleft()


@dataclass
class _Probing:
    interval: int
    since: int = 0
    last_choice: bool | None = None


@dataclass
class DraftPolicy:
    mode: str = "auto"
    probe_every: int = 8
    max_probe_interval: int = 256
    probe_budget: float = 0.02  # probes may cost at most this share of throughput
    margin: float = 0.05  # drafting must be this much faster to be chosen (it has costs the rates miss)
    prior_weight: float = 2.0  # a new sequence's E counts as this many rounds at the server-wide average
    plain: dict[int, _Median] = field(default_factory=lambda: defaultdict(_Median))
    verify: dict[int, _Median] = field(default_factory=lambda: defaultdict(_Median))
    draft: dict[int, _Median] = field(default_factory=lambda: defaultdict(_Median))
    round_tokens: _Average = field(default_factory=_Average)  # server-wide tokens per speculative round
    catch_up: _Median = field(default_factory=_Median)  # draft catch-up seconds per token when drafting resumes
    probing: dict[int, _Probing] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise ValueError(f"draft policy must be one of {', '.join(POLICIES)}, got {self.mode!r}")

    def expected_tokens(self, rounds: int, tokens: int) -> float:
        """E for a sequence that produced `tokens` in `rounds` speculative rounds so far."""
        prior = self.round_tokens.value or 2.0
        return (tokens + self.prior_weight * prior) / (rounds + self.prior_weight)

    def should_draft(self, batch: int, expected: list[float], lag_tokens: int = 0) -> bool:
        """Whether this step drafts; `expected` holds E_i of the sequences that may draft, `lag_tokens` the
        tokens the draft model would have to catch up on first (summed over those sequences)."""
        if not expected or self.mode == "never":
            return False
        if self.mode == "always":
            return True
        if self.verify[batch].value is None or self.draft[len(expected)].value is None:
            return True
        if self.plain[batch].value is None:
            return False
        drafting_rate, plain_rate = self.drafting_rate(batch, expected), self.plain_rate(batch)
        choice = drafting_rate > plain_rate * (1 + self.margin)
        step_seconds = (self.draft[len(expected)].value + self.verify[batch].value, self.plain[batch].value)
        chosen, other = step_seconds if choice else step_seconds[::-1]
        loss = other * (1 - min(drafting_rate, plain_rate) / max(drafting_rate, plain_rate))  # a probe's cost
        if not choice:  # a drafting probe also pays for the draft catching up
            loss += lag_tokens * (self.catch_up.value or 0.0)
        return self._maybe_probe(batch, choice, math.ceil(loss / (self.probe_budget * chosen)))

    def _maybe_probe(self, batch: int, choice: bool, min_interval: int) -> bool:
        probing = self.probing.setdefault(batch, _Probing(self.probe_every))
        if probing.last_choice is not None and choice != probing.last_choice:
            probing.interval = self.probe_every
        probing.last_choice = choice
        probing.since += 1
        if probing.since < max(probing.interval, min_interval):
            return choice
        probing.since = 0
        probing.interval = min(2 * probing.interval, self.max_probe_interval)
        return not choice

    def drafting_rate(self, batch: int, expected: list[float]) -> float:
        seconds = self.draft[len(expected)].value + self.verify[batch].value
        return (sum(expected) + batch - len(expected)) / seconds

    def plain_rate(self, batch: int) -> float:
        return batch / self.plain[batch].value

    def record(
        self, batch: int, drafting: int, draft_seconds: float, verify_seconds: float,
        catch_up_seconds: float = 0.0, catch_up_tokens: int = 0,
    ) -> None:  # fmt: skip
        """Times of one step; `drafting` is how many sequences drafted (0: a plain step)."""
        if drafting:
            self.draft[drafting].add(draft_seconds)
            self.verify[batch].add(verify_seconds)
            if catch_up_tokens:
                self.catch_up.add(catch_up_seconds / catch_up_tokens)
        else:
            self.plain[batch].add(verify_seconds)

    def record_round(self, tokens: int) -> None:
        self.round_tokens.add(tokens, 0.1)
