"""What a target's passes hand a drafter that reads its hidden states (Transformer.serve_hidden).

A reader is called after every pass of the target, prefill chunks and verify passes alike, as
`reader(slots, starts, hidden [batch, seq, size])`: row t of batch row b is the pass's row stored at position
starts[b] + t of cache slot slots[b] (a token tree's node is stored there whatever its depth). What `hidden` holds:

- no layers named: the final hidden states after the last norm (size: the hidden size);
- layers named (a tuple of layer ids, repeats allowed): the residual stream entering each of those layers, side by
  side in the order named (size: len(layers) x the hidden size); id `num_layers` is the last layer's output before
  the final norm. On PyTorch the stream is read between blocks; on the native stack (which runs every block in one
  call) the stack is run in layer ranges cut at the named layers (kernels/stack.py: `layers`), the rows copied at
  each cut: the ranges give the whole stack's bits, since the residual a range leaves pending is added by the same
  float addition either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Reader = Callable[[list[int], list[int], torch.Tensor], None]


@dataclass(frozen=True)
class ServedHidden:
    reader: Reader
    layers: tuple[int, ...] | None = None  # None: the final hidden states after the last norm

    def taps(self) -> dict[int, list[torch.Tensor]] | None:
        """A pass's record of the named layers' inputs (each a list of row chunks), or None where none are named."""
        return None if self.layers is None else {layer: [] for layer in self.layers}

    def hidden(self, taps: dict[int, list[torch.Tensor]] | None, final: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The pass's hidden states as served, flat in the pass's rows: the named layers' inputs side by side, or
        `final()` (the normed output)."""
        if self.layers is None or taps is None:
            return final()
        return torch.cat([torch.cat(taps[layer], dim=0).float() for layer in self.layers], dim=-1)

    def serve_rows(self, slots: list[int], starts: list[int], lengths: list[int], hidden: torch.Tensor) -> None:
        """Rows laid end to end (Transformer.forward_rows): slot i's `lengths[i]` rows, one call per slot."""
        begin = 0
        for slot, start, length in zip(slots, starts, lengths, strict=True):
            self.reader([slot], [start], hidden[None, begin : begin + length])
            begin += length


def tapped(run: Callable[..., None], x: torch.Tensor, taps: dict[int, list[torch.Tensor]] | None, *,
           num_layers: int, scale: torch.Tensor | None) -> None:  # fmt: skip
    """`run(layers=...)` (a native stack's call over the rows `x`, in place) over every layer, in ranges cut at the
    tapped layers, each tapped layer's input copied into `taps` (layer 0's times the embedding scale, which the stack
    applies on entry; `num_layers`: the stack's output)."""
    if not taps:
        run(layers=None)
        return
    cuts = sorted({0, num_layers, *(layer for layer in taps if 0 < layer < num_layers)})
    for first, end in zip(cuts, cuts[1:], strict=False):
        if first in taps:
            taps[first].append(x.clone() if first or scale is None else x * scale.float())
        run(layers=(first, end))
    if num_layers in taps:
        taps[num_layers].append(x.clone())
