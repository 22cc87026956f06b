"""The one verification site: every sequence's drafts checked in one target pass, the target's own token taken at
every row (its argmax, or its draw with the request's keyed noise, after the request's logit adjustments and its
grammar's mask), each sequence's verdict from those tokens (decoding/acceptance.py), its cache rolled back to what was
accepted. Before the pass, each draft is cut where its grammar rejects it (structured output)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch

from ..decoding.acceptance import verify_batch
from ..decoding.logprobs import token_logprobs
from ..decoding.sampling import keyed_draw
from ..kernels.native import argmax_rows
from ..models.kv_cache import KVCache
from ..models.model import Transformer
from ..models.passes import pass_logits
from .clock import settled
from .drafting import Proposal
from .policy import DraftPolicy
from .sequence import Sequence, Verdict

Guarded = Callable[..., object]  # guarded(seq, work, *args): work(*args), or None where it raised (seq then failed)


class Verifier:
    def __init__(self, model: Transformer, cache: KVCache, policy: DraftPolicy, guarded: Guarded):
        self.model, self.cache, self.policy, self.guarded = model, cache, policy, guarded

    # ---- grammars ---------------------------------------------------------------------------------------------
    def constrain(self, seqs: list[Sequence], proposals: list[Proposal | None]) -> list[torch.Tensor | None]:
        """Per sequence with a grammar: cut its proposal at the first token the grammar rejects (a lookup's
        tokens are not masked), and the masks [k + 1, V] of the states the verification rows stand at."""
        masks: list[torch.Tensor | None] = []
        for i, (seq, proposal) in enumerate(zip(seqs, proposals, strict=True)):
            if seq.grammar is None or proposal is None:
                masks.append(None)
                continue
            if proposal.parents is not None:
                masks.append(self._constrain_tree(seqs, proposals, i))
                continue
            found = self.guarded(seq, seq.grammar.masks, proposal.tokens.tolist())
            if found is None:
                proposals[i] = None
                masks.append(None)
                continue
            allowed, valid = found
            if valid < proposal.tokens.shape[0]:
                # a cut draft is still its proposer's (its counts, and the per-proposer alphas drafting reads)
                proposals[i] = replace(proposal, tokens=proposal.tokens[:valid])
            masks.append(allowed)
        return masks

    def _constrain_tree(self, seqs: list[Sequence], proposals: list[Proposal | None], i: int) -> torch.Tensor | None:
        """A token tree's masks, its nodes the grammar rejects (and their subtrees) dropped and the rest renumbered
        (a tree cut stays its proposer's); None, and no proposal, when the sequence failed."""
        proposal = proposals[i]
        found = self.guarded(seqs[i], seqs[i].grammar.tree_masks, proposal.tokens.tolist(), proposal.parents)
        if found is None:
            proposals[i] = None
            return None
        allowed, kept = found
        if len(kept) < proposal.tokens.shape[0]:
            number = {node: j for j, node in enumerate(kept)}
            parents = [-1 if proposal.parents[node] < 0 else number[proposal.parents[node]] for node in kept]
            proposals[i] = replace(proposal, tokens=proposal.tokens[kept], parents=parents)
        return allowed

    # ---- the pass and the verdicts ------------------------------------------------------------------------------
    def verify(
        self, seqs: list[Sequence], proposals: list[Proposal | None], masks: list[torch.Tensor | None]
    ) -> list[Verdict | None]:
        """One target pass over [pending, drafts] of every sequence still running; the target's own token at every
        row of every sequence, found for the whole batch at once (_choices); each sequence's verdict from them
        (acceptance.verify_batch); each cache rolled back to what was accepted. None for a sequence that failed."""
        live = [i for i, proposal in enumerate(proposals) if proposal is not None]
        verdicts: list[Verdict | None] = [None] * len(seqs)
        if not live:
            return verdicts
        rows, parents = zip(*(self._row(seqs[i], proposals[i]) for i in live), strict=True)
        begin = settled(self.model.device)
        logits, ends = pass_logits(
            self.model, self.cache, rows=list(rows), slots=[seqs[i].slot for i in live], parents=list(parents)
        )
        # the pass's rows as computed (padding included where there is any): what lookups are priced by
        self.policy.record_pass(logits.shape[0], settled(self.model.device) - begin)
        # each sequence's verification rows: the last k + 1 of its row
        spans = {i: (end - proposals[i].tokens.shape[0] - 1, end) for i, end in zip(live, ends, strict=True)}
        raws = {i: logits[start:end] for i, (start, end) in spans.items()}
        choices = self._choices(seqs, proposals, masks=masks, logits=logits, spans=spans, raws=raws)
        decided = [i for i in live if choices.get(i) is not None]
        drafts = [proposals[i].tokens.tolist() for i in decided]
        judged = verify_batch(drafts, [proposals[i].parents for i in decided], [choices[i] for i in decided])
        for i, draft, verdict in zip(decided, drafts, judged, strict=True):
            verdicts[i] = self.guarded(seqs[i], partial(self.settle, seqs[i], draft, raws[i], verdict))
        return verdicts

    def _row(self, seq: Sequence, proposal: Proposal) -> tuple[list[int], list[int] | None]:
        """A sequence's row of the pass (its pending tokens, then its drafts) and, for a token tree, each row's parent:
        the tree's root is the last pending token, node j's row is len(pending) + j."""
        pending = seq.tokens[self.cache.lengths[seq.slot] :]
        tree, root = proposal.parents, len(pending) - 1
        parents = None if tree is None else [-1] * len(pending) + [root + 1 + p if p >= 0 else root for p in tree]
        return pending + proposal.tokens.tolist(), parents

    def _choices(
        self, seqs: list[Sequence], proposals: list[Proposal | None], masks: list[torch.Tensor | None],
        logits: torch.Tensor, spans: dict[int, tuple[int, int]], raws: dict[int, torch.Tensor],
    ) -> dict[int, list[int] | None]:  # fmt: skip
        """The target's own token at each verification row of each live sequence (None for one that failed): the
        argmax (greedy) or the keyed draw (sampled) of the row's logits after the request's logit_bias and
        penalties and its grammar's mask. Greedy rows left as the target wrote them (the common case) take one
        argmax over the whole pass; a sampled row's draw is one vectorized race over the vocabulary (stacking all
        rows' races into one tensor measured slower: it copies every row's distribution and noise)."""
        plain = {i for i in spans if _unadjusted_greedy(seqs[i], masks[i])}
        choices: dict[int, list[int] | None] = {}
        if plain:
            flat = argmax_rows(logits).tolist()
            for i in plain:
                choices[i] = flat[spans[i][0] : spans[i][1]]
        for i in spans:
            if i in choices:
                continue
            raw = raws[i].cpu()  # a request's adjustments, grammar and keyed noise live on the host
            adjusted = self.guarded(seqs[i], partial(_adjusted, seqs[i], proposals[i], raw, masks[i]))
            if adjusted is None:
                choices[i] = None
            elif seqs[i].request.params.greedy:
                choices[i] = argmax_rows(adjusted).tolist()
            else:
                choices[i] = _drawn(seqs[i], proposals[i], adjusted)
        return choices

    def settle(
        self, seq: Sequence, draft: list[int], raw: torch.Tensor, judged: tuple[int, int, list[int] | None]
    ) -> Verdict:
        """The consequences of verify_batch's verdict `judged` (drafted tokens accepted, the target's next token, a
        tree's accepted path of rows or None): the cache rolled back to the accepted tokens (a tree keeps its accepted
        path where a chain's would lie), and the logprobs of the emitted tokens when asked for."""
        accepted, next_token, path = judged
        if path is None:
            self.cache.set_length(seq.slot, len(seq.tokens) + accepted)
            tokens, rows = draft[:accepted], list(range(accepted + 1))
        else:
            self.cache.keep_path(seq.slot, len(seq.tokens) - 1, [0, *path])
            tokens, rows = [draft[row - 1] for row in path], [0, *path]
        logprobs = None
        if seq.request.logprobs is not None:
            logprobs = token_logprobs(raw[rows].cpu(), [*tokens, next_token], seq.request.logprobs)
        return Verdict(accepted, next_token, logprobs, None if path is None else tokens)


def _unadjusted_greedy(seq: Sequence, mask: torch.Tensor | None) -> bool:
    return seq.request.params.greedy and mask is None and not seq.adjustments.active


def _adjusted(seq: Sequence, proposal: Proposal, raw: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The rows adjusted by the request's logit_bias and penalties (a chain's row by row over its drafted tokens; a
    tree is drafted only without penalties, which would count each row's own path), then masked by its grammar (a
    tree's each row by its path's: Verifier._constrain_tree)."""
    drafted = proposal.tokens.tolist() if proposal.parents is None else None
    logits = seq.adjustments.apply(raw, drafted) if drafted is not None else seq.adjustments.apply(raw)
    return logits if mask is None else logits.masked_fill(~mask, float("-inf"))


def _drawn(seq: Sequence, proposal: Proposal, logits: torch.Tensor) -> list[int]:
    """A sampled sequence's token at each row: the keyed draw (decoding/noise.py) from the row's logits (raced alone,
    so its bits are those of a plain step's single row) with the noise of the position the row predicts (the next
    one, plus its node's depth in a tree), as plain decoding draws there."""
    params, next_position = seq.request.params, len(seq.tokens)
    if proposal.parents is None:
        positions = list(range(next_position, next_position + logits.shape[0]))
    else:
        positions = [next_position]
        for parent in proposal.parents:
            positions.append(positions[parent + 1] + 1)
    rows = zip(logits, positions, strict=True)
    return [keyed_draw(row, params, seq.noise, position) for row, position in rows]
