"""How many tokens to draft next: the k with the most expected tokens per second, from measurements.

A round that drafts k tokens yields E(k) = (1 - a^(k+1)) / (1 - a) tokens on average (Leviathan et al.
2023; a = the chance a drafted token is accepted) and costs k * d + T(k+1) seconds (d = draft time per
drafted token, T(n) = one target pass over n tokens). k = 0 is plain decoding: 1 token in T(1). Each
round picks the k in 0..k_max with the highest E(k) / cost(k); when drafting stops paying (low
acceptance, a slow draft, an expensive verify pass), that is k = 0 and decoding runs at plain speed.

All three quantities are measured while generating, in the generator that owns this object (so they
carry over from one prompt to the next): a is a decayed count of accepted and rejected drafts, d and T(n)
are averages over the last few rounds: T(n) a median (one round slowed by other load must not flip a
decision), d a mean (a hybrid drafter mixes free lookups with model steps, and the mean is the cost). An
unmeasured T(n) is interpolated linearly between measured neighbours. The first rounds measure the
extremes (plain decoding, so that the first token comes after one target step, then k_max); every
`probe_every` rounds the choice's neighbours are tried, so the times follow the machine and a decision
can move.

None of this touches which tokens are emitted: any k gives the target's output (greedy) or its
distribution (sampling), so the controller only moves speed.
"""

from __future__ import annotations

import statistics
from collections import deque

from .acceptance import expected_tokens_per_round


class AdaptiveK:
    def __init__(self, k_max: int, probe_every: int = 16, window: int = 9, decay: float = 0.95):
        self.k_max = k_max
        self.probe_every = probe_every
        self.decay = decay
        self.accepted, self.rejected = 3.0, 1.0  # prior: a = 0.75, forgotten within a few dozen rounds
        self.draft_time: deque[float] = deque(maxlen=window)
        self.target_time: dict[int, deque[float]] = {n: deque(maxlen=window) for n in range(1, k_max + 2)}
        self.rounds = 0

    # ---- decisions --------------------------------------------------------------------------------
    def choose(self) -> int:
        self.rounds += 1
        if not self.target_time[1]:
            return 0  # plain first: the first token then streams after a single target step
        if not self.target_time[self.k_max + 1]:
            return self.k_max
        best = max(range(self.k_max + 1), key=self.expected_rate)
        if self.rounds % self.probe_every == 0:
            step = 1 if (self.rounds // self.probe_every) % 2 else -1
            return min(self.k_max, max(0, best + step))
        return best

    def expected_rate(self, k: int) -> float:
        """Expected tokens per second of a round drafting k tokens."""
        cost = self.target(k + 1) + (k * statistics.fmean(self.draft_time) if k and self.draft_time else 0.0)
        return self.expected_tokens(k) / cost

    def expected_tokens(self, k: int) -> float:
        return expected_tokens_per_round(self.acceptance, k)

    @property
    def acceptance(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def target(self, n: int) -> float:
        """T(n): the median measured, or interpolated between the nearest measured pass sizes."""
        measured = {m: statistics.median(t) for m, t in self.target_time.items() if t}
        if n in measured:
            return measured[n]
        below = max((m for m in measured if m < n), default=None)
        above = min((m for m in measured if m > n), default=None)
        if below is None or above is None:
            return measured[above if below is None else below]
        share = (n - below) / (above - below)
        return measured[below] + share * (measured[above] - measured[below])

    # ---- measurements -----------------------------------------------------------------------------
    def record(self, drafted: int, accepted: int, draft_seconds: float, target_seconds: float) -> None:
        """One round: `drafted` tokens proposed, `accepted` of them kept, and what each part took."""
        if drafted:
            self.draft_time.append(draft_seconds / drafted)
            self.accepted = self.decay * self.accepted + accepted
            self.rejected = self.decay * self.rejected + (accepted < drafted)
        if drafted + 1 in self.target_time:
            self.target_time[drafted + 1].append(target_seconds)
