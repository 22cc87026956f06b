"""The attention masks of a pass's rows: causal over each sequence's prefix, token trees (a node attends to the
cache before its tree's root, then to its ancestors and itself), sliding windows (Transformer._layers)."""

from __future__ import annotations

import torch

from ..kernels.stack import TREE_ROWS


def tree_offsets(parents: list[list[int]], batch: int, seq: int) -> list[list[int]]:
    """Each row's position past its slot's length: its own index, or its parent's offset + 1."""
    if len(parents) != batch or any(len(row) != seq for row in parents):
        raise ValueError("token trees need one parent per row")
    offsets = []
    for row in parents:
        offset, root = [], []
        for i, p in enumerate(row):
            if p >= i or p < -1:
                raise ValueError(f"parents {row}: row {i}'s parent must be an earlier row, or -1")
            root.append(i if p < 0 else root[p])
            if i - root[i] >= TREE_ROWS:
                raise ValueError(f"parents {row}: a tree holds at most {TREE_ROWS} rows from its root")
            offset.append(i if p < 0 else offset[p] + 1)
        offsets.append(offset)
    return offsets


def tree_mask(parents: list[list[int]], starts: list[int], span: int) -> torch.Tensor:
    """[batch, 1, seq, span] boolean: the keys before the row's slot length, then its ancestors and itself
    (all earlier rows, for a row whose parent is -1)."""
    seq = len(parents[0])
    mask = torch.zeros(len(parents), 1, seq, span, dtype=torch.bool)
    for b, (row, start) in enumerate(zip(parents, starts, strict=True)):
        mask[b, 0, :, :start] = True
        for i, p in enumerate(row):
            if p < 0:
                mask[b, 0, i, start : start + i + 1] = True
            else:
                mask[b, 0, i] = mask[b, 0, p]
                mask[b, 0, i, start + i] = True
    return mask


def window_mask(mask, positions, starts, offsets, span: int, window: int) -> torch.Tensor:
    """`mask` (or the causal one where it is None) narrowed to the keys whose position is within `window` of
    the query's: key position > query position - window, positions being where the rotary puts them (a tree
    node's is its parent's + 1, wherever it is stored)."""
    keys = torch.arange(span, device=positions.device).repeat(len(starts), 1)
    for b, (start, row) in enumerate(zip(starts, offsets, strict=True)):
        keys[b, start : start + len(row)] = start + torch.tensor(row, device=positions.device)
    near = keys[:, None, :] > positions[:, :, None] - window
    causal = mask if mask is not None else causal_mask(positions, span)
    return causal & near.unsqueeze(1)


def causal_mask(positions: torch.Tensor, span: int) -> torch.Tensor:
    """[batch, 1, seq, span] boolean: key position <= query position."""
    key_positions = torch.arange(span, device=positions.device)
    return (key_positions[None, None, :] <= positions[:, :, None]).unsqueeze(1)
