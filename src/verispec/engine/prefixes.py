"""Prefill reuse: a new request takes, from the target cache's registered blocks (models/kv_cache.py), the keys and
values earlier prompts of its partition prefilled, where they are exactly what its own prefill would write.

A position's keys and values depend on its token and every token before it, so only a prefix equal from position 0
can be reused. How the prompt was cut into prefill passes may matter too:

- A model whose passes are row-invariant (the native stack: each row's result the same bits whatever else the pass
  holds) writes the same bits however a prompt is cut, so any equal prefix is reused, to the token: a system prompt
  shorter than a block, a conversation's history, n choices of one prompt.
- Otherwise prompts are prefilled in chunks of a fixed size cut from position 0, whatever else runs, and what is
  reused ends where both prompts end a chunk, every chunk before equal in its tokens and in where it ends.

Keys. Every full block a prefill writes is registered under a key: BLAKE2b (256 bits) of the key of the block before
it (for the first block, of the partition) and of its tokens; for a model that is not row-invariant, also of the
tokens after the block up to where its last position's chunk ends, and of that end. Equal keys thus mean equal bits.
A block partly filled by a prefill is registered too, with the tokens it holds, as a source to copy from.

Reuse. A new request computes its prompt's keys and shares the longest run of registered blocks copy-free (counted by
reference; for a model that is not row-invariant the run is cut back to a chunk end); then, in the block after the
run, it copies the longest equal start another registered block of the same parent key holds (to the token, or to a
chunk end both share). While its prompt prefills, each step it takes what other prefills registered meanwhile (n
choices of one prompt, admitted together, prefill it once). Registered blocks outlive their requests: unreferenced,
they stay until a block is needed and none is free (kv_cache.py says which goes first).

Answers. On a row-invariant model a block that decoding filled holds the bits a prefill of the same tokens would
write, so it is registered too, under the key its tokens and every token before them give (`decoded`): the next
turn of a chat, or an agent's next step, whose prompt holds the answer just written, prefills only what is new.
(Elsewhere decoding's bits are not a prefill's, and only prefilled positions are registered.)

A request reuses only what requests of its own partition prefilled (a tenant, engine/requests.py): the partition is
hashed into the first key, so no block of another partition is ever found. A prefill that goes faster because
another tenant sent the same prompt would tell that it did. A private partition's blocks are shared while its request
runs (its n choices) and given back when it ends: no later request could find them.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from hashlib import blake2b

from ..models.kv_cache import BlockRecord, KVCache
from .requests import is_private


def reusable_prefill(
    record: list[int],
    target: list[int],
    start: int,
    chunk: int | None,
    *,
    offset: int = 0,
    record_end: int | None = None,
) -> int:
    """How far prefilled tokens can stand in for prefilling `target` from `start`. `record` holds the tokens a
    prefill wrote at positions [offset, offset + len(record)) of a prompt whose prefill ended at `record_end` (by
    default where the record ends), every position before `offset` equal to target's (their keys say so). Nowhere
    unless record and target agree on [offset, start); then, with `chunk` None (a row-invariant model), to where they
    first differ; else (prefilled in chunks of `chunk` from position 0, `start` a chunk boundary) to the end of the
    chunks equal in their tokens and in where they end."""
    held = offset + len(record)
    record_end = held if record_end is None else record_end
    if record[: start - offset] != target[offset:start]:
        return start
    end = start
    if chunk is None:
        limit = min(held, len(target))
        while end < limit and record[end - offset] == target[end]:
            end += 1
        return end
    while end < len(target):
        stop = min(end + chunk, len(target))
        if min(end + chunk, record_end) != stop or stop > held:
            break
        if record[end - offset : stop - offset] != target[end:stop]:
            break
        end = stop
    return end


@dataclass(frozen=True)
class Prompt:
    """A prompt as the cache sees it: its tokens, what its prefill writes (all but the last token, which is
    decoded), the key before its first block (`root`: its partition's) and the key of each full block it prefills."""

    tokens: list[int]
    prefill: list[int]
    root: bytes
    keys: list[bytes]
    owner: str = ""  # its partition

    @property
    def end(self) -> int:
        return len(self.prefill)

    def parent(self, index: int) -> bytes:
        """The key of every position before block `index`."""
        return self.keys[index - 1] if index else self.root


def _digest(*parts: bytes) -> bytes:
    h = blake2b(digest_size=32)
    for part in parts:
        h.update(part)
    return h.digest()


def _token_bytes(tokens: list[int]) -> bytes:
    return array("q", tokens).tobytes()


class PrefixBlocks:
    """The target cache's prefix reuse. `chunk`: the prefill chunk of a model whose passes are not row-invariant,
    None for one whose are."""

    def __init__(self, cache: KVCache, chunk: int | None, answers: bool = True, reuse: bool = True):
        """`reuse` False: nothing is registered, so nothing is reused (a hybrid model's cache)."""
        self.cache, self.chunk, self.answers, self.reuse_any = cache, chunk, answers, reuse
        self.prompts: dict[int, Prompt] = {}  # per slot: the prompt its request prefills
        self.decoded_keys: dict[int, list[bytes]] = {}  # per slot: the keys of the full blocks decoding filled

    def prompt(self, tokens: list[int], partition: str = "") -> Prompt:
        name = partition.encode()
        rule = b"invariant" if self.chunk is None else b"chunk %d" % self.chunk
        root = _digest(b"verispec prefix", len(name).to_bytes(8, "little"), name, rule)
        end, size = len(tokens) - 1, self.cache.block_size
        keys, parent = [], root
        for index in range(max(end, 0) // size):
            low, high = index * size, (index + 1) * size
            parts = [parent, _token_bytes(tokens[low:high])]
            if self.chunk is not None:  # the pass that wrote the block's last position, up to its end
                stop = min((high - 1) // self.chunk * self.chunk + self.chunk, end)
                parts += [stop.to_bytes(8, "little"), _token_bytes(tokens[high:stop])]
            parent = _digest(*parts)
            keys.append(parent)
        return Prompt(tokens=tokens, prefill=tokens[:end], root=root, keys=keys, owner=partition)

    def shared_run(self, prompt: Prompt, start: int = 0) -> list[int]:
        """The registered full blocks a prompt would share from position `start` (a multiple of the block size) on,
        without taking them: a run that ends where the prompt's own prefill ends a chunk."""
        size, run = self.cache.block_size, []
        for key in prompt.keys[start // size :]:
            block = self.cache.pool.full.get(key)
            if block is None:
                break
            run.append(block)
        while run and not self._chunk_end(prompt, start + len(run) * size):
            run.pop()
        return run

    def _chunk_end(self, prompt: Prompt, position: int) -> bool:
        """Whether the prompt's prefill ends a pass at `position` (always, for a row-invariant model)."""
        return self.chunk is None or position % self.chunk == 0 or position == prompt.end

    def admit(self, slot: int, prompt: Prompt, shared: list[int], reserve: int) -> int:
        """A new request in `slot` (holding nothing): it shares `shared` (shared_run, checked to fit), reserves
        `reserve` blocks more, and takes what else is registered; returns how many prompt positions are in place
        (the slot's cache length)."""
        self.cache.release(slot)
        for block in shared:
            if not self.cache.share(slot, block):
                raise RuntimeError("a shared prefix block did not fit where the scheduler found room")
        if not self.cache.reserve(slot, reserve):
            raise RuntimeError("a request's blocks did not fit where the scheduler found room")
        self.prompts[slot] = prompt
        self._register(slot, 0, self.cache.lengths[slot])
        return self.reuse(slot, self.cache.lengths[slot])

    def reuse(self, slot: int, start: int) -> int:
        """Take into `slot` (its cache holding the prompt's first `start` positions) what is registered of the rest:
        full blocks shared, the start of a block copied; returns where its prefill now stands."""
        prompt, cache, size = self.prompts[slot], self.cache, self.cache.block_size
        position = start
        while position < prompt.end:
            if position % size == 0 and (run := self.shared_run(prompt, position)):
                taken = 0
                for block in run:
                    if not cache.share(slot, block):
                        break
                    taken += 1
                while taken and not self._chunk_end(prompt, position + taken * size):  # the pool gave out early
                    taken -= 1
                cache.shrink(slot, position + taken * size)
                if taken:
                    position += taken * size
                    continue
            end, source = self._copyable(slot, prompt, position)
            if end <= position:
                break
            cache.copy_from(slot, source, end)
            position = end
        self._register(slot, start, position)
        return position

    def _copyable(self, slot: int, prompt: Prompt, position: int) -> tuple[int, int | None]:
        """How far, within the block holding `position`, a registered block holding the same start can stand in for
        prefilling the prompt from `position` (where the prompt's prefill ends a pass); and that block."""
        size, pool = self.cache.block_size, self.cache.pool
        index = position // size
        own = self.cache.blocks[slot][index] if index < len(self.cache.blocks[slot]) else None
        best, source = position, None
        for block in pool.candidates(prompt.parent(index), prompt.tokens[index * size]):
            if block == own:
                continue
            record = pool.records[block]
            end = reusable_prefill(
                record.tokens, prompt.prefill, position, self.chunk, offset=index * size, record_end=record.prefill_end
            )
            if end > best:
                best, source = end, block
        return best, source

    def computed(self, slot: int, start: int, end: int) -> None:
        """`slot` prefilled its prompt's positions [start, end)."""
        self._register(slot, start, end)

    def _register(self, slot: int, start: int, end: int) -> None:
        """Register the slot's blocks holding prompt positions in [start, end) (with what each holds from its start)."""
        prompt, cache, size, pool = self.prompts[slot], self.cache, self.cache.block_size, self.cache.pool
        if not self.reuse_any:
            return
        for index in range(start // size, cache.blocks_for(min(end, prompt.end))):
            block, low = cache.blocks[slot][index], index * size
            held = min(end, prompt.end, low + size) - low
            record = pool.records.get(block)
            if record is not None and len(record.tokens) >= held:
                continue  # shared, or registered as far already
            key = prompt.keys[index] if held == size else None
            made = BlockRecord(prompt.parent(index), prompt.tokens[low : low + held], prompt.end, key)
            self._record(block, made, prompt.owner)

    def _record(self, block: int, record: BlockRecord, owner: str) -> None:
        record.owner, record.keep = owner, not is_private(owner)
        if not self.cache.pool.register(block, record):
            self.cache.pool.unregister(block)  # another block holds this one's keys and values: it is registered alone

    def decoded(self, slot: int, tokens: list[int]) -> None:
        """Register the slot's full blocks that decoding filled (its cache holding `tokens`' first positions), on a
        row-invariant model: their bits are what a prefill of those tokens writes."""
        prompt, cache, size = self.prompts.get(slot), self.cache, self.cache.block_size
        if prompt is None or self.chunk is not None or not self.answers or not self.reuse_any:
            return
        keys = self.decoded_keys.setdefault(slot, [])
        first = len(prompt.keys) + len(keys)  # the first full block not yet registered
        for index in range(first, min(cache.lengths[slot], len(tokens)) // size):
            parent = (prompt.keys + keys)[index - 1] if index else prompt.root
            block_tokens = tokens[index * size : (index + 1) * size]
            keys.append(_digest(parent, _token_bytes(block_tokens)))
            made = BlockRecord(parent, block_tokens, (index + 1) * size, keys[-1])
            self._record(cache.blocks[slot][index], made, prompt.owner)

    def finish(self, slot: int) -> None:
        """The slot's request left (what it registered stays)."""
        self.prompts.pop(slot, None)
        self.decoded_keys.pop(slot, None)

    def forget(self) -> None:
        """Hold nothing reusable (the next prompt is prefilled as a fresh engine would)."""
        for block in list(self.cache.pool.records):
            self.cache.pool.unregister(block)
