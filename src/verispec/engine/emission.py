"""What a verdict does to its sequence: the accepted tokens and the target's own one emitted one by one through the
sequence's stop rules (a stream event each), its counts and the metrics kept, its grammar advanced; a finished
sequence's output sent and its slot given back; every request failed at once when the loop stops."""

from __future__ import annotations

import time

from ..decoding.stats import proposer_name
from ..models.kv_cache import KVCache
from .drafting import Proposal
from .metrics import Metrics
from .policy import DraftPolicy
from .prefixes import PrefixBlocks
from .proposer import Proposer
from .requests import EngineRequest, ErrorEvent, FinishEvent, GenerationOutput, StreamChunk
from .sequence import Sequence, Slots, Verdict, request_of


class Emitter:
    def __init__(self, slots: Slots, cache: KVCache, prefixes: PrefixBlocks, proposer: Proposer | None, *,
                 policy: DraftPolicy, metrics: Metrics):  # fmt: skip
        self.slots, self.cache, self.prefixes = slots, cache, prefixes
        self.proposer, self.policy, self.metrics = proposer, policy, metrics

    def advance(self, seq: Sequence, proposal: Proposal, verdict: Verdict) -> None:
        """The round's counts kept; its tokens emitted until one finishes the sequence."""
        # a tree counts as its deepest path: the positions it offered (its other branches are not tokens it
        # could have added), so acceptance per position reads as a chain's
        k, accepted = proposal.height, verdict.accepted
        seq.stats.record_round(k, accepted, proposal.looked_up)
        seq.stats.time_catch_up += proposal.catch_up_seconds
        self.metrics.record_round(k, accepted, proposer_name(proposal.looked_up))
        self.policy.record_round(k, accepted, proposal.looked_up)
        drafted = proposal.tokens[:accepted].tolist() if verdict.path is None else verdict.path
        emitted = [*drafted, verdict.next_token]
        if seq.grammar is not None:
            seq.grammar.advance([t for t in emitted if not seq.stopper.is_stop_token(t)])
        seq.noise.forget_before(len(seq.tokens) + len(emitted))  # these positions are decided
        for i, token in enumerate(emitted):
            if self._emit(seq, token, verdict, i):
                self.finish(seq)
                return
        self.prefixes.decoded(seq.slot, seq.tokens)

    def _emit(self, seq: Sequence, token: int, verdict: Verdict, i: int) -> bool:
        """One token through the sequence's stop rules, its text (if any) sent; True when it finished the sequence."""
        seq.tokens.append(token)
        seq.adjustments.record(token)
        is_stop_token = seq.stopper.is_stop_token(token)
        logprob = None
        if seq.logprobs is not None and not is_stop_token:
            logprob = verdict.logprobs[i]
            logprob.text_offset = len(seq.stopper.text)
            seq.logprobs.append(logprob)
        piece = seq.stopper.add(token)
        seq.stats.new_tokens += not is_stop_token
        if not is_stop_token:
            self._record_token_time(seq)
        if piece or not is_stop_token:
            seq.request.sink(StreamChunk(piece, None if is_stop_token else token, logprob=logprob))
        return seq.stopper.finished

    def _record_token_time(self, seq: Sequence) -> None:
        now = time.perf_counter()
        if seq.last_emit is None:
            self.metrics.ttft.observe(now - seq.request.arrival)
        else:
            self.metrics.itl.observe(now - seq.last_emit)
        seq.last_emit = now
        self.metrics.generation_tokens.inc()

    def finish(self, seq: Sequence) -> None:
        seq.stats.time_total = time.perf_counter() - seq.admitted
        seq.stats.time_grammar = seq.grammar.seconds if seq.grammar is not None else 0.0
        stopper = seq.stopper
        reason = stopper.finish_reason or "length"
        output = GenerationOutput(
            stopper.text, list(stopper.token_ids), finish_reason=reason, stats=seq.stats,
            prompt_ids=seq.request.prompt_ids, logprobs=seq.logprobs,
        )  # fmt: skip
        self.policy.record_answer(len(stopper.token_ids), stopped=reason != "length")
        if self.proposer is not None:  # what it wrote, for the requests to come
            self.proposer.finished(seq.slot, seq.tokens[len(seq.request.prompt_ids) :], seq.request.partition)
        self.prefixes.decoded(seq.slot, seq.tokens)
        seq.request.sink(FinishEvent(output, seq.queue_seconds))
        self.release(seq, reason)

    def release(self, seq: Sequence, reason: str) -> None:
        self.free(seq.request, seq.slot, reason)

    def free(self, request: EngineRequest, slot: int, reason: str) -> None:
        """The request leaves (running or just admitted); its slot is free from the next step on."""
        self.cache.release(slot)  # what its prompt registered stays, for the requests to come
        self.prefixes.finish(slot)
        with self.slots.cond:
            self.slots.running.pop(slot, None)
            self.slots.free.append(slot)
            self.slots.active.pop(request.request_id, None)
            self.metrics.record_finish(reason, time.perf_counter() - request.arrival)
            self.update_gauges()

    def fail_all(self, message: str) -> None:
        """Every waiting and running request ends with `message` (the loop failed, or the server stops)."""
        slots = self.slots
        with slots.cond:
            waiting = [request_of(item) for item in slots.waiting]
            slots.waiting.clear()
            running = list(slots.running.values())
        for request in waiting:
            with slots.cond:
                slots.active.pop(request.request_id, None)
            self.metrics.record_finish("error", time.perf_counter() - request.arrival)
        for seq in running:
            self.free(seq.request, seq.slot, "error")
        for request in [*waiting, *(seq.request for seq in running)]:
            request.sink(ErrorEvent(message))
        with slots.cond:
            self.update_gauges()

    def update_gauges(self) -> None:
        self.metrics.set_queue(len(self.slots.running), len(self.slots.waiting))
        pool = self.cache.pool
        self.metrics.kv_cache_usage.set((pool.in_use() + pool.reserved) / pool.num_blocks)
