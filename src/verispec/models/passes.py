"""Forwards of many rows at once, one cache slot per row: padded to a common width (the draft model's passes), or,
for the target's verify pass, laid end to end where the native stack can (pass_logits).

Padding cannot change a real token's result: each row reads only its own cache slot, a query attends only to key
positions at or before its own, and after the forward every slot's length is set back to its real tokens, so
padded keys are never read again (they are overwritten before any later read).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from .draft_head import DraftHead
from .model import KVCache, Transformer

PAD_TOKEN = 0  # any valid id: padded positions are computed and then forgotten


def padded_forward(
    model: Transformer, cache: KVCache, rows: list[list[int]], slots: list[int], **options: Any
) -> list[torch.Tensor]:
    """One forward of all `rows` (row i appends to slot i); returns each row's logits [len(row), V] on the CPU.
    `options`: padded_logits' draft_head and parents. `parents` (a verify pass): per row, its token tree's parents
    (Transformer.forward), or None for a chain.

    With a `draft_head` it is a draft's forward: that head, ordinary attention (a draft's rounding never has
    to match a decode step's, see Transformer.forward), logits over the head's own rows (`DraftHead.over_vocab`
    spreads them over the target's vocabulary)."""
    logits = padded_logits(model, cache, rows=rows, slots=slots, **options).cpu()
    return [logits[i, : len(row)] for i, row in enumerate(rows)]


def padded_logits(
    model: Transformer,
    cache: KVCache,
    rows: list[list[int]],
    slots: list[int],
    draft_head: DraftHead | None = None,
    parents: list[list[int] | None] | None = None,
) -> torch.Tensor:
    """padded_forward's pass, its logits as one tensor [rows, widest row, V] (row i's first len(rows[i]) are its) on
    the model's device."""
    width = max(len(row) for row in rows)
    padded = [row + [PAD_TOKEN] * (width - len(row)) for row in rows]
    starts = [cache.lengths[slot] for slot in slots]
    batch = torch.tensor(padded, dtype=torch.long, device=model.device)
    trees = None
    if parents is not None and any(p is not None for p in parents):
        trees = [[-1] * width if p is None else p + [-1] * (width - len(p)) for p in parents]
    if draft_head is None:
        logits = model(batch, cache, slots, parents=trees)
    else:
        logits = model(batch, cache, slots, invariant=False, head=draft_head.module)
    for slot, start, row in zip(slots, starts, rows, strict=True):
        cache.set_length(slot, start + len(row))
    return logits


def pass_logits(
    model: Transformer, cache: KVCache, rows: list[list[int]], slots: list[int], parents: list[list[int] | None]
) -> tuple[torch.Tensor, list[int]]:
    """A verify pass: one forward of all `rows` (row i appends to slot i; `parents` as padded_forward's). Returns
    the logits of the rows it computed [rows, V], left on the model's device (a GPU's pass sends the host only the
    tokens chosen from them, and the rows a request needs whole: verification.py), and where each of `rows` ends
    among them. On the
    native stack the rows are laid end to end (Transformer.forward_rows: no padding, the same bits); elsewhere
    they are padded to the widest, and the padding is computed too."""
    if model.fused_blocks is not None:
        logits = model.forward_rows(rows, cache, slots, parents)
        return logits, list(itertools.accumulate(len(row) for row in rows))
    padded = padded_logits(model, cache, rows, slots, parents=parents)
    width = padded.shape[1]
    return padded.view(-1, padded.shape[-1]), [n * width + len(row) for n, row in enumerate(rows)]
