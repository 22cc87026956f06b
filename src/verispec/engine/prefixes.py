"""Prefill reuse: which prompt tokens each target cache slot holds from prefilling, and how much of a new
prompt another slot (or the slot itself, from its previous request) can give it by copying keys and values.

A request's prompt is prefilled in chunks of a fixed size cut from position 0, whatever else runs. A chunk's
keys and values depend only on its tokens and those before it, so a slot that prefilled the same chunks
(equal tokens, ending at the same place) holds bit for bit what prefilling them again would compute: n
choices of one prompt, a repeated prompt and a shared system prompt are prefilled once. Only prefilled
positions are recorded (decoding writes after them), and a slot's record is cut where a new request's
prefill starts overwriting it.
"""

from __future__ import annotations

from ..models.model import KVCache


def reusable_prefill(record: list[int], target: list[int], start: int, chunk: int) -> int:
    """How far a slot whose first len(record) positions were prefilled with `record` (in chunks of `chunk` from
    position 0) can stand in for prefilling `target` from `start`, a chunk boundary: the end of the chunks
    equal in their tokens and in where they end."""
    end = start
    while end < len(target):
        stop = min(end + chunk, len(target))
        if min(end + chunk, len(record)) != stop or record[end:stop] != target[end:stop]:
            break
        end = stop
    return end


class PrefilledPrompts:
    def __init__(self, cache: KVCache, chunk: int):
        self.cache, self.chunk = cache, chunk
        self.held: list[list[int]] = [[] for _ in range(cache.num_slots)]  # per slot: its prefilled tokens

    def admit(self, slot: int, prompt: list[int]) -> int:
        """A new request in `slot`: keep what the slot still holds of its prompt (from a request before),
        forget the rest; returns how many prompt tokens are in place (the slot's cache length)."""
        self.cache.set_length(slot, 0)
        end = self.copy(slot, slot, prompt, 0)
        del self.held[slot][end:]
        return end

    def reuse(self, slot: int, prompt: list[int], start: int) -> int:
        """Copy into `slot` the whole chunks of `prompt` from `start` on that another slot holds; returns where
        the slot's prefill now stands."""
        end = start
        for source in range(self.cache.num_slots):
            if source != slot:
                end = self.copy(source, slot, prompt, end)
        return end

    def copy(self, source: int, slot: int, prompt: list[int], start: int) -> int:
        end = reusable_prefill(self.held[source], prompt[:-1], start, self.chunk)  # the last token is decoded
        if end > start:
            self.cache.copy(source, slot, end)
            self.held[slot][start:] = prompt[start:end]
        return end

    def computed(self, slot: int, start: int, chunk: list[int]) -> None:
        """`slot` prefilled `chunk` at positions start.."""
        self.held[slot][start:] = chunk
