"""What the engine and every way of drafting exchange: the engine's request to a proposer for one sequence
(DraftJob, with LookupPricing for lookups that price themselves), what it answers (Proposal) and what drafting cost
(DraftCost). The Proposer interface is in proposer.py; the methods by name in methods.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

import torch

from ..decoding.adjustments import LogitAdjustments
from ..decoding.grammar import GrammarMatcher
from ..decoding.noise import KeyedNoise
from ..decoding.sampling import SamplingParams


@dataclass
class Proposal:
    """Drafted tokens: point masses to the acceptance rule, which compares each with the target's own token at its
    position (the argmax, or the keyed draw of decoding/noise.py), so no proposer's probabilities are needed."""

    tokens: torch.Tensor  # [k] int64
    _: KW_ONLY
    looked_up: bool = False  # drafted by a lookup in the context, not by the draft model
    catch_up_seconds: float = 0.0  # the draft model's catch-up on this sequence's context before drafting
    # a token tree (lookups only): tokens[i] follows parents[i] (-1: the context), parents first;
    # None: a chain, each token after the one before
    parents: list[int] | None = None

    @property
    def height(self) -> int:
        """The most tokens a round can accept from it (a chain's length, a tree's deepest path)."""
        if self.parents is None:
            return self.tokens.shape[0]
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return max(depths, default=0)


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


@dataclass(frozen=True, kw_only=True)
class LookupPricing:
    """What a lookup that prices itself (suffix.py) weighs a draft by: what the sequence has accepted so far, what
    the draft model would cost and yield instead, and what rows cost in this step's verify pass (the policy's)."""

    alpha: float = 1.0  # the sequence's own chance that a looked-up token is accepted
    model_alpha: float = 0.0  # ... and that a token its draft model proposed is
    model_price: float = 0.0  # the draft model's drafting and catch-up for it, over the verify pass (policy)
    tree: bool = False  # a lookup may propose a token tree (the target verifies trees for this sequence)
    # what n drafted rows make this step's verify pass cost over none (DraftPolicy.row_cost), or None; and the
    # sequences the pass verifies
    row_cost: Callable[[int], float | None] | None = None
    batch: int = 1


@dataclass(kw_only=True)
class DraftJob:
    """One sequence's drafting request for this step: its tokens so far (the last one is not yet verified), the most
    the draft model drafts (k) and the most any proposal may hold (most: what the engine reserved room for)."""

    slot: int
    tokens: list[int]
    k: int
    most: int = 0  # 0: k
    params: SamplingParams
    noise: KeyedNoise  # the sequence's sampling noise: a sampled draft races against the target's (noise.py)
    adjustments: LogitAdjustments | None = None  # the request's logit_bias and penalties, if any
    grammar: GrammarMatcher | None = None  # the request's structured-output constraint, if any
    # what the draft model reads instead of `tokens` (a bounded view of a long context: draft_view), or None
    model_tokens: list[int] | None = None
    key: str | None = None  # the sequence's request id (a lookup proposer keeps a trie per sequence)
    pricing: LookupPricing = LookupPricing()

    @property
    def model_view(self) -> list[int]:
        return self.tokens if self.model_tokens is None else self.model_tokens

    @property
    def widest(self) -> int:
        """The most tokens a proposal for this job may hold."""
        return self.most or self.k


@dataclass
class DraftCost:
    """What one propose spent on the draft model."""

    catch_up_seconds: float = 0.0  # feeding the model, alone, the context it lacked
    catch_up_tokens: int = 0
    modelled: bool = False  # the model drafted (else every sequence's draft was looked up)
