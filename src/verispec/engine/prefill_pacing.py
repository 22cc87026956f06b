"""How a prompt's prefill shares the loop with others' decoding.

A prefill chunk costs many decode steps (128 prompt tokens take 0.5-1.7 s on two cores, where a decode step takes
25-40 ms), and the loop runs one or the other. Left alone, one tenant's long prompt paced another's short answer: a
chunk before every one of its tokens (9 tokens in 6-10 s against 0.23 s alone). Rules, while a sequence of another
owner (another tenant, or another member of the prefilling one: admission.py) is decoding:

- Prefill gets at most half of the loop's time: a chunk's seconds are owed, and the next chunk waits until the decode
  steps since have paid them back. A decoding bystander waits at most the chunk already under way, then runs at
  least as long as that chunk took.
- On a row-invariant target (the native stack: a row's bits do not depend on the other rows of its pass, so where a
  chunk is cut changes no bit), a chunk is cut to SLICE_SECONDS at the measured prefill rate, at least
  MIN_SLICE_TOKENS, and stays so for RECENT_SECONDS after another owner last decoded: a client that sends its next
  request as soon as the last one ends would otherwise find a whole chunk under way each time (a 16-token answer
  beside a 3,500-token prompt: 3.3x its time alone, 0.6 s of it waiting for such chunks). Elsewhere chunks keep their
  configured length, cut at the same places whatever else runs (a request's output must not depend on its
  neighbours).

With no other owner decoding for RECENT_SECONDS, prompts prefill in whole chunks back to back and owe nothing.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

SLICE_SECONDS = 0.2  # the longest a chunk runs while another owner decodes (where chunks may be cut anywhere)
RECENT_SECONDS = 2.0  # chunks stay that short this long after another owner last decoded
MIN_SLICE_TOKENS = 16  # a chunk reads every weight once: shorter ones would spend the slice reading, not computing
RATE_WINDOW = 8  # chunks whose rate is remembered


@dataclass
class PrefillPacer:
    """When the next prefill chunk runs and how long it is (the rules above)."""

    chunk_tokens: int  # a chunk's configured length (SchedulerConfig.prefill_chunk)
    resizable: bool  # chunks may be cut anywhere: the target's passes are row-invariant
    owed: float = 0.0  # seconds of prefill run beside others' decoding, not yet paid back by decode steps
    rates: deque[float] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))  # seconds per prefilled token
    contended_at: float = -math.inf  # when another owner was last seen decoding

    def waits(self, contended: bool) -> bool:
        """Whether the next chunk waits this step; `contended`: another owner is decoding."""
        if contended:
            self.contended_at = time.perf_counter()
        else:
            self.owed = 0.0
        return self.owed > 0.0

    def tokens(self, contended: bool) -> int:
        """The length of the next chunk."""
        recently = contended or time.perf_counter() - self.contended_at < RECENT_SECONDS
        if not (recently and self.resizable and self.rates):
            return self.chunk_tokens
        per_token = min(self.rates)  # other load only ever slows a chunk: its least is the machine's own rate
        return max(MIN_SLICE_TOKENS, min(self.chunk_tokens, int(SLICE_SECONDS / per_token)))

    def prefilled(self, seconds: float, tokens: int, contended: bool) -> None:
        """A chunk of `tokens` prompt tokens took `seconds`."""
        if tokens:
            self.rates.append(seconds / tokens)
        if contended:
            self.owed += seconds

    def decoded(self, seconds: float) -> None:
        """A decode step took `seconds`: they pay back what prefill owes."""
        self.owed = max(0.0, self.owed - seconds)
