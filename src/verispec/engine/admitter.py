"""Who gets a slot and KV blocks: waiting requests (and preempted sequences) admitted while a slot is free and the
cache has room, the tenant running the fewest first (admission.py); a sequence preempted where blocks run out or
another tenant's turn comes, resuming later exactly where it was (on a row-invariant target a prefill writes the bits
its decoding wrote); the blocks a step's rows need taken before its pass."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from ..decoding.adjustments import LogitAdjustments
from ..decoding.stats import GenerationStats
from ..decoding.stopping import StopChecker
from ..models.kv_cache import CacheFullError, KVCache
from ..models.tokenizer import Tokenizer
from .admission import fairness_victim
from .draft_model import draft_cut_for
from .drafting import Proposal
from .metrics import Metrics
from .prefixes import PrefixBlocks, Prompt
from .proposer import Proposer
from .requests import EngineRequest, ErrorEvent
from .sequence import Sequence, Slots, request_of

log = logging.getLogger("verispec.server")


class Admitter:
    def __init__(self, slots: Slots, cache: KVCache, prefixes: PrefixBlocks, proposer: Proposer | None, *,
                 tokenizer: Tokenizer, vocab_size: int, widest: int, on_demand: bool, draft_window: int,
                 metrics: Metrics, free: Callable[[EngineRequest, int, str], None]):  # fmt: skip
        """`vocab_size`: the target's logits' width; `widest`: the rows a proposal may hold past a context; `free`:
        the emitter's, to end a request that could not start."""
        self.slots, self.cache, self.prefixes, self.proposer = slots, cache, prefixes, proposer
        self.tokenizer, self.vocab_size, self.widest = tokenizer, vocab_size, widest
        self.on_demand, self.draft_window, self.metrics, self.free = on_demand, draft_window, metrics, free
        self.waiting_for_blocks = False  # the next waiting request does not fit the KV cache now
        self.preempted_in_step = False  # a sequence was preempted in this step (its costs are not the policy's)
        self._first: tuple[EngineRequest | Sequence, Prompt] | None = None  # the next one's prompt, as keys

    def running_per_owner(self) -> Counter[tuple[str, str]]:
        """Sequences running per (tenant, member) (admission.py)."""
        return Counter(seq.request.owner for seq in self.slots.running.values())

    def admit(self) -> None:
        """Admit waiting requests (and preempted sequences) while a slot is free and the KV cache has room, the tenant
        running the fewest sequences first (admission.py). A request reserves the blocks its prompt and its first
        step's rows need, less those it shares with earlier prompts (without on-demand blocks: its whole length); the
        rest it takes as it writes (make_room), and admission leaves a block per running sequence for that. Where the
        next one does not fit it waits, and those behind it, unless its tenant runs at least two sequences fewer
        than another: then that tenant's youngest sequence is preempted to make room."""
        slots = self.slots
        while True:
            with slots.cond:
                self.waiting_for_blocks = False
                found = slots.waiting.first(self.running_per_owner())
                if found is None:
                    self._first = None
                    return
            item, tenant = found
            prompt = self._prompt_of(item)
            shared = self.prefixes.shared_run(prompt)
            reserve = self._blocks_needed(item) - len(shared)
            idle = sum(1 for block in shared if not self.cache.pool.refs[block])  # taking them leaves fewer
            headroom = len(slots.running) if self.on_demand else 0
            fits = reserve + idle + headroom <= self.cache.pool.available()
            if not (slots.free and fits):
                if self._preempt_for(tenant):
                    continue
                self.waiting_for_blocks = bool(slots.free)
                return
            with slots.cond:
                if not slots.waiting.remove(item):  # cancelled meanwhile
                    continue
                slot = slots.free.pop(0)
            self._place(item, slot, prompt=prompt, shared=shared, reserve=reserve)

    def _place(
        self, item: EngineRequest | Sequence, slot: int, prompt: Prompt, shared: list[int], reserve: int
    ) -> None:
        request = request_of(item)
        try:
            if isinstance(item, Sequence):
                self._resume(item, slot, prompt=prompt, shared=shared, reserve=reserve)
            else:
                self._start(item, slot, prompt=prompt, shared=shared, reserve=reserve)
        except Exception:  # this request alone fails; the running ones go on
            log.exception("could not start request %s", request.request_id)
            self.free(request, slot, "error")
            request.sink(ErrorEvent("internal error starting the request (see the server log)"))

    def _start(self, request: EngineRequest, slot: int, prompt: Prompt, shared: list[int], reserve: int) -> None:
        seq = self._new_sequence(request, slot, prompt)
        self.slots.running[slot] = seq
        self.metrics.prompt_tokens.inc(len(prompt.tokens))
        seq.prefilled = self.prefixes.admit(slot, prompt, shared, reserve)
        if self.proposer is not None:
            self.proposer.admit(slot, request.partition)
        self.count_reused(seq, seq.prefilled)

    def _resume(self, seq: Sequence, slot: int, prompt: Prompt, shared: list[int], reserve: int) -> None:
        """A preempted sequence back in a slot: it prefills its whole context again (what is still registered taken)."""
        seq.slot, seq.context = slot, prompt.tokens
        self.slots.running[slot] = seq
        seq.prefilled = self.prefixes.admit(slot, prompt, shared, reserve)
        if self.proposer is not None:
            self.proposer.admit(slot, seq.request.partition)

    def _new_sequence(self, request: EngineRequest, slot: int, prompt: Prompt) -> Sequence:
        now = time.perf_counter()
        return Sequence(
            request=request, slot=slot, tokens=list(request.prompt_ids),
            stopper=StopChecker(self.tokenizer, request.max_tokens, request.stop, request.ignore_eos),
            stats=GenerationStats(prompt_tokens=len(prompt.tokens)), noise=request.params.noise(self.vocab_size),
            adjustments=LogitAdjustments(request.params, self.vocab_size),
            grammar=request.grammar.matcher() if request.grammar is not None else None,
            admitted=now, queue_seconds=now - request.arrival,
            logprobs=[] if request.logprobs is not None else None,
            draft_cut=draft_cut_for(len(prompt.tokens), self.draft_window),
        )  # fmt: skip

    def count_reused(self, seq: Sequence, tokens: int) -> None:
        """Prompt tokens taken from the prefix cache (a resumed sequence's own context is not its prompt)."""
        if seq.context is None:
            seq.stats.cached_tokens += tokens
            self.metrics.prefill_reused_tokens.inc(tokens)

    def _prompt_of(self, item: EngineRequest | Sequence) -> Prompt:
        """The next waiting item's context as the prefix cache keys it (kept while it stays the next)."""
        if self._first is None or self._first[0] is not item:
            request = request_of(item)
            tokens = list(item.tokens) if isinstance(item, Sequence) else request.prompt_ids  # a copy: tokens grow
            self._first = (item, self.prefixes.prompt(tokens, request.partition))
        return self._first[1]

    def _blocks_needed(self, item: EngineRequest | Sequence) -> int:
        """The target cache's blocks a request reserves when admitted: its context and its first step's padded rows;
        without on-demand blocks, its prompt, max_tokens and the padded rows past them."""
        if isinstance(item, Sequence):
            positions = len(item.tokens) + self.widest + 1
        else:
            positions = len(item.prompt_ids) + self.widest + 1 + (0 if self.on_demand else item.max_tokens)
        return self.cache.blocks_for(min(positions, self.cache.max_len))

    def _preempt_for(self, tenant: str) -> bool:
        """Preempt the youngest sequence of the tenant running the most, where `tenant` (whose request is next) runs
        at least two fewer (admission.fairness_victim); False where none is."""
        if not self.on_demand:
            return False
        victim = fairness_victim(tenant, self.running_per_owner())
        if victim is None:
            return False
        self.preempt(max((seq for seq in self.slots.running.values() if seq.request.tenant == victim),
                         key=lambda seq: seq.admitted))  # fmt: skip
        return True

    def preempt(self, seq: Sequence) -> None:
        """Take a running sequence out to give its blocks back. What it decoded stays registered (prefixes.py) and its
        state is kept (tokens, stop checker, grammar, noise, statistics); it waits first of its member's to be admitted
        again, then prefills its whole context, taking whatever of it is still registered. Its output does not
        change: on a row-invariant model a prefill writes the bits its decoding wrote."""
        self.preempted_in_step = True
        if seq.request.cancelled:  # its client left: it ends here
            self.free(seq.request, seq.slot, "cancelled")
            return
        self.prefixes.decoded(seq.slot, seq.tokens)
        self.cache.release(seq.slot)
        self.prefixes.finish(seq.slot)
        self.metrics.preemptions.inc()
        log.info("request %s preempted to free KV blocks (resumes later)", seq.request.request_id)
        with self.slots.cond:
            self.slots.running.pop(seq.slot, None)
            self.slots.free.append(seq.slot)
            self.slots.waiting.appendleft(seq, seq.request.owner, seq.request.arrival)

    def make_room(self, seqs: list[Sequence], proposals: list[Proposal | None]) -> None:
        """Blocks for every sequence's rows of this step (its pending token and drafts), taken before the pass; where
        the pool has none left, the youngest running sequence is preempted (its proposal dropped), the sequence
        itself where it is the youngest."""
        for i, seq in enumerate(seqs):
            if proposals[i] is None:
                continue
            end = min(len(seq.tokens) + proposals[i].tokens.shape[0], self.cache.max_len)
            while True:
                try:
                    self.cache.ensure(seq.slot, end)
                    break
                except CacheFullError:
                    victim = max(self.slots.running.values(), key=lambda other: other.admitted)
                    if victim in seqs:
                        proposals[seqs.index(victim)] = None
                    self.preempt(victim)
                    if victim is seq:
                        break
