"""Prefill reuse: which prompt tokens each target cache slot holds from prefilling, and how much of a new
prompt another slot (or the slot itself, from its previous request) can give it by copying keys and values.

A position's keys and values depend on its token and every token before it, so only a prefix equal from
position 0 can be reused. How the prompt was cut into prefill passes may matter too:

- A model whose passes are row-invariant (the native stack: each row's result the same bits whatever else
  the pass holds) writes the same bits however a prompt is cut, so any equal prefix is reused, to the token:
  a system prompt shorter than a chunk, a conversation's history, n choices of one prompt.
- Otherwise prompts are prefilled in chunks of a fixed size cut from position 0, whatever else runs, and a
  slot's chunks are reused only where they are equal and end where prefilling the new prompt would end them.

Only prefilled positions are recorded (decoding writes after them), and a slot's record is cut where a new
request's prefill starts overwriting it. A request reuses only what requests of its own partition prefilled (a
tenant, engine/requests.py): a prefill that goes faster because another tenant sent the same prompt would tell
that it did.
"""

from __future__ import annotations

from ..models.model import KVCache


def reusable_prefill(record: list[int], target: list[int], start: int, chunk: int | None) -> int:
    """How far a slot whose first len(record) positions were prefilled with `record` can stand in for prefilling
    `target` from `start`: nowhere unless record and target agree before `start`; then, with `chunk` None (a
    row-invariant model), to where they first differ; else (prefilled in chunks of `chunk` from position 0,
    `start` a chunk boundary) to the end of the chunks equal in their tokens and in where they end."""
    if record[:start] != target[:start]:
        return start
    end = start
    if chunk is None:
        limit = min(len(record), len(target))
        while end < limit and record[end] == target[end]:
            end += 1
        return end
    while end < len(target):
        stop = min(end + chunk, len(target))
        if min(end + chunk, len(record)) != stop or record[end:stop] != target[end:stop]:
            break
        end = stop
    return end


class PrefilledPrompts:
    """`chunk`: the prefill chunk of a model whose passes are not row-invariant, None for one whose are."""

    def __init__(self, cache: KVCache, chunk: int | None):
        self.cache, self.chunk = cache, chunk
        self.held: list[list[int]] = [[] for _ in range(cache.num_slots)]  # per slot: its prefilled tokens
        self.partitions = [""] * cache.num_slots  # whose prompt each slot holds

    def admit(self, slot: int, prompt: list[int], partition: str = "") -> int:
        """A new request in `slot`, of `partition`: keep what the slot still holds of its prompt (from a request of
        the same partition before), forget the rest; returns how many prompt tokens are in place (the slot's cache
        length)."""
        self.cache.set_length(slot, 0)
        if self.partitions[slot] != partition:
            self.partitions[slot] = partition
            self.held[slot].clear()
        end = self.copy(slot, slot, prompt, 0)
        del self.held[slot][end:]
        return end

    def reuse(self, slot: int, prompt: list[int], start: int) -> int:
        """Copy into `slot` what another slot holds of `prompt` from `start` on; returns where the slot's
        prefill now stands."""
        end = start
        for source in range(self.cache.num_slots):
            if source != slot and self.partitions[source] == self.partitions[slot]:
                end = self.copy(source, slot, prompt, end)
        return end

    def copy(self, source: int, slot: int, prompt: list[int], start: int) -> int:
        end = reusable_prefill(self.held[source], prompt[:-1], start, self.chunk)  # the last token is decoded
        if end > start:
            self.cache.copy(source, slot, end)
            self.held[slot][start:] = prompt[start:end]
        return end

    def forget(self) -> None:
        """Hold nothing reusable (the next prompt is prefilled as a fresh engine would)."""
        for held in self.held:
            held.clear()

    def computed(self, slot: int, start: int, chunk: list[int]) -> None:
        """`slot` prefilled `chunk` at positions start.."""
        self.held[slot][start:] = chunk
