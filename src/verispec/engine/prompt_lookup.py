"""Prompt lookup: drafts copied from what followed an earlier occurrence of the context's last tokens (the
`ngram` method alone, the `hybrid` method's lookups beside the draft model)."""

from __future__ import annotations

import torch

from .drafting import DraftJob, Proposal


def ngram_lookup(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Prompt lookup: the up to k tokens that followed the latest earlier occurrence of the context's last n
    tokens (n from max_ngram down to min_ngram), or [] when none occurred."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


class PromptLookups:
    """Prompt lookup (Lookups, proposer.py): what followed the latest earlier occurrence of a sequence's last n
    tokens in its own context, n from 3 down to `min_match`. With min_match 1 it is the `ngram` method; with
    HYBRID_MATCH the `hybrid` method's lookups (code repeats names and lines; shorter matches are left to the draft
    model)."""

    HYBRID_MATCH = 3
    always = False  # beside the draft model's drafts only: unpriced, they follow the policy's k
    HELD = 16  # tokens of a found continuation kept for the step's other question about the same sequence

    def __init__(self, min_match: int):
        self.min_match = min_match
        # per slot: (the context's length, the continuation found, how far it was looked for): the engine asks
        # `drafts` (before it chooses k) and then `find` of the same context in one step; one search answers both
        self.found: dict[int, tuple[int, list[int], int]] = {}

    def find(self, jobs: list[DraftJob], model: bool) -> list[Proposal | None]:
        found = [self._lookup(job.slot, job.tokens, job.k) for job in jobs]
        return [Proposal(torch.tensor(t, dtype=torch.long), looked_up=True) if t else None for t in found]

    def drafts(self, slot: int, tokens: list[int]) -> bool:
        return bool(self._lookup(slot, tokens, 1))

    def _lookup(self, slot: int, tokens: list[int], k: int) -> list[int]:
        """ngram_lookup(tokens, k): a longer continuation's first k tokens are the shorter search's answer, and a
        slot's context only grows while its request runs (admit starts afresh)."""
        held = self.found.get(slot)
        if held is None or held[0] != len(tokens) or held[2] < k:
            width = max(k, self.HELD)
            held = self.found[slot] = (len(tokens), ngram_lookup(tokens, width, min_ngram=self.min_match), width)
        return held[1][:k]

    def admit(self, slot: int, partition: str) -> None:
        """A new request in the slot: nothing found for the last one holds (each looks up in its own context)."""
        self.found.pop(slot, None)

    def finished(self, slot: int, output: list[int], partition: str) -> None:
        """Nothing: earlier outputs are not read."""

    def forget(self) -> None:
        """Nothing to forget."""
