"""How many tokens each engine step drafts (k = 0: plain decoding), chosen from costs measured online.

A step over B running sequences that drafts k tokens for the S of them that may draft yields

    sum_i E(a_i, k_i) + (B - S) tokens   in   draft(S, k) + verify(B, k) seconds

(k = 0: B tokens in verify(B, 0) seconds), where E(a, k) = (1 - a^(k+1)) / (1 - a) is the expected yield of
a round (Leviathan et al. 2023), a_i sequence i's acceptance rate so far (a new sequence starts from the
engine-wide rate, weighted as `prior_weight` drafts), k_i = min(k, what sequence i may still draft),
draft(S, k) the time to draft k tokens for S sequences and verify(B, k) one target pass over B rows of k+1
tokens. Rules:

- The step runs the k with the most tokens per second; a k > 0 must beat plain decoding by `margin`.
- Resuming drafting first costs the draft's catch-up on the tokens it skipped (BatchedDrafter.lag, priced
  at the measured seconds per caught-up token and kept out of draft(S, k)); that price is spread over the
  tokens the drafting sequences may still generate less those their lookups are expected to give
  (`lookup_coverage`), and those looked-up tokens are priced as catch-up too (the draft reads them before it
  drafts again): a sequence near its end does not resume, and one that copies its prompt does not read that
  prompt, and then every copied stretch, into the draft model for the few tokens no lookup finds.
- A k is chosen per batch size, not just on or off: whether k+1 rows cost one block of a CPU matmul or
  more, or fill a GPU, the measurements show.
- Times are kept at the machine's reference speed. Each step's time over its cell's gives the machine's
  current slowdown; a step's sample counts only if at least `paired_steps` of the last 5 steps were of
  other cells, and is stored divided by their median slowdown; the chosen cell's own steps only track
  the slowdown. A cell's time is the median of its last 9 samples, the smaller of the first two until
  there are 3 (one step slowed by other load, which only ever slows, must not flip a decision).
- A new batch size starts with plain steps (the baseline). A k not yet measured twice there is tried only
  beside enough other steps for its samples to be paired, and only if a guess of its rate beats plain's by
  the margin: its cost guessed as the larger of what measured steps that do no more work cost and plain's
  cost here times the (draft + verify) / plain ratio measured at the nearest smaller batch size.
- Every `probe_every`-th step at a batch size runs a neighbour of the chosen k (k - 1 and k + 1 in turn),
  so the numbers follow the machine; the interval doubles (up to `max_probe_interval`) while the choice
  holds and drops back when it changes, and probes are spaced so that their measured cost (time lost at
  the lower rate, plus the catch-up they cause) stays under `probe_budget` of the throughput.
- The tokens a sequence may still generate are what its answer is expected to run to, not its max_tokens: the mean,
  over the last `answer_window` finished answers longer than what it has written, of what they wrote past that
  point (within what it may still write; an answer cut at its own max_tokens counts as running on to that), with
  that most counted as `answer_prior` more answers (nothing is known of a new server's answers). Short answers (a
  question answered in a sentence, a translation) then stand down rather than pay a catch-up that 20 tokens
  cannot win back.
- A catch-up may wait for evidence: while the sequences it is for have written fewer than `evidence_tokens` tokens,
  it is paid only if paying it now is worth more than paying it once they have (those whose answers end before,
  or that no longer repay it then, never pay it), over the answers expected_left weighs: waiting loses what
  drafting would save over the tokens until then, paying now loses the catch-up on every answer too short to
  repay it. Paid at once, a long prompt's catch-up was lost where short answers are common (a RAG answer of
  15-20 tokens after a 700-token prompt: 0.4 s that drafting never won back); where answers run long, or
  nothing is known of them yet, it is paid at once, as before.
- The server-wide acceptance of the draft model fades back to its prior (`accepted`, `rejected`: 0.6) in the rounds
  where the model does not draft, as fast as it decays in those where it does: an acceptance learned on one kind
  of text (a translation's 0.5) would otherwise keep the model off for good, since only its own rounds update it.
- While a prompt prefills or waits for a slot (a burst starts), nothing drafts.
- A resting draft model is tried again (k = 1 for one step) on a schedule bounded in cost: while the choice is plain
  decoding, credit accrues at `explore_share` of each step's seconds, and a step explores once the credit pays what
  exploring costs it (the step's extra seconds over plain, at least one plain step, and the catch-up). What turned it
  off (another kind of text, a burst of load while its costs were measured, short answers) may have passed; only a
  round of its own shows that: its acceptance on today's text, its cost on today's machine. A cell whose newest
  sample is older than `stale_steps` steps starts again from its next sample (its old ones were another machine's
  load), so the fresh measurements decide.
- A lookup (suffix drafting: tokens copied from text already seen, free to draft) is priced by the measured cost
  of a pass over as many rows as it adds: every target pass is recorded by its rows, and `row_cost` gives what n
  more rows cost over a pass without them (measured, interpolated, or extrapolated along the last two measured
  widths). A width's cost is the least of its last passes (other load only ever slows a pass), and the costs are
  made non-decreasing in the width (a wider pass never costs less; a width measured only while the machine was
  busy is pooled with its wider neighbours). With no wider pass measured yet a lookup drafts unpriced, so that
  one gets measured. On a CPU whose products are compute-bound (AVX2 without VNNI: a pass of 4 rows costs 2.5
  plain steps) a lookup that is seldom accepted is cut short or not drafted at all; where a pass of 16 rows costs
  little more than one, it drafts in full.

Why each rule is there (the runs that showed it): docs/server.md, "Why the policy's rules are what they are".
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from ..decoding.acceptance import expected_tokens_per_round, smoothed_acceptance

POLICIES = ("auto", "always", "never")


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """The times of one engine step over `batch` sequences, `drafting` of which drafted up to k tokens (k = 0: a
    plain step)."""

    batch: int
    drafting: int
    k: int
    draft_seconds: float  # drafting, the draft model's catch-up included
    verify_seconds: float
    catch_up_seconds: float = 0.0  # the draft model's catch-up alone
    catch_up_tokens: int = 0
    modelled: bool = True  # the draft model ran (else every drafting sequence looked its tokens up)


# a sequence's alpha (of its lookups, of its draft model) before any round: PRIOR, counted as PRIOR_WEIGHT drafts
PRIOR, PRIOR_WEIGHT = 0.8, 5
# the server-wide counts of the draft model's accepted drafts and rejections before any round (a = 0.6)
ACCEPTED_PRIOR, REJECTED_PRIOR = 3.0, 2.0


def estimated_alpha(accepted: int, rejected: int) -> float:
    """A sequence's chance that a token one proposer (its lookups, or its draft model) drafted is accepted."""
    return smoothed_acceptance(accepted, rejected, PRIOR, PRIOR_WEIGHT)


