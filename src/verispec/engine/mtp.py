"""Drafting with the target's own multi-token-prediction layer (models/mtp.py): the `mtp` method.

The MTP layer at position i reads the token at i + 1 and the target's hidden state at i; the target hands every pass's
hidden states over (it `reads_hidden`: the engine has the target serve them, Transformer.serve_hidden), kept here per
slot and position until read. At each propose a
sequence of n tokens (the last, the target's own token, not yet verified) has the target's hidden states of positions
0 .. n - 2 from passes where those tokens were final (the prompt's prefill, then verify passes: a rejected draft's
position is recomputed by the next pass before it is read). So the MTP layer catches up on positions
[held, n - 1) with (tokens[i + 1], hidden[i]), its last row predicting the token after the target's own (position n);
each further draft reads the layer's own output in place of the target's hidden state. Those chained positions are
guesses: the next propose rolls the layer's cache back to what it read of the target (`held`).

Drafts are point masses to the acceptance rule like any proposer's: greedy drafts are the layer's argmax, sampled
ones its draw with the sequence's keyed noise (draft_model.pick_draft), so the output is the target's whatever the
layer proposes.

The head. The layer's logits come from the target's head, the largest matrix it reads (Qwen3.5: 248,320 rows): over
all of it, a draft step of the layer costs a third of a target step on Qwen3.5-0.8B's shape, over its first 16,384
rows a twentieth (benchmarks/hybrid_costs.py; docs/models.md). So the MTP drafter reads the head restricted as
--draft-vocab says (models/draft_head.py: the first N ids and the stop tokens), by default MTP_HEAD_ROWS (the command
line's default, also from the Python API) where the vocabulary is larger than twice that; --draft-vocab 0 reads all
of it.
"""

from __future__ import annotations

import time

import torch

from ..defaults import DEFAULT_DRAFT_VOCAB
from ..errors import InvalidParameterError
from ..models.draft_head import DraftHead, frequent_ids
from ..models.kv_cache import KVCache
from ..models.loading import LoadedModel
from ..models.model import Transformer
from ..models.mtp import mtp_config
from .draft_model import pick_draft, plain_greedy
from .drafting import DraftCost, DraftJob, Proposal
from .hidden_proposer import CATCH_UP_ROWS, HiddenStateProposer
from .setup import Setup

MTP_HEAD_ROWS = DEFAULT_DRAFT_VOCAB  # the MTP drafter's head by default: the command line's --draft-vocab, everywhere


def mtp_drafter(setup: Setup) -> MtpDrafter:
    """The `mtp` method's proposer: the target's MTP layer with a cache of the engine's blocks, its head restricted
    as the draft_vocab option says."""
    target = setup.target.model
    vocab = target.config.vocab_size
    rows = mtp_head_rows(setup.options.get("draft_vocab"), vocab)
    ids = frequent_ids(rows, vocab, setup.stop_ids) if rows and rows < vocab else None
    return MtpDrafter(target, setup.slots, setup.context + setup.widest + 1, setup.num_blocks or None, head_ids=ids)


def mtp_cache_bytes(target: LoadedModel) -> int:
    """The MTP layer's keys and values per block of positions (one layer of the target's shape)."""
    return KVCache.block_bytes(mtp_config(target.model.config), target.model.cache_dtype)


def mtp_head_rows(draft_vocab: int | None, vocab_size: int) -> int | None:
    """The rows the MTP drafter's head keeps for a --draft-vocab (None: not given), None meaning all."""
    if draft_vocab is None:
        return MTP_HEAD_ROWS if vocab_size > 2 * MTP_HEAD_ROWS else None
    return draft_vocab or None


