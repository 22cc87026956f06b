"""The KV cache: paged, its blocks counted by reference, shared between sequences and kept for later requests.

Layout. Per layer one pool of keys and one of values, [blocks, kv heads, block size, head size]; each cache slot (one
sequence) lists its blocks in position order, in its row of `table`. Position t of a slot is row t % block size of
block table[slot][t // block size]. The native stack reads and writes through the table (kernels/csrc/vsk.h,
vsk_pages); the PyTorch path gathers through it. Either way a query takes its keys in position order, so where the
blocks lie changes no bit of any result.

Block size: BLOCK_SIZE positions. The native attention reads keys and values in tiles of 32 positions starting at
multiples of 32, so a block of a multiple of 32 never splits a tile (a tile is one contiguous run of each head); 64
rather than 32 halves the per-block bookkeeping (table entries, hashes, reference counts: a few microseconds of
Python each) while the cost of larger blocks stays small: a sequence's last block is on average half used, and what
is reused from a block that is not shared whole is copied (engine/prefixes.py), at most 63 positions.

Memory. The pools are made with torch.empty (on a CPU their pages are untouched until written) and a block is zeroed
when first handed out, so memory grows with the blocks in use, up to the pool's size: the budget. Blocks given back
are handed out again before untouched ones.

Sharing. A block's reference count is the number of slots listing it. A block may be registered as holding a
prompt's keys and values for later requests (engine/prefixes.py decides which, under which key): a full block under
its key, shared copy-free; any registered block as a source its first positions can be copied from. An unreferenced
registered block stays in the pool, and is evicted only when a block is needed and none is free: first the least
recently used of those no later request has taken (a prompt nobody sent again), then, of those that served a later
request, the least recently used of the owner (a tenant, engine/requests.py) that keeps the most of them idle. So one
tenant's flood of new prompts evicts its own and other new prompts, not another tenant's prompt that is reused.
A block of an owner that keeps nothing (a private partition) is given back free as soon as no slot lists it. A slot
about to write into a block another slot also lists copies it first (copy on write); writing over a registered block's
content unregisters it.

Reservations. A slot may reserve blocks (the scheduler reserves what a request needs when it admits it): reserved
blocks are handed out to that slot alone. Beyond its reservation a slot takes what no reservation holds; where nothing
is left `ensure` raises CacheFullError (the scheduler then preempts a sequence: engine/scheduler.py).

Layers that attend to an earlier layer's keys and values (Gemma 4's shared layers) keep none: their pools are empty
and they read their source layer's.

Hybrid models (Qwen3.5). Only the attention layers have keys and values (the pools of the linear-attention layers are
empty); those layers' recurrent state lives in `recurrent` (recurrent_state.py), which `set_length` and `release` roll
back and clear with the blocks. Sharing blocks (prefix reuse, forks, token trees) would hand a slot keys without the
state that goes with them: those operations are refused for a hybrid cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..errors import VerispecError
from .config import ModelConfig
from .recurrent_state import RecurrentState

BLOCK_SIZE = 64


class CacheFullError(VerispecError):
    """A cache slot needs a block and none is free beyond what other slots have reserved."""


@dataclass
class BlockRecord:
    """What a registered block holds for later requests: the prompt tokens at its first len(tokens) positions;
    `parent`, the key of every position before the block (engine/prefixes.py); its own key when it is full and shared
    whole (else None); and `prefill_end`, where the prefill that wrote it ended (the rule for models whose passes
    are not row-invariant)."""

    parent: bytes
    tokens: list[int]
    prefill_end: int
    key: bytes | None = None
    owner: str = ""  # whose it is (a partition): eviction is fair between owners
    keep: bool = True  # kept for later requests once unreferenced (False: a private partition's)


class BlockPool:
    """The bookkeeping of a cache's blocks: reference counts, the free ones, the registered ones and their index.

    A block is in use (referenced by slots), free (handed out before and holding nothing registered), idle
    (registered, unreferenced: evicted by `_evict`'s order), or untouched (never handed out)."""

    def __init__(self, num_blocks: int, zero):
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self.touched = 0  # blocks [0, touched) have been handed out at least once
        self.free: list[int] = []
        self.idle: OrderedDict[int, None] = OrderedDict()  # every idle block, least recently used first
        self.reused: set[int] = set()  # registered blocks a slot took after the one that wrote them
        self._untaken: OrderedDict[int, None] = OrderedDict()  # idle blocks not in `reused`, least recent first
        self._taken: dict[str, OrderedDict[int, None]] = {}  # owner -> its idle blocks in `reused`, least recent first
        self.reserved = 0  # blocks reserved by slots and not yet handed out
        self.records: dict[int, BlockRecord] = {}
        self.full: dict[bytes, int] = {}  # key -> the full block registered under it
        self.sources: dict[bytes, dict[int, set[int]]] = {}  # parent key -> first token -> registered blocks
        self._zero = zero  # zero(block): what a block holds when first handed out

    def available(self) -> int:
        """Blocks that can be handed out beyond the reservations (idle ones evicted)."""
        return len(self.free) + self.num_blocks - self.touched + len(self.idle) - self.reserved

    def in_use(self) -> int:
        return self.touched - len(self.free) - len(self.idle)

    def allocate(self) -> int:
        """A block with one reference: a free one, else an untouched one, else the least recently used idle one."""
        if self.free:
            block = self.free.pop()
        elif self.touched < self.num_blocks:
            block = self.touched
            self.touched += 1
            self._zero(block)
        elif self.idle:
            block = self._evict()
            self._forget(block)
        else:
            raise CacheFullError("every block of the KV cache is in use")
        self.refs[block] = 1
        return block

    def take(self, block: int) -> None:
        """One more reference to a block (in use, or idle: then no longer idle); a registered block taken so is
        reused (a later request, or another choice of the same, reads what its first writer left)."""
        if self.refs[block] == 0:
            self._leave_idle(block)
        if block in self.records:
            self.reused.add(block)
        self.refs[block] += 1

    def drop(self, block: int) -> None:
        """One reference fewer; unreferenced, a registered block kept for later turns idle (the most recently used),
        another free."""
        self.refs[block] -= 1
        if self.refs[block] == 0:
            record = self.records.get(block)
            if record is not None and not record.keep:
                self._forget(block)
                record = None
            if record is None:
                self.free.append(block)
                return
            self.idle[block] = None
            if block in self.reused:
                self._taken.setdefault(record.owner, OrderedDict())[block] = None
            else:
                self._untaken[block] = None

    def _leave_idle(self, block: int) -> None:
        del self.idle[block]
        if block in self._untaken:
            del self._untaken[block]
            return
        owner = self.records[block].owner
        del self._taken[owner][block]
        if not self._taken[owner]:
            del self._taken[owner]

    def _evict(self) -> int:
        """The idle block to evict (it leaves the idle ones): the least recently used never reused, else the least
        recently used reused one of the owner keeping the most of them idle."""
        if self._untaken:
            block = next(iter(self._untaken))
        else:
            owner = max(self._taken, key=lambda name: len(self._taken[name]))
            block = next(iter(self._taken[owner]))
        self._leave_idle(block)
        return block

    def register(self, block: int, record: BlockRecord) -> bool:
        """Record what `block` holds (replacing what it held); False, and nothing recorded, where another block is
        registered under the same full key."""
        if record.key is not None and self.full.get(record.key, block) != block:
            return False
        self._forget(block)
        self.records[block] = record
        if record.key is not None:
            self.full[record.key] = block
        if record.tokens:
            self.sources.setdefault(record.parent, {}).setdefault(record.tokens[0], set()).add(block)
        return True

    def unregister(self, block: int) -> None:
        """Forget what `block` holds; an idle block becomes free."""
        if block not in self.records:
            return
        if self.refs[block] == 0:
            self._leave_idle(block)
            self.free.append(block)
        self._forget(block)

    def _forget(self, block: int) -> None:
        record = self.records.pop(block, None)
        self.reused.discard(block)
        if record is None:
            return
        if record.key is not None and self.full.get(record.key) == block:
            del self.full[record.key]
        if record.tokens:
            by_token = self.sources[record.parent]
            blocks = by_token[record.tokens[0]]
            blocks.discard(block)
            if not blocks:
                del by_token[record.tokens[0]]
                if not by_token:
                    del self.sources[record.parent]

    def candidates(self, parent: bytes, first_token: int) -> set[int]:
        """The registered blocks that follow `parent` and begin with `first_token`."""
        return self.sources.get(parent, {}).get(first_token, set())


class KVCache:
    """Paged keys and values of one model for `num_slots` sequences of at most `max_len` positions each, in a pool of
    `num_blocks` blocks (default: enough for every slot to reach max_len).

    `lengths[slot]` is how many positions the slot holds; forward passes append after it, and `set_length` rolls
    back. Positions past a slot's length are never read (the attention's mask, and the native stack, stop at each
    query's own position) and are rewritten before they are read again."""

    def __init__(
        self,
        config: ModelConfig,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype,
        device,
        num_blocks: int | None = None,
        block_size: int = BLOCK_SIZE,
        scratch: bool = False,
    ):
        """`scratch`: one block more in every pool, never handed out, that padded rows write into (pass_shape.py);
        `scratch_block` is its index (None without one)."""
        if num_slots < 1 or max_len < 1 or block_size < 1:
            raise ValueError("a cache needs a slot, a position and a block size of at least 1")
        self.block_size, self.max_len = block_size, max_len
        self.max_blocks = -(-max_len // block_size)  # a slot's most blocks
        num_blocks = num_slots * self.max_blocks if num_blocks is None else num_blocks
        if num_blocks < 1:
            raise ValueError(f"a cache needs at least one block, got {num_blocks}")
        self.scratch_block = num_blocks if scratch else None
        pooled = num_blocks + (1 if scratch else 0)
        shapes = [(pooled, config.cached_kv_heads(i), block_size, config.head_size_of(i))
                  for i in range(config.num_layers)]  # fmt: skip
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for shape in shapes]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for shape in shapes]
        self.recurrent = RecurrentState(config, num_slots, device) if config.hybrid else None
        self.lengths = [0] * num_slots
        self.blocks: list[list[int]] = [[] for _ in range(num_slots)]  # each slot's blocks in position order
        # the same on the CPU for the native stack, which reads it in place (-1: no block)
        self.table = torch.full((num_slots, self.max_blocks), -1, dtype=torch.int32)
        self._table = self.table.numpy()
        self.reserved = [0] * num_slots  # blocks each slot has reserved and not yet taken
        self.pool = BlockPool(num_blocks, self._zero)
        if self.scratch_block is not None:
            self._zero(self.scratch_block)

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def device(self) -> torch.device:
        return self.keys[0].device

    @staticmethod
    def block_bytes(config: ModelConfig, dtype: torch.dtype, block_size: int = BLOCK_SIZE) -> int:
        """Bytes one block takes over all layers, keys and values."""
        values = sum(config.cached_kv_heads(i) * config.head_size_of(i) for i in range(config.num_layers))
        return 2 * values * block_size * torch.empty(0, dtype=dtype).element_size()

    def nbytes(self) -> int:
        """Bytes of the whole pool (what it may grow to), the scratch block included."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def used_bytes(self) -> int:
        """Bytes of the blocks handed out at least once (what the pool has touched)."""
        per_block = sum(t[0].numel() * t.element_size() for t in self.keys + self.values)
        return per_block * self.pool.touched

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def _zero(self, block: int) -> None:
        # a block's rows past what a sequence wrote are read by ordinary attention under its mask: they must hold
        # numbers (0 x NaN is NaN), whatever the memory held before
        for layer in self.keys + self.values:
            layer[block].zero_()

    # ---- slots ----------------------------------------------------------------------------------------------
    def set_length(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"slot {slot}: cannot set length {length} (holds {self.lengths[slot]})")
        if self.recurrent is not None:
            self.recurrent.set_length(slot, length)
        self.lengths[slot] = length

    def shrink(self, slot: int, length: int) -> None:
        """Roll the slot back to `length` positions and give back the blocks wholly past them."""
        self.set_length(slot, length)
        blocks = self.blocks[slot]
        while len(blocks) > self.blocks_for(length):
            self.pool.drop(blocks.pop())
            self._table[slot, len(blocks)] = -1

    def release(self, slot: int) -> None:
        """The slot holds nothing: its blocks given back (its last first, so that of a prefix left idle the end is
        evicted before the start), its reservation too."""
        for block in reversed(self.blocks[slot]):
            self.pool.drop(block)
        self.blocks[slot].clear()
        self._table[slot] = -1
        self.lengths[slot] = 0
        if self.recurrent is not None:
            self.recurrent.release(slot)
        self.pool.reserved -= self.reserved[slot]
        self.reserved[slot] = 0

    def reserve(self, slot: int, count: int) -> bool:
        """Reserve `count` more blocks for `slot`; False, and nothing reserved, where fewer are available."""
        if count > self.pool.available():
            return False
        self.reserved[slot] += count
        self.pool.reserved += count
        return True

    def _allocate(self, slot: int) -> int:
        if self.reserved[slot]:
            self.reserved[slot] -= 1
            self.pool.reserved -= 1
        elif self.pool.available() < 1:
            raise CacheFullError(
                f"the KV cache's {self.num_blocks} blocks of {self.block_size} positions are in use or reserved"
            )
        return self.pool.allocate()

    def _put(self, slot: int, index: int, block: int) -> None:
        """`block` (already referenced for the slot) at the slot's `index`, where it held one before or next."""
        blocks = self.blocks[slot]
        if index < len(blocks):
            self.pool.drop(blocks[index])
            blocks[index] = block
        elif index == len(blocks):
            blocks.append(block)
        else:
            raise ValueError(f"slot {slot} holds {len(blocks)} blocks: none can go at {index}")
        self._table[slot, index] = block

    def ensure(self, slot: int, end: int, start: int | None = None) -> None:
        """Blocks for the slot's positions up to `end`, those it writes next ([start, end); start: its length by
        default) its own: a block another slot lists too is copied first, and a registered block whose content would
        be overwritten is unregistered. Raises CacheFullError where a block is needed and none is left for the slot."""
        if end > self.max_len:
            raise ValueError(f"sequence of {end} positions exceeds the cache's {self.max_len}")
        blocks, size = self.blocks[slot], self.block_size
        start = self.lengths[slot] if start is None else start
        for index in range(start // size, min(self.blocks_for(end), len(blocks))):
            block = blocks[index]
            if self.pool.refs[block] > 1:
                copy = self._allocate(slot)
                for layer in self.keys + self.values:
                    layer[copy].copy_(layer[block])
                self._put(slot, index, copy)
                continue
            record = self.pool.records.get(block)
            if record is not None and max(start, index * size) < index * size + len(record.tokens):
                self.pool.unregister(block)
        while len(blocks) < self.blocks_for(end):
            self._put(slot, len(blocks), self._allocate(slot))

    def share(self, slot: int, block: int) -> bool:
        """Append a full registered `block` to the slot (its length a whole number of blocks, then one block more),
        copy-free; it takes the place of the slot's own block there, if any. False where the block is idle and taking
        it would leave less than the reservations need."""
        self._unshared("share")
        size, length = self.block_size, self.lengths[slot]
        if length % size:
            raise ValueError(f"slot {slot} holds {length} positions: a shared block starts at a multiple of {size}")
        index = length // size
        holds = index < len(self.blocks[slot])
        if self.pool.refs[block] == 0 and not holds:  # an idle block leaves the pool's available ones
            if self.reserved[slot]:
                self.reserved[slot] -= 1
                self.pool.reserved -= 1
            elif self.pool.available() < 1:
                return False
        self.pool.take(block)
        self._put(slot, index, block)
        self.lengths[slot] = length + size
        return True

    def copy_from(self, slot: int, block: int, end: int) -> None:
        """Copy into the slot its positions [length, end), all in one block, from `block`'s same rows; its length
        becomes `end`."""
        self._unshared("copy_from")
        start, size = self.lengths[slot], self.block_size
        if not start < end <= (start // size + 1) * size:
            raise ValueError(f"slot {slot} holds {start} positions: cannot copy up to {end} from one block")
        self.pool.take(block)  # an idle source is not evicted to make room for its copy
        try:
            self.ensure(slot, end)
        finally:
            self.pool.drop(block)
        own, rows = self.blocks[slot][start // size], slice(start % size, (end - 1) % size + 1)
        for layer in self.keys + self.values:
            layer[own, :, rows].copy_(layer[block, :, rows])
        self.lengths[slot] = end

    def fork(self, source: int, slot: int, end: int) -> None:
        """Give `slot` what `source` holds at positions [slot's length, end): the source's blocks that end by `end`
        shared, the rest of its last block copied; the slot's length becomes `end`. The positions before the slot's
        length in a block it takes from the source are the source's: a fork is for caches whose bits need not match
        (the draft model's)."""
        self._unshared("fork")
        start, size = self.lengths[slot], self.block_size
        if not start <= end <= self.lengths[source]:
            raise ValueError(f"slot {slot} holds {start} positions, {source} {self.lengths[source]}: no fork to {end}")
        if source == slot:
            self.lengths[slot] = end
            return
        for index in range(start // size, end // size):
            block = self.blocks[source][index]
            self.pool.take(block)
            self._put(slot, index, block)
        self.lengths[slot] = max(start, end // size * size)
        if end > self.lengths[slot]:
            self.copy_from(slot, self.blocks[source][end // size], end)

    def keep_path(self, slot: int, start: int, rows: list[int]) -> None:
        """After a token tree's pass from `start` (its root there, node i stored at start + i): keep the nodes
        `rows` (a root-to-node path, rows[0] == 0) at start .. start + len(rows) - 1, where a chain would have
        them, and drop the rest."""
        self._unshared("keep_path")
        if not rows or rows[0] != 0 or any(b <= a for a, b in zip(rows, rows[1:], strict=False)):
            raise ValueError(f"{rows} is not a path from a tree's root")
        if start + rows[-1] >= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds no tree node {rows[-1]} from position {start}")
        if rows[-1] != len(rows) - 1:  # else the path already lies where a chain's would
            source = self.where(slot, [start + row for row in rows])
            target = self.where(slot, range(start, start + len(rows)))
            for layer in self.keys + self.values:
                layer[target] = layer[source]
        self.lengths[slot] = start + len(rows)

    def _unshared(self, operation: str) -> None:
        if self.recurrent is not None:
            raise ValueError(f"{operation}: a hybrid model's cache shares no blocks (its recurrent state cannot go)")

    # ---- addresses ------------------------------------------------------------------------------------------
    def where(self, slot: int, positions) -> tuple[torch.Tensor, slice, torch.Tensor]:
        """An index of a pool for the slot's `positions`: pool[index] is [len(positions), kv heads, head size]."""
        size, blocks = self.block_size, self.blocks[slot]
        block = torch.tensor([blocks[p // size] for p in positions], device=self.device)
        row = torch.tensor([p % size for p in positions], device=self.device)
        return block, slice(None), row

    def gather(self, layer: int, slot: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The slot's keys and values at positions [0, end) of a layer, contiguous: [kv heads, end, head size]."""
        index = torch.tensor(self.blocks[slot][: self.blocks_for(end)], device=self.device)
        return lay_out(self.keys[layer][index], end), lay_out(self.values[layer][index], end)

    def pass_pages(self, slots: list[int], starts: list[int], seq: int) -> PassPages:
        """Where a pass of `seq` new positions per slot (from starts[i] for slots[i]) writes and reads."""
        written = [(slot, start + t) for slot, start in zip(slots, starts, strict=True) for t in range(seq)]
        size = self.block_size
        block = torch.tensor([self.blocks[s][p // size] for s, p in written], device=self.device)
        row = torch.tensor([p % size for _, p in written], device=self.device)
        count = self.blocks_for(max(starts) + seq)
        # the blocks a slot lacks for the pass's span are read under a mask only: any of its own stands in
        read = [self.blocks[s][:count] + [self.blocks[s][0]] * (count - len(self.blocks[s])) for s in slots]
        return PassPages((block, slice(None), row), torch.tensor(read, device=self.device))


@dataclass
class PassPages:
    """Where one pass of ordinary attention writes and reads: `written` indexes a pool at the pass's rows in order
    (pool[written] is [rows, kv heads, head size]); `read` [batch, blocks] lists each batch row's blocks over the
    pass's span (lay_out turns pool[read] into positions)."""

    written: tuple
    read: torch.Tensor
    # the keys and values read per layer, kept where the pass writes none (a drafter reading its target's cache:
    # several of its layers read one layer's), else None
    kept: dict | None = None

    def keys_values(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor, span: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s pools `keys`, `values` laid out over the pass's span: [batch, kv heads, span, head size]."""
        if self.kept is not None and layer in self.kept:
            return self.kept[layer]
        read = lay_out(keys[self.read], span), lay_out(values[self.read], span)
        if self.kept is not None:
            self.kept[layer] = read
        return read


def lay_out(blocks: torch.Tensor, end: int) -> torch.Tensor:
    """Gathered blocks [..., n, kv heads, block size, head size] as positions: [..., kv heads, end, head size]."""
    *lead, n, heads, size, dim = blocks.shape
    return blocks.transpose(-4, -3).reshape(*lead, heads, n * size, dim)[..., :end, :]