@dataclass
class _StepTime:
    """A step time from its last samples: the median of up to 9, the smaller of the first two (so that one
    step slowed by other load, which only ever makes a step slower, cannot flip a decision)."""

    window: int = 9
    samples: deque[float] = field(default_factory=deque)
    last: int = 0  # the policy's step count at the newest sample

    @property
    def measured(self) -> bool:
        return len(self.samples) >= 2

    @property
    def value(self) -> float:
        if len(self.samples) < 3:
            return min(self.samples)
        return statistics.median(self.samples)

    def add(self, sample: float, now: int = 0, stale: int | None = None) -> None:
        """A sample at the policy's step `now`; one more than `stale` steps after the last clears the older ones."""
        if stale is not None and now - self.last > stale:
            self.samples.clear()
        self.last = now
        self.samples.append(sample)
        if len(self.samples) > self.window:
            self.samples.popleft()


PASS_WINDOW = 9  # a pass width's cost: the least of its last this many passes


def _non_decreasing(points: list[tuple[int, float, int]]) -> list[tuple[int, float]]:
    """(width, seconds, samples) sorted by width, made non-decreasing in the width by pooling adjacent violators
    (the least-squares fit weighted by samples): a width that looks dearer than a wider one, because only busy
    moments measured it, is pooled with it."""
    pools: list[list[float]] = []  # [seconds x samples, samples, number of widths]
    for _, seconds, samples in points:
        pools.append([seconds * samples, samples, 1])
        while len(pools) > 1 and pools[-2][0] / pools[-2][1] > pools[-1][0] / pools[-1][1]:
            total, weight, widths = pools.pop()
            pools[-1] = [pools[-1][0] + total, pools[-1][1] + weight, pools[-1][2] + widths]
    fitted = [total / weight for total, weight, widths in pools for _ in range(widths)]
    return [(width, seconds) for (width, _, _), seconds in zip(points, fitted, strict=True)]


