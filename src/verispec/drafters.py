"""Drafters propose the next k tokens; the target decides. Any drafter keeps decoding lossless.

Interface (the loop needs nothing else):
    reset(prompt_ids)                      -- a new sequence starts
    propose(tokens, k, params, rng) -> Proposal (tokens, and their distributions q when known)
    observe(num_accepted)                  -- feedback after verification
A drafter without distributions (n-gram lookup) returns probs=None: a point mass, q = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .draft_head import DraftHead
from .model import Transformer
from .sampling import SamplingParams, probs_from_logits, sample


@dataclass
class Proposal:
    tokens: torch.Tensor  # [k] int64
    probs: torch.Tensor | None  # [k, target vocab] float32, None for a point-mass drafter


class DraftModelDrafter:
    """Drafts autoregressively with a smaller model that shares the target's tokenizer."""

    def __init__(self, model: Transformer, target_vocab_size: int, max_len: int, head_ids: torch.Tensor | None = None):
        """head_ids: draft only these token ids (a restricted head, see draft_head.py); None: all."""
        self.model = model
        self.cache = model.new_cache(num_slots=1, max_len=max_len)
        self.cached: list[int] = []  # tokens whose keys/values are in the cache, in order
        self.head = DraftHead(model, target_vocab_size, head_ids)

    def reset(self, prompt_ids: list[int]) -> None:
        self.cache.set_length(0, 0)
        self.cached = []
        if len(prompt_ids) > 1:
            self._feed(prompt_ids[:-1])

    def propose(self, tokens: list[int], k: int, params: SamplingParams, rng: torch.Generator) -> Proposal:
        keep = common_prefix(self.cached, tokens, limit=len(tokens) - 1)
        self.cache.set_length(0, keep)
        self.cached = self.cached[:keep]
        logits = self._feed(tokens[keep:])
        drafted, probs = [], []
        for i in range(k):
            if params.greedy:
                token = int(logits.argmax())
            else:
                q = probs_from_logits(logits, params)
                token = int(sample(q, rng))
                probs.append(q)
            drafted.append(token)
            if i + 1 < k:
                logits = self._feed([token])
        return Proposal(torch.tensor(drafted, dtype=torch.long), torch.stack(probs) if probs else None)

    def observe(self, num_accepted: int) -> None:
        pass

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor([tokens], dtype=torch.long, device=self.model.device)
        logits = self.model(ids, self.cache, [0], num_logits=1, invariant=False, head=self.head.module)
        self.cached += tokens
        return self.head.over_vocab(logits[0, -1].cpu())


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of a and b, at most limit (a binary search over slice comparisons, which
    run in C: the scheduler asks this of every sequence's full history at every step)."""
    low, high = 0, min(len(a), len(b), limit)  # a[:low] == b[:low]; the common prefix is at most high
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (n from max_ngram
    down to min_ngram) and propose the tokens that followed it. Free to run; no probabilities, so each
    proposal is a point mass (q = 1) and the acceptance rule stays exact."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def reset(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], k: int, params: SamplingParams, rng: torch.Generator) -> Proposal:
        return Proposal(torch.tensor(self.lookup(tokens, k), dtype=torch.long), None)

    def observe(self, num_accepted: int) -> None:
        pass

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    return tokens[start + n : start + n + k]
        return []


class HybridDrafter:
    """Prompt lookup when the context's last MIN_MATCH tokens occurred earlier (free, and then usually
    right: code repeats names and lines), the draft model otherwise."""

    MIN_MATCH = 3

    def __init__(self, model: DraftModelDrafter, lookup: NgramDrafter):
        self.model, self.ngram = model, lookup

    def reset(self, prompt_ids: list[int]) -> None:
        self.model.reset(prompt_ids)

    def propose(self, tokens: list[int], k: int, params: SamplingParams, rng: torch.Generator) -> Proposal:
        found = self.ngram.lookup(tokens, k)
        if found:
            return Proposal(torch.tensor(found, dtype=torch.long), None)
        return self.model.propose(tokens, k, params, rng)

    def observe(self, num_accepted: int) -> None:
        pass
