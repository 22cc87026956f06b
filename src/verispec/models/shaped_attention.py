"""Attention in a pass of one shape (pass_shape.py): each row sums its keys in an order that depends on the row alone.

A row at rotary position p attends to two parts, merged in this order as flash attention merges blocks (a running
maximum, sum and output, in float32):

- its older keys, those at positions up to p - RECENT: stored where a chain stores them (a token tree's nodes lie
  after its root, and a tree holds fewer than RECENT rows), read from the cache in blocks of KEY_BLOCK positions, in
  position order, under a mask (key position <= p - RECENT; within a sliding window, > p - window). A block every key
  of which is masked leaves the merge unchanged bit for bit (its sum is 0 and the running maximum stays), so a pass
  may read as many blocks as its longest row needs: a row gets the same bits from a pass that reads more;
- its RECENT newest positions, p - RECENT + 1 .. p, gathered per row in position order: a chain's keys where they
  are stored, a tree node's ancestors (and itself) from wherever the pass stored them.

So a token tree's node sums exactly what the same token decoded in a chain sums, in the same order, and a decode
step, a verify pass and a prefill give a row the same bits. Every product has one shape per pass shape and block
count: [groups x kv heads] of (width x group) x KEY_BLOCK for an older block, and one small product per row for the
recent part.
"""

from __future__ import annotations

from functools import partial

import torch

from ..kernels import triton_attention
from ..kernels.stack import TREE_ROWS

KEY_BLOCK = 1024  # older keys per block: a multiple of the cache's block size
RECENT = TREE_ROWS  # newest positions gathered per row: a tree's nodes lie fewer than this past its root


class ShapedPages:
    """Where a shaped pass writes (`written`: the pools' index of its rows, in order) and what each row reads, in one of
    two forms. Written out: per block of older keys, each group's cache block and row at each of its KEY_BLOCK
    positions (`older_blocks` [groups, KEY_BLOCK] per block, `older_rows` [KEY_BLOCK]) but those `older` hides (per
    window, [groups, width, key blocks x KEY_BLOCK], True: hidden), and its recent keys' addresses (`recent_block`,
    `recent_row` [groups, width, RECENT]) but those `recent` hides (likewise); `heads` counts 0, 1, ... up to a layer's
    most kv heads (made once a pass); keys are gathered straight into the products' layouts. Or `fused`: the
    arguments of kernels/triton_attention.attend, which reads the same keys where the cache holds them (on CUDA)."""

    def __init__(self, *, written: tuple, fused: dict | None = None, older_blocks: list[torch.Tensor] = (),
                 older_rows: torch.Tensor | None = None, older: dict | None = None,
                 recent_block: torch.Tensor | None = None, recent_row: torch.Tensor | None = None,
                 recent: dict | None = None, heads: torch.Tensor | None = None):  # fmt: skip
        self.written, self.fused = written, fused
        self.older_blocks, self.older_rows, self.older = older_blocks, older_rows, older
        self.recent_block, self.recent_row, self.recent = recent_block, recent_row, recent
        self.heads = heads

    def attend(self, attn, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """[groups, width, heads x head size]: `attn`'s (an Attention's) queries `q` [groups, width, heads, head
        size] over the pools `keys`, `values` [blocks, kv heads, block size, head size]."""
        if self.fused is not None:
            return triton_attention.attend(attn, q, keys, values, **self.fused)
        groups, width, heads, size = q.shape
        kv_heads = attn.num_kv_heads
        # scaled once for both parts (the scores' scale folded into the queries: one multiplication fewer per part)
        grouped = (q.float() * attn.scale).view(groups, width, kv_heads, heads // kv_heads, size)
        state = self._older(attn, grouped, keys, values) if self.older_blocks else None
        where = (self.recent_block[:, :, None, :], self.heads[:kv_heads, None],
                 self.recent_row[:, :, None, :])  # [groups, width, kv heads, RECENT]  # fmt: skip
        scores = grouped @ keys[where].float().transpose(-1, -2)  # [groups, width, kv heads, group, RECENT]
        hidden = self.recent[attn.window][:, :, None, None, :]
        recent_values = values[where].float()
        top, total, out = _merge(state, _scores(attn, scores, hidden), lambda weights: weights @ recent_values)
        if attn.sinks is not None:  # a sink logit per head takes its share of the softmax, with no value
            total = total + torch.exp(attn.sinks.float().view(kv_heads, -1) - top)
        return (out / total[..., None]).reshape(groups, width, -1).to(q.dtype)

    def _older(self, attn, grouped: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> tuple:
        """The running (maximum, sum, output) over the older keys, block by block, laid out as the recent part's
        ([groups, width, kv heads, group, ...]); each block one product per (group, kv head)."""
        groups, width, kv_heads, group, size = grouped.shape
        by_head = grouped.permute(0, 2, 1, 3, 4).reshape(groups, kv_heads, width * group, size)
        heads = self.heads[:kv_heads, None]
        state = None
        for block, blocks in enumerate(self.older_blocks):
            where = (blocks[:, None, :], heads, self.older_rows)  # [groups, kv heads, KEY_BLOCK]
            scores = (by_head @ keys[where].float().transpose(-1, -2)).view(groups, kv_heads, width, group, -1)
            hidden = self.older[attn.window][:, None, :, None, block * KEY_BLOCK : (block + 1) * KEY_BLOCK]
            state = _merge(state, _scores(attn, scores, hidden), partial(_by_head, values=values[where].float()))
        return tuple(t.transpose(1, 2) for t in state)


def _by_head(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """weights [groups, kv heads, width, group, keys] times values [groups, kv heads, keys, size]."""
    return (weights.flatten(2, 3) @ values).unflatten(2, weights.shape[2:4])


def _scores(attn, scores: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Soft-capped where the model caps, -inf at the keys `hidden` hides from the row."""
    if attn.softcap:
        scores = torch.tanh(scores / attn.softcap) * attn.softcap
    return scores.masked_fill(hidden, float("-inf"))


def _merge(state, scores: torch.Tensor, weighted):
    """The running (maximum, sum, output) after one more part of the keys (`weighted(weights)`: its values' weighted
    sum); None: none before it."""
    top = scores.amax(-1) if state is None else torch.maximum(state[0], scores.amax(-1))
    # no key yet (top -inf): shifted by the least finite number instead, so exp(-inf - shift) = 0; one operation
    shift = top.clamp(min=torch.finfo(top.dtype).min)
    weights = torch.exp(scores - shift[..., None])
    total, out = weights.sum(-1), weighted(weights)
    if state is not None:
        kept = torch.exp(state[0] - shift)
        total, out = state[1] * kept + total, state[2] * kept[..., None] + out
    return top, total, out
