"""A draft output head restricted to frequent tokens (FR-Spec, Zhao et al. 2025).

The head is the draft's largest matrix (Qwen2.5 0.5B: 151,936 x 896, over a quarter of its weights) and
every draft step reads all of it. Keeping only the rows of likely tokens makes a draft step cheaper. The
output stays exact: the target still verifies every drafted token, and a token outside the set is simply
never drafted (the target supplies it when its position comes).

Which tokens: a byte-level BPE vocabulary is numbered in merge order, and merges were learned most
frequent first, so low ids are the frequent tokens. We keep the first `size` ids plus the tokenizer's stop
tokens, with no frequency table to ship. On HumanEval's reference solutions (Qwen2.5 tokenizer) ids below
32,768 cover 96.3% of tokens and ids below 65,536 cover 99.2%.

On the native kernels the restricted head is also requantized to Q4_0 when it is stored wider (the bundled
draft's Q8_0 head: 62 -> 33 MB read per draft step): the draft only proposes, so a coarser head can only
change which tokens it proposes, and on HumanEval it proposes as well (see docs/kernels.md, "A Q4_0 draft head").
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.linear import NativeLinear
from .model import Transformer
from .quantize import QuantizedLinear, select_rows


def frequent_ids(size: int, vocab_size: int, always: frozenset[int]) -> torch.Tensor:
    """The ids a restricted head keeps: 0..size-1 and `always` (stop tokens), within vocab_size."""
    extra = sorted(i for i in always if size <= i < vocab_size)
    return torch.cat([torch.arange(min(size, vocab_size)), torch.tensor(extra, dtype=torch.long)])


class DraftHead:
    """A draft model's output head, giving logits over the target's vocabulary: from all of the draft's rows,
    or (ids given) from those rows only, the others -inf so that they are never drafted."""

    def __init__(self, model: Transformer, target_vocab_size: int, ids: torch.Tensor | None = None):
        self.size = target_vocab_size
        # the head's rows are its ids in ascending order (so the first maximum among them is the lowest id)
        self.ids = None if ids is None else torch.unique(ids[ids < target_vocab_size])
        self.module = None if self.ids is None else restricted_head(model, self.ids)
        # ids usually start 0, 1, 2, ...: that run is placed with one slice copy, the rest by index
        self._run = 0 if self.ids is None else int((self.ids == torch.arange(len(self.ids))).cumprod(0).sum())
        self._ids_on: torch.Tensor | None = None  # the ids on the device the logits were last on

    def argmax(self, logits: torch.Tensor) -> int:
        """The target-vocabulary id of the largest of one position's head logits, the lowest id on ties: what
        argmax over `over_vocab(logits)` gives, without spreading them."""
        if self.ids is None:
            return int(align_to_vocab(logits, self.size).argmax())
        index = int(logits.argmax())
        return index if index < self._run else int(self.ids[index])

    def argmax_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """`argmax` of each row of `logits` [rows, head rows], on their device: target-vocabulary ids [rows]."""
        if self.ids is None:
            return align_to_vocab(logits, self.size).argmax(-1)
        if self._ids_on is None or self._ids_on.device != logits.device:
            self._ids_on = self.ids.to(logits.device)  # once per device: a restricted head's ids are 65,536
        return self._ids_on[logits.argmax(-1)]

    def over_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., rows the head computed] -> [..., target vocabulary]."""
        if self.ids is None:
            return align_to_vocab(logits, self.size)
        full = logits.new_full((*logits.shape[:-1], self.size), float("-inf"))
        full[..., : self._run] = logits[..., : self._run]
        full[..., self.ids[self._run :]] = logits[..., self._run :]
        return full


def draft_ids(draft_vocab: int | None, draft_rows: int, stop_ids: frozenset[int]) -> torch.Tensor | None:
    """The ids a --draft-vocab of N keeps, or None (all) for 0, None or N >= the draft's rows."""
    return frequent_ids(draft_vocab, draft_rows, stop_ids) if draft_vocab and draft_vocab < draft_rows else None


def align_to_vocab(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Draft logits over the target's vocabulary: rows the target lacks can never be drafted."""
    if logits.shape[-1] >= size:
        return logits[..., :size]
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], size - logits.shape[-1]), float("-inf"))], dim=-1)


def restricted_head(model: Transformer, ids: torch.Tensor) -> nn.Module:
    """A head computing the logits of `ids` only (in that order), from the model's own head weights."""
    head = model.lm_head
    if isinstance(head, QuantizedLinear):
        return select_rows(head, ids)
    if isinstance(head, NativeLinear):
        return head.select_rows(ids, at_most_q4_0=True)
    weight = model.embed.weight if head is None else head.weight
    small = nn.Linear(weight.shape[1], len(ids), bias=head is not None and head.bias is not None)
    small.weight = nn.Parameter(weight.detach()[ids])
    if small.bias is not None:
        small.bias = nn.Parameter(head.bias.detach()[ids])
    return small.to(weight.device)
