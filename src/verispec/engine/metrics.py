"""Prometheus metrics of the engine (prometheus_client, a registry of its own per engine); the server
publishes them at /metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..decoding.stats import PROPOSERS

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram

    from .policy import DraftPolicy, StepCost

PREFIX = "verispec_"
# draft positions with a label of their own; deeper ones (k > 16 only: a lookup drafts at most 15) share
# DEEPER_POSITIONS, so that a large --num-speculative-tokens cannot grow the series without bound
POSITION_LABELS = 16
DEEPER_POSITIONS = f"{POSITION_LABELS + 1}+"
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry  # here: a process that publishes no metrics never loads it

        self.registry = CollectorRegistry()
        counter, gauge = self._counter, self._gauge
        self.requests = counter("requests", "Finished requests by finish reason", "finish_reason")
        self.rejected = counter("rejected_requests", "Requests refused before running, by error code", "code")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests")
        self.prefill_reused_tokens = counter(
            "prefill_reused_tokens",
            "Prompt tokens whose keys and values came from earlier prefills (shared blocks, or copied) instead of "
            "being computed",
        )
        self.preemptions = counter(
            "preemptions",
            "Sequences taken out to give their KV blocks back (the cache ran out, or another tenant's turn); each "
            "resumes later, prefilling what it lost",
        )
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.drafted = counter("draft_tokens", "Drafted tokens")
        self.accepted = counter("accepted_tokens", "Drafted tokens the target accepted")
        self.drafted_by = counter(
            "draft_tokens_by_proposer",
            "Drafted tokens by proposer (model: the draft model; lookup: a lookup)",
            "proposer",
        )
        self.accepted_by = counter("accepted_tokens_by_proposer", "Accepted tokens by proposer", "proposer")
        for proposer in PROPOSERS:  # both series from the start, so a rate over them is defined before any draft
            self.drafted_by.labels(proposer=proposer)
            self.accepted_by.labels(proposer=proposer)
        self.drafted_at = counter(
            "draft_tokens_by_position",
            f"Drafted tokens by draft position (1..{POSITION_LABELS}, then {DEEPER_POSITIONS})",
            "position",
        )
        self.accepted_at = counter("accepted_tokens_by_position", "Accepted tokens by draft position", "position")
        self.acceptance_rate = gauge("acceptance_rate", "Accepted / drafted tokens since start")
        self._engine_series()
        self._drafted_total = 0
        self._accepted_total = 0

    def _engine_series(self) -> None:
        """The scheduler's series: its steps, the draft policy's prices, its queue and cache, its latencies."""
        counter, gauge, histogram = self._counter, self._gauge, self._histogram
        self.steps = counter(
            "scheduler_steps", "Scheduler steps by mode (draft or plain) and tokens drafted k", "mode", "k"
        )
        self.policy_seconds = gauge(
            "draft_policy_seconds",
            "Draft policy's step times at its reference machine speed: verify = target over k+1 tokens/row "
            "(batch_size rows; k = 0 is plain decoding), draft = drafting k tokens (batch_size drafting rows)",
            "phase",
            "batch_size",
            "k",
        )
        self.policy_slowdown = gauge(
            "draft_policy_slowdown", "How much slower than the draft policy's reference speed the machine runs now"
        )
        self.draft_resting = gauge(
            "draft_model_resting", "1 while the draft policy's choice is plain decoding (the draft model rests), else 0"
        )
        self.draft_trials = gauge(
            "draft_model_trials", "Steps that tried a resting draft model again (k = 1), since start"
        )
        self.draft_alpha = gauge(
            "draft_model_acceptance", "The draft policy's server-wide estimate of the draft model's acceptance"
        )
        self.running = gauge("num_requests_running", "Requests holding a sequence slot")
        self.waiting = gauge("num_requests_waiting", "Requests queued for a slot (or for room in the KV cache)")
        self.kv_cache_usage = gauge(
            "kv_cache_usage", "Share of the target's KV cache blocks that running requests hold or have reserved"
        )
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first token", _TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between a request's tokens", _ITL_BUCKETS)
        self.latency = histogram("request_latency_seconds", "Arrival to finish", _LATENCY_BUCKETS)

    def _counter(self, name: str, doc: str, *labels: str) -> Counter:
        from prometheus_client import Counter

        return Counter(PREFIX + name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, *labels: str) -> Gauge:
        from prometheus_client import Gauge

        return Gauge(PREFIX + name, doc, labels, registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        from prometheus_client import Histogram

        return Histogram(PREFIX + name, doc, buckets=buckets, registry=self.registry)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def set_queue(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def record_round(self, drafted: int, accepted: int, proposer: str = "model") -> None:
        """One verified round of `drafted` tokens from `proposer` (PROPOSERS), the first `accepted` kept; the same
        counting as GenerationStats.record_round, so the by-proposer and by-position series sum to the totals."""
        if not drafted:
            return
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)
        self.drafted_by.labels(proposer=proposer).inc(drafted)
        self.accepted_by.labels(proposer=proposer).inc(accepted)
        for i in range(drafted):
            label = position_label(i + 1)
            self.drafted_at.labels(position=label).inc()
            # (inc(0) too: a position drafted at has both series, so accepted / drafted is 0 there, not missing)
            self.accepted_at.labels(position=label).inc(int(i < accepted))
        self._drafted_total += drafted
        self._accepted_total += accepted
        self.acceptance_rate.set(self._accepted_total / self._drafted_total)

    def record_step(self, cost: StepCost, policy: DraftPolicy) -> None:
        """One engine step (a plain one where k = 0), and what the policy now prices its verify pass and its
        drafting at."""
        self.steps.labels(mode="draft" if cost.k else "plain", k=str(cost.k)).inc()
        self._record_policy("verify", cost.batch, cost.k, policy.verify[cost.batch, cost.k].value)
        if cost.k and (draft := policy.draft_seconds(cost.drafting, cost.k)) is not None:
            self._record_policy("draft", cost.drafting, cost.k, draft)
        self.policy_slowdown.set(policy.slowdown)
        self.draft_resting.set(int(policy.exploring.resting))
        self.draft_trials.set(policy.exploring.trials)
        self.draft_alpha.set(policy.acceptance(0, 0))

    def _record_policy(self, phase: str, batch_size: int, k: int, seconds: float) -> None:
        self.policy_seconds.labels(phase=phase, batch_size=str(batch_size), k=str(k)).set(seconds)

    def record_finish(self, reason: str, seconds: float) -> None:
        self.requests.labels(finish_reason=reason).inc()
        self.latency.observe(seconds)


class Unrecorded:
    """Metrics that record nothing, for an engine that publishes none (the Python API and `generate`: one request
    at a time, in the caller's thread): every series and method a Metrics has, each doing nothing."""

    def __getattr__(self, name: str) -> Unrecorded:
        return self

    def __call__(self, *args, **kwargs) -> Unrecorded:
        return self


def position_label(position: int) -> str:
    """A draft position's label (1-based): itself up to POSITION_LABELS, DEEPER_POSITIONS past it."""
    return str(position) if position <= POSITION_LABELS else DEEPER_POSITIONS
