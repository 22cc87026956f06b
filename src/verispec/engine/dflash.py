"""Drafting with a DFlash block drafter (models/dflash.py, read by models/dflash_checkpoint.py): the `dflash` method.

The drafter reads the target's features: the residual streams entering its chosen layers (`hidden_layers`: the engine
has the target serve them, Transformer.serve_hidden), fused by its fc and hidden norm as each pass hands them over and
kept per slot and position until read. At each propose a sequence of n tokens (the last, the target's own, not yet
verified) has the target's features of positions 0 .. n - 2 from passes where those tokens were final (prefill
chunks, then verify passes: a rejected draft's position is recomputed by the next pass before it is read). The
drafter writes the keys and values of the positions it has not read yet into its cache (the context: no attention,
one product per layer), then runs one block pass of k + 1 rows [the newest token, MASK x k] at positions n - 1 ..
n - 1 + k over that context, every sequence's block in the same pass; row i + 1 drafts the token at n + i (its argmax
greedy, else the keyed draw: draft_model.pick_draft). The block's rows are forgotten after the pass. Its cache holds
the positions it read from `first` on (a prompt start reused from the prefix cache was never computed by this
target, so the drafter starts after it).

Drafts are point masses to the acceptance rule like any proposer's, so the output is the target's whatever the
drafter proposes. On the native stack the drafter's matrices run on the native kernels in Q4_0 (requantized once);
its output head is the target's.
"""

from __future__ import annotations

import time

import torch

from ..models.dflash import DFlashDrafter, visible_block
from ..models.model import Transformer
from .draft_model import pick_draft, plain_greedy
from .drafting import DraftCost, DraftJob, Proposal
from .hidden_proposer import HiddenStateProposer, own_cache
from .setup import Setup

CATCH_UP_ROWS = 8  # a catch-up longer than this (a prompt) is timed apart, as the context the drafter lacked
FEED_ROWS = 256  # the context's keys and values are written this many rows at a time


def dflash_drafter(setup: Setup, coarse: bool | None = None) -> DFlashProposer:
    """The `dflash` method's proposer: the drafter given as --speculative-model (setup.draft), its matrices on the
    native kernels in Q4_0 where the target runs on the native stack (`coarse`: that choice forced)."""
    target, model = setup.target.model, setup.draft
    if coarse if coarse is not None else target.fused_blocks is not None:
        model.on_the_kernels()
    block = model.spec.block_size
    return DFlashProposer(target, model, **own_cache(setup, block))


