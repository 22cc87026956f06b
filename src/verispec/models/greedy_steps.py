"""Greedy draft steps of a model on PyTorch's kernels, each step's tokens chosen on the model's device.

A greedy draft of k tokens takes k passes of the draft model: the first feeds what the draft's cache lacks, each one
after feeds the tokens the pass before chose. Read by the host after each pass, a GPU's argmax makes the host wait
for the pass, k times a propose, and the card idle while the host plans the next one. `DeviceGreedySteps` feeds each
pass the tokens the last one chose where they lie, on the device, and copies every chosen token to the host once at
the end: the host plans pass i + 1 while the card runs pass i. The same interface and the same tokens as the native
library's GreedySteps (kernels/greedy.py): the argmax of the same logits, the lowest id on ties.
"""

from __future__ import annotations

import torch

from .draft_head import DraftHead
from .kv_cache import KVCache
from .pass_shape import on_device
from .passes import padded_logits


class DeviceGreedySteps:
    """Greedy steps of a model on PyTorch's kernels for several sequences, one trip to the host per call."""

    def __init__(self, model, head: DraftHead):
        self.model, self.head = model, head

    def __call__(self, cache: KVCache, slots: list[int], feeds: list[list[int]], steps: int) -> list[list[int]]:
        """Feed slot slots[m] the tokens feeds[m] (after its cached ones) and choose a token, then feed each chosen
        token and choose again: `steps` choices per sequence, returned. A slot's cache length advances by the tokens
        fed: len(feeds[m]) + steps - 1."""
        if steps < 1 or len(feeds) != len(slots) or not all(feeds):
            raise ValueError("greedy steps take at least one step and one or more tokens per slot")
        logits = padded_logits(self.model, cache, rows=feeds, slots=slots, draft_head=self.head)
        ends = on_device([len(feed) - 1 for feed in feeds], logits.device)
        chosen = [self.head.argmax_rows(logits[torch.arange(len(feeds), device=logits.device), ends])]
        for _ in range(steps - 1):
            out = self.model(chosen[-1][:, None], cache, slots, num_logits=1, invariant=False, head=self.head.module)
            chosen.append(self.head.argmax_rows(out[:, -1]))
        return torch.stack(chosen, dim=1).tolist()