@dataclass
class _DraftTime:
    """Drafting seconds of a (drafting rows, k) cell, the steps that ran the draft model kept apart from those
    that only looked tokens up (a hybrid proposer), mixed by the share of steps that ran the model
    (DraftPolicy.model_share). That share depends on the texts, not on k; one window of mixed samples made a
    cell's cost whatever kind its few samples happened to be (a k = 2 cell of 3 lookups and 3 model steps
    priced its drafting at half a k = 1 step's and was chosen over k = 3 for good)."""

    model: _StepTime = field(default_factory=_StepTime)
    lookup: _StepTime = field(default_factory=_StepTime)

    def value(self, model_share: float) -> float | None:
        """The expected drafting seconds, None while a kind the share still expects is unmeasured (lookups,
        nearly free, count as 0 until measured)."""
        lookup = self.lookup.value if self.lookup.samples else 0.0
        if model_share < 0.01:
            return lookup
        if not self.model.measured:
            return None
        return model_share * self.model.value + (1 - model_share) * lookup

    def add(self, sample: float, modelled: bool, now: int = 0, stale: int | None = None) -> None:
        (self.model if modelled else self.lookup).add(sample, now, stale)


@dataclass
class _Probing:
    interval: int
    since: int = 0
    last_choice: int | None = None
    probes: int = 0  # alternates the neighbour a probe tries


@dataclass(frozen=True, kw_only=True)
class PolicySettings:
    """What a DraftPolicy is told; what it learns is its own state."""

    k_max: int = 4
    mode: str = "auto"
    probe_every: int = 8
    max_probe_interval: int = 256
    probe_budget: float = 0.005  # probes may cost at most this share of throughput
    margin: float = 0.10  # drafting must be this much faster than plain decoding to be chosen
    prior_weight: float = 4.0  # a new sequence's acceptance counts as this many drafts at the server-wide rate
    decay: float = 0.99  # per round, for the server-wide acceptance counts
    coverage_weight: float = 16.0  # a sequence's own lookup coverage counts against the server's as this many tokens
    # until the draft has caught up once, a caught-up token is priced at this share of a prefilled one: a draft
    # costing more than half its target rarely pays, so the guess errs on the side of not drafting
    draft_share_guess: float = 0.5
    paired_steps: int = 3  # a sample counts if at least this many of the last 5 steps were of other cells
    answer_window: int = 64  # finished answers remembered for the expected answer length
    answer_prior: float = 2.0  # a sequence's own max_tokens counts as this many answers
    evidence_tokens: int = 16  # a sequence's tokens before a catch-up dearer than their drafting's gain is paid
    explore_share: float = 0.02  # a resting draft model's trials may cost at most this share of the steps' time
    stale_steps: int = 1024  # a cell not measured for this many steps starts again from its next sample

    def __post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise ValueError(f"draft policy must be one of {', '.join(POLICIES)}, got {self.mode!r}")
        if not 0.0 <= self.explore_share < 1.0:
            raise ValueError(f"explore_share must be in [0, 1), got {self.explore_share}")


