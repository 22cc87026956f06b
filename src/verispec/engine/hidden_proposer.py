"""What the proposers that draft from the target's hidden states share (the MTP layer, an EAGLE-3 head, a DFlash
drafter): they read them (`reads_hidden`: the engine has the target serve the final ones, or the inputs of the
proposer's `hidden_layers`), keep a cache of their own per slot, and keep nothing across requests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .drafting import DraftJob

if TYPE_CHECKING:
    from .setup import Setup

CATCH_UP_ROWS = 8  # a catch-up longer than this (a prompt) is fed alone first, FEED_ROWS rows a pass
FEED_ROWS = 256


def own_cache(setup: Setup, extra_rows: int) -> dict[str, int | None]:
    """The sizes of such a proposer's own cache (its keyword arguments slots, max_len, num_blocks): per slot the
    context, the widest pass and `extra_rows` of its own (a tree's expansion, a block); in blocks of 16 when the
    target's cache is paged (None: dense)."""
    blocks = None if not setup.num_blocks else setup.num_blocks + setup.slots * (-(-extra_rows // 16) + 1)
    return dict(slots=setup.slots, max_len=setup.context + setup.widest + 1 + extra_rows, num_blocks=blocks)


def own_cache_bytes(layers: int) -> int:
    """Such a proposer's keys and values per block of positions (its `layers`, float32)."""
    from ..models.kv_cache import KVCache

    return KVCache.block_bytes(layers, torch.float32)


class HiddenStateProposer:
    """The rules shared by such proposers. A subclass keeps `held` (per slot: the positions of the target it has
    read, up to) and says in `admit` what a slot starts over with."""

    looks_up = False
    drafter = None  # no draft model: the draft policy prices these proposers by the steps it times
    reads_hidden = True  # every target pass's hidden states reach observe_hidden
    held: list[int]

    def admit(self, slot: int, partition: str) -> None:
        raise NotImplementedError

    def _feed(self, jobs: list[DraftJob], ends: list[int]) -> Any:
        """Run the drafter over each job's context from `held` up to its end; marks it read."""
        raise NotImplementedError

    def _feed_long_catch_ups(self, jobs: list[DraftJob]) -> int:
        """Each job's context beyond CATCH_UP_ROWS of its end fed alone first, FEED_ROWS rows a pass, so that no
        other job is padded to a prompt; returns the positions so fed."""
        caught_up = 0
        for job in jobs:
            end = len(job.tokens) - 1
            while end - self.held[job.slot] > CATCH_UP_ROWS:
                stop = min(self.held[job.slot] + FEED_ROWS, end - CATCH_UP_ROWS)
                caught_up += stop - self.held[job.slot]
                self._feed([job], [stop])
        return caught_up

    def lag(self, slot: int, tokens: list[int], model_tokens: list[int] | None = None) -> int:
        """The context positions not yet read: the last token is the next pass's, not yet the target's."""
        return max(0, len(tokens) - 1 - self.held[slot])

    def finished(self, slot: int, output: list[int], partition: str) -> None:
        self.admit(slot, partition)  # its blocks given back at once, not when the slot is next taken

    def forget(self, history: bool = True, prompts: bool = True) -> None:
        """Nothing is kept across requests (a slot's cache starts over at admission)."""