class DFlashProposer(HiddenStateProposer):
    def __init__(self, target: Transformer, model: DFlashDrafter, *, slots: int, max_len: int,
                 num_blocks: int | None = None):  # fmt: skip
        self.target, self.model = target, model
        self.hidden_layers = model.spec.target_layers
        self.cache = model.new_cache(slots, max_len, num_blocks)
        self.fused: list[dict[int, torch.Tensor]] = [{} for _ in range(slots)]  # per slot: position -> g
        self.first = [0] * slots  # per slot: the position its cache starts at (stored at 0)
        self.held = [0] * slots  # per slot: the context positions written to its cache, up to
        self.spent = DraftCost()

    # ---- what the target hands over ------------------------------------------------------------------------------
    def observe_hidden(self, slots: list[int], starts: list[int], hidden: torch.Tensor) -> None:
        """Every pass's features, fused (g), kept by position until read."""
        with torch.inference_mode():
            fused = self.model.fuse(hidden)
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            kept = self.fused[slot]
            for t in range(fused.shape[1]):
                kept[start + t] = fused[row, t]

    # ---- the engine's questions ---------------------------------------------------------------------------------
    def admit(self, slot: int, partition: str) -> None:
        self.cache.release(slot)
        self.fused[slot].clear()
        self.first[slot] = self.held[slot] = 0

    # ---- drafting -----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        self.spent = DraftCost(modelled=True)
        ready = [job for job in jobs if job.k and self._readable(job)]
        drafted: dict[int, list[int]] = {job.slot: [] for job in jobs}
        if ready:
            self._catch_up(ready)
            drafted |= self._drafts(ready)
        return [Proposal(torch.tensor(drafted[job.slot], dtype=torch.long)) for job in jobs]

    def _readable(self, job: DraftJob) -> bool:
        """Whether the target's features of every position from `held` to the last before the sequence's newest token
        are kept; where some are missing (a prompt start taken from the prefix cache) the drafter starts over after
        the last gap. False where the position before the newest token is missing."""
        slot, end = job.slot, len(job.tokens) - 1
        kept = self.fused[slot]
        if end < self.held[slot]:  # the sequence is shorter than what was read (it started over): read anew
            self.cache.release(slot)
            self.first[slot] = self.held[slot] = end
        start = end
        while start > self.held[slot] and start - 1 in kept:
            start -= 1
        if start > self.held[slot]:  # a gap: the drafter reads from after it
            if start == end:
                return False
            self.cache.release(slot)
            self.first[slot] = self.held[slot] = start
            for position in [p for p in kept if p < start]:
                del kept[position]
        return True

    def _catch_up(self, jobs: list[DraftJob]) -> None:
        """Write the keys and values of each sequence's positions [held, n - 1) (the target's features read since the
        last propose) to the drafter's cache; the last propose's block rows forgotten."""
        begin, caught_up = time.perf_counter(), 0
        for job in jobs:
            slot, end, first = job.slot, len(job.tokens) - 1, self.first[job.slot]
            self.cache.set_length(slot, min(self.held[slot] - first, self.cache.lengths[slot]))
            if end - self.held[slot] > CATCH_UP_ROWS:
                caught_up += end - self.held[slot]
            while self.held[slot] < end:
                stop = min(self.held[slot] + FEED_ROWS, end)
                positions = list(range(self.held[slot], stop))
                g = torch.stack([self.fused[slot].pop(p) for p in positions])
                stored = [p - first for p in positions]
                self.model.inject(g, torch.tensor(positions), cache=self.cache, slot=slot, stored=stored)
                self.held[slot] = stop
        if caught_up:  # the context the drafter lacked (a prompt), beyond a step's accepted tokens
            self.spent.catch_up_seconds, self.spent.catch_up_tokens = time.perf_counter() - begin, caught_up

    def _drafts(self, jobs: list[DraftJob]) -> dict[int, list[int]]:
        """One block pass over every job's block (k + 1 rows, at most the trained block), padded to the widest; each
        job's drafts from its rows 1 .. k, the target's head over all of them at once."""
        spec = self.model.spec
        rows = [min(job.k, spec.block_size - 1) + 1 for job in jobs]
        width = max(rows)
        tokens = [[job.tokens[-1]] + [spec.mask_token] * (width - 1) for job in jobs]
        ends = [len(job.tokens) - 1 for job in jobs]
        starts = [end - self.first[job.slot] for job, end in zip(jobs, ends, strict=True)]
        slots = [job.slot for job in jobs]
        ids = torch.tensor(tokens, device=self.model.device)
        normed = self.model.block_pass(
            self.model.embeddings(ids, self.target), cache=self.cache, slots=slots, starts=starts,
            positions=torch.tensor([[end + t for t in range(width)] for end in ends]),
            visible=visible_block(starts, rows, width),
        )  # fmt: skip
        for slot, start in zip(slots, starts, strict=True):
            self.cache.set_length(slot, start)  # the block's rows are guesses: forgotten
        logits = self.model.logits(torch.cat([normed[b, 1:count] for b, count in enumerate(rows)]), self.target)
        drafted, at = {}, 0
        for job, count in zip(jobs, rows, strict=True):
            mine, at = logits[at : at + count - 1], at + count - 1
            drafted[job.slot] = self._pick(job, mine)
        return drafted

    @staticmethod
    def _pick(job: DraftJob, logits: torch.Tensor) -> list[int]:
        """A job's drafts from its block's logits [k, vocab], one after another (a grammar or a logit adjustment
        sees the drafts before each); cut where its grammar allows nothing."""
        if plain_greedy(job):
            return [int(i) for i in logits.argmax(dim=-1)]
        drafted: list[int] = []
        for row in logits:
            choice = pick_draft(row, job, drafted)
            if choice is None:
                break
            drafted.append(choice)
        return drafted