@dataclass
class _Exploring:
    """A resting draft model's trials: the credit they may spend, and how many were run."""

    credit: float = 0.0
    trials: int = 0
    resting: bool = False  # the last choice (a trial or probe aside) was plain decoding


@dataclass
class DraftPolicy:
    settings: PolicySettings = PolicySettings()
    verify: dict[tuple[int, int], _StepTime] = field(default_factory=dict)  # (rows, k) -> target pass seconds
    draft: dict[tuple[int, int], _DraftTime] = field(default_factory=dict)  # (drafting rows, k) -> drafting seconds
    passes: dict[int, deque[float]] = field(default_factory=dict)  # rows of a target pass -> its last seconds
    # decayed counts of drafting steps that ran the draft model and of those that only looked tokens up
    model_steps: float = 0.0
    lookup_steps: float = 0.0
    # server-wide decayed counts of the draft model's accepted drafts and rejections, from their prior (a = 0.6)
    accepted: float = ACCEPTED_PRIOR
    rejected: float = REJECTED_PRIOR
    # server-wide decayed counts of generated tokens and of those that were accepted lookups (prior: none)
    tokens: float = 0.0
    looked_up_tokens: float = 0.0
    catch_up: _StepTime = field(default_factory=_StepTime)  # draft seconds per caught-up token
    prefill: _StepTime = field(default_factory=_StepTime)  # target seconds per prefilled prompt token
    # the last steps: ((batch, k), their time over their cell's), the machine's current slowdown
    recent: deque[tuple[tuple[int, int], float]] = field(default_factory=lambda: deque(maxlen=5))
    probing: dict[int, _Probing] = field(default_factory=dict)
    # the last finished answers: (tokens written, whether it stopped by itself rather than at its max_tokens)
    answers: deque[tuple[int, bool]] = field(default_factory=deque)
    steps: int = 0  # steps recorded (the clock of the cells' ages)
    exploring: _Exploring = field(default_factory=_Exploring)

    def record_answer(self, length: int, stopped: bool) -> None:
        """A sequence finished after writing `length` tokens: `stopped` by an end token or a stop string, or cut."""
        self.answers.append((length, stopped))
        if len(self.answers) > self.settings.answer_window:
            self.answers.popleft()

    def expected_left(self, written: int, most: int) -> float:
        """The tokens a sequence that wrote `written` and may write `most` more is expected to write: what past
        answers longer than `written` wrote past it (at most `most`; a cut one would have run on: `most`), with
        `most` itself weighted answer_prior."""
        longer = self._lengths_left(written, most)
        prior = self.settings.answer_prior
        return (sum(longer) + prior * most) / (len(longer) + prior)

    def _lengths_left(self, written: int, most: int) -> list[int]:
        """What each past answer longer than `written` wrote past it, at most `most` (a cut one: `most`)."""
        return [min(length - written, most) if stopped else most for length, stopped in self.answers
                if length > written]  # fmt: skip

    def acceptance(self, accepted: int, rejected: int) -> float:
        """A sequence's acceptance rate of the draft model's drafts after `accepted` of them accepted and
        `rejected` rejections (its lookups' not counted)."""
        prior = self.accepted / (self.accepted + self.rejected)
        return smoothed_acceptance(accepted, rejected, prior, self.settings.prior_weight)

    def choose_k(
        self, batch: int, acceptance: list[float], limits: list[int], *, lag_tokens: int = 0,
        remaining_tokens: float | None = None, joining: bool = False, covered_tokens: float = 0.0,
        young: list[tuple[int, int]] | None = None,
    ) -> int:  # fmt: skip
        """The k this step drafts. `acceptance` and `limits` (the most each may draft, >= 1) are those of the
        sequences that may draft; `lag_tokens` is what the draft must catch up on first, and `remaining_tokens`
        the most those sequences may still generate less `covered_tokens`, what their lookups are expected to
        give (which the draft reads before it drafts again; None: unknown), each summed over them; `young` the (tokens
        written, most it may write) of each lagging one that has written fewer than evidence_tokens. `joining`: a
        prompt
        is still prefilling or waiting for a free slot, so a burst is starting; drafting for the sequences
        already decoding would only finish them before the joining ones (the burst ends no sooner) and read
        their prompts into the draft."""
        if not acceptance or self.settings.mode == "never":
            return 0
        if self.settings.mode == "always":
            return self.settings.k_max
        if joining:
            return 0
        tokens = {k: self._tokens(batch, k, acceptance, limits) for k in range(self.settings.k_max + 1)}
        seconds = {k: s for k in tokens if (s := self.seconds(batch, len(acceptance), k)) is not None}
        rates = {k: tokens[k] / seconds[k] for k in seconds}
        if 0 not in rates:
            return 0  # a batch size starts with plain steps: the baseline every draft length must beat
        if young and self._catch_up_waits(rates, lag_tokens, young):
            return 0
        to_read = lag_tokens + covered_tokens
        worth = self._rates_after_catch_up(rates, to_read, remaining_tokens)
        guesses = {k: tokens[k] / self._guess_seconds(batch, len(acceptance), k) for k in tokens if k not in rates}
        for k, guess in sorted(self._rates_after_catch_up(guesses, to_read, remaining_tokens).items(), reverse=True):
            if guess > max(worth.values()) * (1 + self.settings.margin):
                # might win: measure it, beside enough other steps that its first samples count as paired
                return k if len(self.recent) >= self.settings.paired_steps else 0
        choice = max(worth, key=worth.__getitem__)
        if choice and 0 in worth and worth[choice] <= worth[0] * (1 + self.settings.margin):
            choice = 0
        self.exploring.resting = choice == 0
        if choice == 0 and self._explores(batch, len(acceptance), seconds[0], lag_tokens):
            return 1
        return self._maybe_probe(batch, choice, rates=rates, seconds=seconds, lag_tokens=lag_tokens)

    def _explores(self, batch: int, drafting: int, plain: float, lag_tokens: int) -> bool:
        """Whether this step, whose choice is plain decoding, tries the draft model again (k = 1): once the credit
        accrued at explore_share of each resting step's `plain` seconds pays the trial's cost (its extra seconds over
        plain, at least one plain step, and the catch-up on `lag_tokens`); the credit never holds more than the trial
        at hand costs, so trials are spaced, not saved up for a burst."""
        if not self.settings.explore_share:
            return False
        measured = self.seconds(batch, drafting, 1)
        step = measured if measured is not None else self._guess_seconds(batch, drafting, 1)
        cost = max(step - plain, plain) + self._catch_up_price(lag_tokens)
        exploring = self.exploring
        exploring.credit = min(exploring.credit + self.settings.explore_share * plain, cost)
        if exploring.credit < cost:
            return False
        exploring.credit = 0.0
        exploring.trials += 1
        return True

    def _catch_up_waits(self, rates: dict[int, float], lag_tokens: int, young: list[tuple[int, int]]) -> bool:
        """Whether the catch-up on `lag_tokens`, shared by the `young` sequences, is better paid once they have
        written evidence_tokens tokens than now, drafting at the best measured k."""
        best = max(rates, key=rates.__getitem__)
        if not lag_tokens or not best:
            return False
        saved = 1 / rates[0] - 1 / rates[best]  # seconds a drafted token saves
        price = self._catch_up_price(lag_tokens) / len(young)
        return sum(self._waiting_gain(written, most, saved, price) for written, most in young) > 0

    def _waiting_gain(self, written: int, most: int, saved: float, price: float) -> float:
        """What paying a catch-up of `price` seconds after evidence_tokens tokens gains over paying it now, for a
        sequence that wrote `written` and may write `most` more, each drafted token saving `saved` seconds: over
        the answers expected_left weighs (the sequence's own `most` as answer_prior of them)."""
        wait = self.settings.evidence_tokens - written
        weighted = [(left, 1.0) for left in self._lengths_left(written, most)] + [(most, self.settings.answer_prior)]
        now = sum(weight * (saved * left - price) for left, weight in weighted)
        later = sum(weight * max(0.0, saved * (left - wait) - price) for left, weight in weighted if left > wait)
        return later - now

    def _rates_after_catch_up(
        self, rates: dict[int, float], lag_tokens: float, remaining_tokens: float | None
    ) -> dict[int, float]:
        """Drafting rates with the draft's catch-up on `lag_tokens` spread over the `remaining_tokens` it would
        draft: resuming drafting near the end of a long sequence costs more than it can win back."""
        price = self._catch_up_token_price()
        if not lag_tokens or remaining_tokens is None or not price:
            return rates
        per_token = lag_tokens * price / max(remaining_tokens, 1.0)
        return {k: 1 / (1 / rate + per_token) if k else rate for k, rate in rates.items()}

    def seconds(self, batch: int, drafting: int, k: int) -> float | None:
        """Measured seconds of a step, None if not yet measured twice."""
        verify = self.verify.get((batch, k))
        if verify is None or not verify.measured:
            return None
        if not k:
            return verify.value
        draft = self.draft_seconds(drafting, k)
        return None if draft is None else verify.value + draft

    @property
    def model_share(self) -> float:
        """The share of drafting steps that ran the draft model (1 before any)."""
        total = self.model_steps + self.lookup_steps
        return self.model_steps / total if total else 1.0

    def draft_seconds(self, drafting: int, k: int) -> float | None:
        """Expected drafting seconds of k tokens for `drafting` sequences, None if not yet measured."""
        draft = self.draft.get((drafting, k))
        return None if draft is None else draft.value(self.model_share)

    def model_price(self, batch: int, drafting: int, k: int, lag_tokens: int) -> float:
        """What running the draft model for one sequence adds to a step of `batch` rows verifying k drafts, over
        that verify pass: its share of the model's drafting for `drafting` sequences, and its catch-up on
        `lag_tokens`. 0 while either pass is unmeasured (the choice then compares expected tokens alone)."""
        verify, draft = self.verify.get((batch, k)), self.draft.get((drafting, k))
        if verify is None or not verify.measured or draft is None or not draft.model.measured:
            return 0.0
        return (draft.model.value / drafting + self._catch_up_price(lag_tokens)) / verify.value

    def _tokens(self, batch: int, k: int, acceptance: list[float], limits: list[int]) -> float:
        drafted = sum(expected_tokens_per_round(a, min(k, n)) for a, n in zip(acceptance, limits, strict=True))
        return drafted + batch - len(acceptance)

    def _guess_seconds(self, batch: int, drafting: int, k: int) -> float:
        """An unmeasured step's seconds: at least the lower bound, and at least plain's seconds at this batch size
        times the (draft + verify) / plain ratio measured at the nearest smaller one (on a CPU that ratio stays
        large as the batch grows, on a GPU it stays near 1)."""
        guess = self._lower_bound(batch, drafting, k)
        for smaller in range(batch - 1, 0, -1):
            drafted, plain = self.seconds(smaller, smaller, k), self.seconds(smaller, 0, 0)
            if drafted is not None and plain is not None:
                return max(guess, drafted / plain * self.seconds(batch, 0, 0))
        return guess

    def _lower_bound(self, batch: int, drafting: int, k: int) -> float:
        """A step costs at least what any measured step over no more sequences and no more tokens cost (a
        measured (b, j) pass had at most b (j + 1) tokens), and its drafting what any with no more sequences
        and no larger k cost."""
        rows = drafting * (k + 1) + batch - drafting
        verify = max(
            (m.value for (b, j), m in self.verify.items() if b <= batch and b * (j + 1) <= rows and m.measured),
            default=0.0,
        )
        if not k:
            return verify
        drafts = (self.draft_seconds(s, j) for s, j in self.draft if s <= drafting and j <= k)
        return verify + max((d for d in drafts if d is not None), default=0.0)

    def _maybe_probe(
        self, batch: int, choice: int, rates: dict[int, float], seconds: dict[int, float], lag_tokens: int
    ) -> int:
        probing = self.probing.setdefault(batch, _Probing(self.settings.probe_every))
        if probing.last_choice is not None and choice != probing.last_choice:
            probing.interval = self.settings.probe_every
        probing.last_choice = choice
        probing.since += 1
        neighbours = [k for k in (choice - 1, choice + 1) if k in rates]
        if not neighbours:
            return choice
        other = neighbours[probing.probes % len(neighbours)]
        loss = seconds[other] * max(0.0, 1 - rates[other] / rates[choice])  # a probe's cost
        if choice == 0:  # a drafting probe also pays for the draft catching up
            loss += self._catch_up_price(lag_tokens)
        if probing.since < max(probing.interval, math.ceil(loss / (self.settings.probe_budget * seconds[choice]))):
            return choice
        probing.since = 0
        probing.probes += 1
        probing.interval = min(2 * probing.interval, self.settings.max_probe_interval)
        return other

    def _catch_up_price(self, lag_tokens: int) -> float:
        return lag_tokens * self._catch_up_token_price()

    def _catch_up_token_price(self) -> float:
        """Seconds per caught-up token: the cheapest measured (the marginal cost of a long catch-up; a short one
        also carries the fixed cost of a draft pass, which would price a new prompt's catch-up out of reach), or
        before any, `draft_share_guess` of a prefilled token (0 while neither is measured)."""
        if self.catch_up.samples:
            return min(self.catch_up.samples)
        return self.settings.draft_share_guess * min(self.prefill.samples) if self.prefill.samples else 0.0

    def record_prefill(self, seconds: float, tokens: int) -> None:
        """A prompt chunk the target prefilled (the guess of a catch-up's price until one is measured)."""
        if tokens:
            self.prefill.add(seconds / tokens / self.slowdown)

    @property
    def slowdown(self) -> float:
        """How much slower than the reference the machine runs now (1.0 until measured)."""
        return statistics.median(r for _, r in self.recent) if self.recent else 1.0

    def record(self, cost: StepCost) -> None:
        """The times of one step (StepCost)."""
        batch, drafting, k, modelled = cost.batch, cost.drafting, cost.k, cost.modelled
        draft_seconds, verify_seconds = cost.draft_seconds - cost.catch_up_seconds, cost.verify_seconds
        catch_up_seconds, catch_up_tokens = cost.catch_up_seconds, cost.catch_up_tokens
        cell = (batch, k)
        self.steps += 1
        now, stale = self.steps, self.settings.stale_steps
        verify = self.verify.setdefault(cell, _StepTime())
        others = [r for c, r in self.recent if c != cell]
        paired = len(others) >= self.settings.paired_steps
        draft = self.draft.setdefault((drafting, k), _DraftTime()) if k else None
        if k:
            self.model_steps = self.settings.decay * self.model_steps + modelled
            self.lookup_steps = self.settings.decay * self.lookup_steps + (not modelled)
        if paired or not verify.measured:  # measured beside other cells' steps, or still calibrating
            slowdown = statistics.median(others) if paired else self.slowdown
            verify.add(verify_seconds / slowdown, now, stale)
            if draft is not None:
                draft.add(draft_seconds / slowdown, modelled, now, stale)
                if catch_up_tokens:
                    self.catch_up.add(catch_up_seconds / catch_up_tokens / slowdown)
        elif draft is not None and not (draft.model if modelled else draft.lookup).measured:
            draft.add(draft_seconds / self.slowdown, modelled, now, stale)
        if verify.measured:
            self.recent.append((cell, verify_seconds / verify.value))

    def record_pass(self, rows: int, seconds: float) -> None:
        """A target pass over `rows` rows (all of its sequences', padding included) took `seconds`."""
        self.passes.setdefault(rows, deque(maxlen=PASS_WINDOW)).append(seconds)

    def pass_seconds(self, rows: int) -> float | None:
        """The seconds of a pass over `rows` rows: measured, else interpolated between the nearest measured widths
        around it, else extrapolated from the two widest below it; None when too little is measured. Measured
        widths cost the least of their last passes, made non-decreasing in the width (_non_decreasing)."""
        measured = _non_decreasing(sorted((r, min(t), len(t)) for r, t in self.passes.items() if t))
        for r, seconds in measured:
            if r == rows:
                return seconds
        below = [(r, t) for r, t in measured if r < rows]
        above = [(r, t) for r, t in measured if r > rows]
        if below and above:
            (r0, t0), (r1, t1) = below[-1], above[0]
            return t0 + (t1 - t0) * (rows - r0) / (r1 - r0)
        if len(below) >= 2:
            (r0, t0), (r1, t1) = below[-2], below[-1]
            return t1 + (t1 - t0) / (r1 - r0) * (rows - r1)
        return None

    def row_cost(self, batch: int, width: int):
        """A function n -> what a pass of `batch` sequences costs when one of them drafts n tokens, over the pass
        without them, priced as if every row were padded to the widest: n drafts make the pass batch x max(width,
        n + 1) rows (`width`: the widest of the others). On the native stack the pass computes no padding, but a
        lookup priced by its own rows alone, beside the others as they were, made passes wider than paid once
        several sequences drafted long lookups in one step (docs/results-log.md, "Verify passes without
        padding"). None while the pass without them is unmeasured (a lookup then drafts unpriced, and its pass
        is measured)."""
        base = self.pass_seconds(batch * width)
        if base is None or self.settings.mode != "auto":
            return None
        costs = {0: 1.0}

        def cost(n: int) -> float | None:
            if n not in costs:
                seconds = self.pass_seconds(batch * max(width, n + 1))
                costs[n] = None if seconds is None else max(1.0, seconds / base)
            return costs[n]

        return cost

    def lookup_coverage(self, looked_up: int, generated: int) -> float:
        """The share of a sequence's tokens still to come that its lookups are expected to give, from the
        `looked_up` of its `generated` tokens that were accepted lookups, starting from the server-wide share
        counted as `coverage_weight` tokens."""
        prior = self.looked_up_tokens / self.tokens if self.tokens else 0.0
        return (looked_up + self.settings.coverage_weight * prior) / (generated + self.settings.coverage_weight)

    def record_round(self, drafted: int, accepted: int, looked_up: bool = False) -> None:
        """One sequence's round: `accepted` of `drafted` tokens kept (`looked_up`: drafted by a lookup), and
        the target's own token. The acceptance counts are the draft model's alone: k governs the model, and a
        lookup's acceptance says nothing of the model's (copied text is accepted far more often)."""
        self.tokens = self.settings.decay * self.tokens + accepted + 1
        self.looked_up_tokens = self.settings.decay * self.looked_up_tokens + (accepted if looked_up else 0)
        decay = self.settings.decay
        if drafted and not looked_up:
            self.accepted = decay * self.accepted + accepted
            self.rejected = decay * self.rejected + (accepted < drafted)
        else:  # the model did not draft: what it showed fades back to the prior
            self.accepted = ACCEPTED_PRIOR + decay * (self.accepted - ACCEPTED_PRIOR)
            self.rejected = REJECTED_PRIOR + decay * (self.rejected - REJECTED_PRIOR)
