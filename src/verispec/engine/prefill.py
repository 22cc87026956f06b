"""Chunked prefill: one chunk of one admitted prompt per step, the prompt with the fewest tokens left first (a short
request is not held behind long ones), what earlier prefills registered taken instead of computed (prefixes.py), and
the chunk paced beside others' decoding (prefill_pacing.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..models.kv_cache import KVCache
from ..models.model import Transformer
from .clock import settled
from .policy import DraftPolicy
from .prefill_pacing import PrefillPacer
from .prefixes import PrefixBlocks
from .sequence import Sequence, Slots


class Prefiller:
    def __init__(self, slots: Slots, prefixes: PrefixBlocks, pacer: PrefillPacer, model: Transformer, *,
                 cache: KVCache, policy: DraftPolicy, count_reused: Callable[[Sequence, int], None],
                 guarded: Callable[..., object]):  # fmt: skip
        """`count_reused(seq, tokens)`: prompt tokens taken from the prefix cache; `guarded(seq, work, *args)`: work
        that fails its sequence alone."""
        self.slots, self.prefixes, self.pacer, self.model, self.cache = slots, prefixes, pacer, model, cache
        self.policy, self.count_reused, self.guarded = policy, count_reused, guarded

    def step(self) -> None:
        """The next chunk of the prompt with the fewest tokens left to prefill (the earliest admitted on a tie);
        before it, and for every other prompt still prefilling, what other prefills registered meanwhile is taken
        (prefixes.py). While another owner decodes, the chunk may wait or be cut short (prefill_pacing.py), only
        where that changes no bit: a request's cache (and its greedy output) does not depend on its neighbours."""
        prefilling = [seq for seq in self.slots.running.values() if seq.prefilling]
        for seq in prefilling:
            end = self.prefixes.reuse(seq.slot, seq.prefilled)
            self.count_reused(seq, end - seq.prefilled)
            seq.prefilled = end
        left = [seq for seq in prefilling if seq.prefilling]
        if left:
            seq = min(left, key=lambda seq: (len(seq.prefill_ids) - seq.prefilled, seq.admitted))
            contended = self._contended(seq)
            if not self.pacer.waits(contended):
                self.guarded(seq, self.compute_chunk, seq, contended)

    def _contended(self, seq: Sequence) -> bool:
        """Whether a sequence of another owner than `seq`'s (tenant and member) is decoding (prefill_pacing.py)."""
        running = self.slots.running.values()
        return any(other.request.owner != seq.request.owner for other in running if not other.prefilling)

    def compute_chunk(self, seq: Sequence, contended: bool) -> None:
        begin = settled(self.model.device)
        end = min(seq.prefilled + self.pacer.tokens(contended), len(seq.prefill_ids) - 1)
        chunk = seq.prefill_ids[seq.prefilled : end]
        ids = torch.tensor([chunk], dtype=torch.long, device=self.model.device)
        self.model(ids, self.cache, [seq.slot], num_logits=1, invariant=False)
        self.prefixes.computed(seq.slot, seq.prefilled, end)
        seq.prefilled = end
        seconds = settled(self.model.device) - begin
        seq.stats.time_prefill += seconds
        self.policy.record_prefill(seconds, len(chunk))
        self.pacer.prefilled(seconds, len(chunk), contended)