class MtpDrafter(HiddenStateProposer):
    def __init__(
        self, target: Transformer, slots: int, max_len: int, num_blocks: int | None = None,
        head_ids: torch.Tensor | None = None,
    ):  # fmt: skip
        """`head_ids`: the target's ids the layer may draft (a restricted head: models/draft_head.py), None: all."""
        if target.mtp is None:
            raise InvalidParameterError(
                "the mtp speculative method needs a target whose checkpoint carries a multi-token-prediction layer "
                "(Qwen3.5: mtp_num_hidden_layers in its config and its mtp.* tensors); this one has none"
            )
        self.target, self.model = target, target.mtp
        self.head = DraftHead(target, target.config.vocab_size, head_ids)
        self.cache = self.model.new_cache(slots, max_len + CATCH_UP_ROWS, num_blocks)  # padded catch-ups' room
        self.hidden: list[dict[int, torch.Tensor]] = [{} for _ in range(slots)]  # per slot: position -> hidden
        self.held = [0] * slots  # per slot: positions the layer has read from the target (final ones)
        self.spent = DraftCost()

    def observe_hidden(self, slots: list[int], starts: list[int], hidden: torch.Tensor) -> None:
        """Every position's final hidden state, until the layer reads it (a sequence that does not draft keeps its
        positions' until it does, or ends: hidden size x 4 bytes a position)."""
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            for t in range(hidden.shape[1]):
                self.hidden[slot][start + t] = hidden[row, t]

    def admit(self, slot: int, partition: str) -> None:
        self.cache.release(slot)
        self.hidden[slot].clear()
        self.held[slot] = 0

    @torch.inference_mode()
    def propose(self, jobs: list[DraftJob]) -> list[Proposal]:
        self.spent = DraftCost(modelled=True)
        # a sequence whose target has passed no new position since the last propose (none verified) drafts nothing
        ready = [job for job in jobs if job.k and len(job.tokens) - 1 > self.held[job.slot]]
        drafted: dict[int, list[int]] = {job.slot: [] for job in jobs}
        if ready:
            hidden = self._catch_up(ready, drafted)
            self._chain(ready, drafted, hidden)
        return [Proposal(torch.tensor(drafted[job.slot], dtype=torch.long)) for job in jobs]

    def _catch_up(self, jobs: list[DraftJob], drafted: dict[int, list[int]]) -> torch.Tensor:
        """Read what each sequence's target passes gave since the last propose; the first drafts. Returns each job's
        last output hidden state [jobs, 1, hidden]. A long catch-up (a prompt) is fed alone first, FEED_ROWS rows a
        pass, so that no other job is padded to it; what is read is marked read only once the layer has run on it
        (a pass that fails leaves every sequence as it was)."""
        begin = time.perf_counter()
        for job in jobs:  # the chained guesses of the last propose are forgotten
            self.cache.set_length(job.slot, min(self.held[job.slot], self.cache.lengths[job.slot]))
        caught_up = self._feed_long_catch_ups(jobs)
        last = self._feed(jobs, [len(job.tokens) - 1 for job in jobs])
        self._pick(jobs, drafted, self._logits(last))
        if caught_up:  # the context the layer lacked (a prompt), beyond a step's accepted tokens
            self.spent.catch_up_seconds, self.spent.catch_up_tokens = time.perf_counter() - begin, caught_up
        return last[:, None]

    def _feed(self, jobs: list[DraftJob], ends: list[int]) -> torch.Tensor:
        """The layer over each job's positions [held, end) (the token at i + 1, the target's hidden state at i), in
        one padded pass; returns each job's last output [jobs, hidden]."""
        rows, states = [], []
        for job, end in zip(jobs, ends, strict=True):
            held = self.held[job.slot]
            rows.append(job.tokens[held + 1 : end + 1])
            states.append(torch.stack([self.hidden[job.slot][i] for i in range(held, end)]))
        width = max(len(row) for row in rows)
        tokens = torch.tensor([row + [0] * (width - len(row)) for row in rows], device=self.model.device)
        hidden = torch.stack([torch.cat([s, s[-1:].expand(width - len(s), -1)]) for s in states])  # padded
        normed = self.model.draft(self.target, tokens, hidden, cache=self.cache, slots=[job.slot for job in jobs])
        for job, end in zip(jobs, ends, strict=True):
            for i in range(self.held[job.slot], end):
                del self.hidden[job.slot][i]
            self.held[job.slot] = end
            self.cache.set_length(job.slot, end)  # padded rows forgotten
        return torch.stack([normed[i, len(row) - 1] for i, row in enumerate(rows)])

    def _chain(self, jobs: list[DraftJob], drafted: dict[int, list[int]], hidden: torch.Tensor) -> None:
        """Further drafts, each from the layer's own last output and the draft before it."""
        for step in range(1, max(job.k for job in jobs)):
            active = [i for i, job in enumerate(jobs) if job.k > step and len(drafted[job.slot]) == step]
            if not active:
                return
            tokens = torch.tensor([[drafted[jobs[i].slot][-1]] for i in active], device=self.model.device)
            slots = [jobs[i].slot for i in active]
            normed = self.model.draft(self.target, tokens, hidden[active], cache=self.cache, slots=slots)
            hidden = hidden.clone()
            hidden[active] = normed
            self._pick([jobs[i] for i in active], drafted, self._logits(normed[:, -1]))

    def _logits(self, normed: torch.Tensor) -> torch.Tensor:
        """The head's logits of the layer's outputs: over the restricted rows where there are some."""
        return self.target.head_logits(normed, self.head.module)

    def _pick(self, jobs: list[DraftJob], drafted: dict[int, list[int]], logits: torch.Tensor) -> None:
        for job, row in zip(jobs, logits, strict=True):
            if plain_greedy(job):
                choice = self.head.argmax(row)
            else:
                choice = pick_draft(self.head.over_vocab(row), job, drafted[job.slot])
            if choice is not None:
                drafted[job.slot].append(choice)
