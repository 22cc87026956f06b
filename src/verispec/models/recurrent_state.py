"""The recurrent state of a hybrid model's linear-attention layers (delta_net.py), beside its KV cache.

A KV cache rolls back by length because every position keeps its own keys; a recurrent state is one value that each
token overwrites, so it cannot. Here each slot keeps its state *per length*: a pass that appends n tokens to a slot
records the state after each of them (the recurrent form makes each one anyway: keeping it is keeping a reference, no
copy), and `set_length` (the cache's rollback: a rejected draft, a padded row) picks the one at the new length. So a
rollback costs nothing but the memory of the states a verify pass made, and lands exactly on the state after the last
accepted token. A pass starts by dropping every state but the one at its slot's length (`begin`).

Rules: a length is only ever set to one a pass recorded (else ValueError: a rollback into a prefill, whose chunked
form keeps its last state only, or past what was computed); a released slot starts again from zeros. Memory: the
native recurrence writes a pass's states into one of two tensors per slot and layer (`buffer`), so a slot holds at
most twice a pass's rows of states, and a prefill's last.
"""

from __future__ import annotations

import torch

from .config import ModelConfig

State = tuple[torch.Tensor, torch.Tensor]  # a layer's convolution window [channels, width - 1], its [heads, k, v]


class RecurrentState:
    def __init__(self, config: ModelConfig, num_slots: int, device):
        self.layers = len(config.linear_layers)
        window = torch.zeros(config.linear_conv_dim, config.linear_conv_kernel - 1, device=device)
        state = torch.zeros(config.linear_value_heads, config.linear_key_dim, config.linear_value_dim, device=device)
        self._zero: list[State | None] = [(window, state)] * self.layers
        # per slot: length -> each linear layer's state at that length (None: not yet made by the pass in flight)
        self.saved: list[dict[int, list[State | None]]] = [{0: list(self._zero)} for _ in range(num_slots)]
        # per (slot, layer): at most two tensors a pass writes its states into, in turn (`buffer`)
        self.buffers: dict[tuple[int, int], list[torch.Tensor]] = {}

    @staticmethod
    def slot_bytes(config: ModelConfig) -> int:
        """Bytes of one slot's state at one length (float32)."""
        per_layer = config.linear_conv_dim * (config.linear_conv_kernel - 1)
        per_layer += config.linear_value_heads * config.linear_key_dim * config.linear_value_dim
        return 4 * per_layer * len(config.linear_layers)

    def begin(self, slot: int, length: int) -> None:
        """A pass appends to the slot at `length`: only the state there is kept."""
        self.saved[slot] = {length: self._complete(slot, length)}

    def get(self, slot: int, layer: int, length: int) -> State:
        """Layer `layer`'s state at `length` (the later layers' may not be made yet: a pass of one pass shape steps a
        slot's groups layer by layer, a later group starting where an earlier one of the same pass ended)."""
        entry = self.saved[slot].get(length)
        state = None if entry is None else entry[layer]
        if state is None:  # not kept at `length`: _complete raises, naming the lengths that are
            return self._complete(slot, length)[layer]
        return state

    def put(self, slot: int, layer: int, length: int, windows: list[torch.Tensor], states: list[torch.Tensor]) -> None:
        """Layer `layer`'s states after the tokens at lengths length + 1, length + 2, ..."""
        for i, (window, state) in enumerate(zip(windows, states, strict=True)):
            entry = self.saved[slot].setdefault(length + 1 + i, [None] * self.layers)
            entry[layer] = (window, state)

    def buffer(self, slot: int, layer: int, rows: int, current: torch.Tensor) -> torch.Tensor:
        """A tensor [rows, heads, key size, value size] for a pass to write the states of its rows into: one of the
        slot's layer's two, the one not holding `current` (the state the pass starts from), made anew only where it
        is too small. Reusing memory already touched spares the pages a fresh tensor costs (a 0.8B model: 19 MiB per
        row, a third of a verify pass's time in page faults)."""
        held = self.buffers.setdefault((slot, layer), [])
        base = current.untyped_storage().data_ptr()
        for i, tensor in enumerate(held):
            if tensor.untyped_storage().data_ptr() != base:
                if tensor.shape[0] < rows:
                    held[i] = tensor = torch.empty((rows, *current.shape), device=current.device)
                return tensor[:rows]
        tensor = torch.empty((rows, *current.shape), device=current.device)
        held.append(tensor)
        return tensor

    def set_length(self, slot: int, length: int) -> None:
        """The slot rolls back (or on) to `length`: a length its last pass recorded."""
        self._complete(slot, length)

    def release(self, slot: int) -> None:
        self.saved[slot] = {0: list(self._zero)}
        for layer in range(self.layers):
            self.buffers.pop((slot, layer), None)

    def _complete(self, slot: int, length: int) -> list[State | None]:
        entry = self.saved[slot].get(length)
        if entry is None or any(state is None for state in entry):
            held = sorted(n for n, e in self.saved[slot].items() if all(s is not None for s in e))
            raise ValueError(
                f"slot {slot}: the linear-attention state was not kept at length {length} (kept at {held}): a "
                "recurrent state rolls back only to a length its last pass recorded"
            )
        return entry
