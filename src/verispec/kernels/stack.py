"""A model's decoder stack run by the native library in one call per pass (csrc/vsk_stack.c).

Between the products a block has about twenty small steps (norms, bias, rotary embedding, cache writes,
attention, SwiGLU, residual adds); run as PyTorch ops they cost a decode step more than the draft model's
weights take to read. `NativeStack` hands a whole pass of a few rows to the library instead. Its rules are
those of the products: each row's result depends on that row alone, whatever else shares the call.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from dataclasses import dataclass

import torch

from . import native

_c_p, _c_int, _c_size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t


TREE_ROWS = 16  # the rows of one token tree a pass holds, its root's row included (VSK_ATTENTION_ROWS in vsk.h)


class _Part(ctypes.Structure):
    _fields_ = [("type", _c_int), ("W", _c_p), ("row_bytes", _c_size), ("N", _c_int)]


class _Expert(ctypes.Structure):
    _fields_ = [("gate_up", _Part * 2), ("down", _Part), ("gate_up_parts", _c_int)]


class _Block(ctypes.Structure):
    _fields_ = [
        ("attn_norm", _c_p), ("mlp_norm", _c_p), ("qkv_bias", _c_p),
        ("qkv", _Part * 3), ("o", _Part), ("gate_up", _Part * 2), ("down", _Part),
        ("qkv_parts", _c_int), ("gate_up_parts", _c_int),
        ("q_norm", _c_p), ("k_norm", _c_p), ("post_attn_norm", _c_p), ("post_mlp_norm", _c_p),
        ("rope", _c_int), ("window", _c_int), ("router", _Part), ("experts", ctypes.POINTER(_Expert)),
    ]  # fmt: skip


class _Model(ctypes.Structure):
    _fields_ = [
        ("hidden", _c_int), ("heads", _c_int), ("kv_heads", _c_int), ("head_dim", _c_int), ("inter", _c_int),
        ("layers", _c_int), ("eps", ctypes.c_float), ("blocks", ctypes.POINTER(_Block)),
        ("scale", ctypes.c_float), ("softcap", ctypes.c_float), ("embed_scale", ctypes.c_float), ("gelu", _c_int),
        ("experts", _c_int), ("experts_per_token", _c_int), ("expert_inter", _c_int), ("norm_topk", _c_int),
    ]  # fmt: skip


class _Pages(ctypes.Structure):
    _fields_ = [
        ("table", _c_p), ("table_stride", _c_int), ("block_size", _c_int), ("block_stride", _c_size),
        ("head_stride", _c_size),
    ]  # fmt: skip


class _Cache(ctypes.Structure):
    _fields_ = [
        ("keys", ctypes.POINTER(_c_p)), ("values", ctypes.POINTER(_c_p)), ("pages", _Pages), ("cos", _c_p),
        ("sin", _c_p), ("half", _c_int), ("rope_stride", _c_size),
    ]  # fmt: skip


Part = tuple[int, torch.Tensor, int, int]  # (kernel type, data, bytes per row or 0 for a tile form, rows)


@dataclass
class BlockWeights:
    """One block's weights as the library takes them (float32 vectors; products as parts), and what departs from a
    Llama block (vsk_stack.h: None, 0 for nothing)."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    qkv_bias: torch.Tensor | None
    qkv: list[Part]
    o: list[Part]
    gate_up: list[Part]
    down: list[Part]
    q_norm: torch.Tensor | None = None  # [head dim]: each head of q RMS-normalized before the rotary
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None  # [hidden]: the attention's output normalized
    post_mlp_norm: torch.Tensor | None = None
    rope: int = 0  # the rotary table (the first dimension of cos and sin) the block takes, or -1: none
    window: int = 0  # keys a query sees (itself and those before it), 0: all
    # a mixture of experts in place of gate_up and down: the router's part, and per expert [gate/up parts, down]
    router: Part | None = None
    experts: list[tuple[list[Part], Part]] | None = None


@dataclass(frozen=True)
class StackOptions:
    """What departs from Llama for the whole model (vsk_model): 0 for nothing."""

    scale: float = 0.0  # attention scores' scale, 0: 1 / sqrt(head dim)
    softcap: float = 0.0  # attention scores -> softcap * tanh(score / softcap)
    embed_scale: float = 0.0  # rows multiplied by it on entry
    gelu: bool = False  # GeGLU (tanh-approximated gelu) instead of SwiGLU
    experts: int = 0  # the mixtures' (blocks with experts): experts, how many a row takes, their inner size,
    experts_per_token: int = 0  # and whether the chosen experts' weights are renormalized to sum to 1
    expert_inter: int = 0
    norm_topk: bool = False


class NativeStack:
    """Every block of a model for one pass: (x [M, hidden] float32, cache, slots, positions) -> x in place."""

    def __init__(self, *, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, eps: float,
                 blocks: list[BlockWeights], options: StackOptions = StackOptions()):  # fmt: skip
        self._keep = blocks  # the tensors the structures point into
        self._experts = [self._experts_of(b) for b in blocks]  # the expert arrays the blocks point into
        self._blocks = (_Block * len(blocks))(*(self._block(b, e) for b, e in zip(blocks, self._experts, strict=True)))
        self._model = _Model(hidden, heads, kv_heads, head_dim, inter, len(blocks), eps, self._blocks,
                             options.scale, options.softcap, options.embed_scale, int(options.gelu), options.experts,
                             options.experts_per_token, options.expert_inter, int(options.norm_topk))  # fmt: skip
        self._caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._scratch = torch.empty(0, dtype=torch.uint8)
        self._lock = threading.Lock()  # one pass at a time: the scratch is shared (the pool serializes anyway)
        self.hidden = hidden

    @staticmethod
    def _parts(items: list[Part], count: int):
        if len(items) > count:
            raise ValueError(f"at most {count} parts")
        out = (_Part * count)()
        for i, (kind, data, row_bytes, n) in enumerate(items):
            out[i] = _Part(kind, data.data_ptr(), row_bytes, n)
        return out

    @classmethod
    def _experts_of(cls, b: BlockWeights):
        if b.experts is None:
            return None
        made = (_Expert * len(b.experts))()
        for i, (gate_up, down) in enumerate(b.experts):
            made[i] = _Expert(cls._parts(gate_up, 2), cls._parts([down], 1)[0], len(gate_up))
        return made

    @classmethod
    def _block(cls, b: BlockWeights, experts) -> _Block:
        parts = cls._parts

        def pointer(vector: torch.Tensor | None) -> int:
            if vector is None:
                return 0
            if vector.dtype != torch.float32 or not vector.is_contiguous():
                raise ValueError("the stack's vectors are contiguous float32")
            return vector.data_ptr()

        dense_mlp = experts is None
        if len(b.qkv) > 3 or len(b.o) != 1 or (dense_mlp and (len(b.gate_up) > 2 or len(b.down) != 1)):
            raise ValueError("a block's q/k/v takes at most 3 parts, gate/up 2, the others 1")
        if (b.q_norm is None) != (b.k_norm is None) or (b.post_attn_norm is None) != (b.post_mlp_norm is None):
            raise ValueError("q and k norms come together, and so do the post-norms")
        router = _Part() if dense_mlp else parts([b.router], 1)[0]
        return _Block(pointer(b.attn_norm), pointer(b.mlp_norm), pointer(b.qkv_bias), parts(b.qkv, 3),
                      parts(b.o, 1)[0], parts(b.gate_up, 2), parts(b.down, 1)[0], len(b.qkv), len(b.gate_up),
                      pointer(b.q_norm), pointer(b.k_norm), pointer(b.post_attn_norm), pointer(b.post_mlp_norm),
                      b.rope, b.window, router, experts)  # fmt: skip

    @property
    def model_view(self) -> _Model:
        """The library's view of the blocks (for what drives the stack from native code, greedy.py)."""
        return self._model

    def cache_view(self, cache, cos: torch.Tensor, sin: torch.Tensor) -> _Cache:
        """The library's view of a KV cache (models/kv_cache.py): its pools and its block table, made once per cache
        (its tensors never move)."""
        made = self._caches.get(cache)
        if made is None:
            keys, values = cache.keys, cache.values
            dtype = keys[0].dtype
            for t in (*keys, *values):
                if t.dtype != dtype or dtype not in (torch.float32, torch.float16) or not t.is_contiguous():
                    raise ValueError("the native stack needs contiguous float32 or float16 caches")
            tables = (cos.float().contiguous(), sin.float().contiguous())
            pointers = ((_c_p * len(keys))(*(k.data_ptr() for k in keys)),
                        (_c_p * len(values))(*(v.data_ptr() for v in values)))  # fmt: skip
            _, kv_heads, block, dim = keys[0].shape
            if tables[0].dim() != 3 or tables[0].shape[1] < cache.max_len or tables[0].shape[2] != dim:
                raise ValueError("rotary tables are [tables, at least the cache's length, head dim]")
            table = cache.table
            pages = _Pages(table.data_ptr(), table.shape[1], block, kv_heads * block * dim, block * dim)
            view = _Cache(pointers[0], pointers[1], pages, tables[0].data_ptr(), tables[1].data_ptr(),
                          int(dtype == torch.float16), tables[0].shape[1] * dim)  # fmt: skip
            made = (view, pointers, tables, table)
            self._caches[cache] = made
        return made[0]

    def _range(self, cache: _Cache, first: int, end: int) -> tuple[_Model, _Cache]:
        """The library's views of blocks first .. end - 1 and of their layers' caches (the structures point into the
        whole model's arrays; the embedding scale only where the range starts at block 0)."""
        if not 0 <= first < end <= len(self._keep):
            raise ValueError(f"layers {first} .. {end} of a stack of {len(self._keep)}")
        pointer = ctypes.sizeof(_c_p)
        model = _Model.from_buffer_copy(self._model)
        model.blocks = ctypes.cast(ctypes.addressof(self._blocks[first]), ctypes.POINTER(_Block))
        model.layers, model.embed_scale = end - first, self._model.embed_scale if first == 0 else 0.0
        view = _Cache.from_buffer_copy(cache)
        view.keys = ctypes.cast(ctypes.cast(cache.keys, _c_p).value + first * pointer, ctypes.POINTER(_c_p))
        view.values = ctypes.cast(ctypes.cast(cache.values, _c_p).value + first * pointer, ctypes.POINTER(_c_p))
        return model, view

    @staticmethod
    def timing() -> tuple[float, float, float, float]:
        """(seconds in the stack, of which in products; in the heads of native greedy steps; in the stack's
        attention) since the last call: the bench's split."""
        out = (ctypes.c_double * 4)()
        native.library().vsk_stack_timing(out)
        return out[0], out[1], out[2], out[3]

    def __call__(self, x: torch.Tensor, cache, cos: torch.Tensor, sin: torch.Tensor, slots: list[int],
                 positions: list[int], parents: list[int] | None = None,
                 layers: tuple[int, int] | None = None) -> None:  # fmt: skip
        """x [M, hidden] float32 contiguous, in place; row m is at positions[m] of cache slot slots[m]. `cache` is a
        KVCache (models/kv_cache.py) of float16 or float32; the blocks the rows are written to are made the slots'
        own first (KVCache.ensure). cos/sin are the rotary tables [tables, length, head dim]
        (Transformer.rope_tables).

        `parents` makes token trees: parents[m] is the row of row m's parent node, or -1 for a row that follows
        its sequence's previous position. A tree's rows (at most 16) follow its root, parents first; a node sits
        at its parent's position + 1 and is stored at its root's position + its row's distance from the root; it
        attends to its ancestors only, with the same bits as a chain pass along its path (vsk_stack_forward_tree).

        `layers` (first, end): only those blocks, the embedding scale applied only where the range starts at the first
        block; x leaves each range whole (its last residual added), so ranges run one after another give the bits
        of one call (models/hidden_states.py reads the rows between them).
        """
        m = x.shape[0]
        if x.dtype != torch.float32 or not x.is_contiguous() or x.shape[1] != self.hidden:
            raise ValueError("the native stack takes contiguous float32 rows of the hidden size")
        if parents is not None and len(parents) != m:
            raise ValueError(f"{len(parents)} parents for {m} rows")
        firsts: dict[int, int] = {}  # per slot: its first row's position and its rows (a tree's are stored in a run)
        counts: dict[int, int] = {}
        for slot, position in zip(slots, positions, strict=True):
            firsts[slot] = min(firsts.get(slot, position), position)
            counts[slot] = counts.get(slot, 0) + 1
        for slot, first in firsts.items():
            cache.ensure(slot, first + counts[slot], first)
        lib = native.library()
        rows = (_c_int * (2 * m))(*slots, *positions)
        tree = None if parents is None else (_c_int * m)(*parents)
        with self._lock:
            cache = self.cache_view(cache, cos, sin)
            need = lib.vsk_stack_scratch_bytes(ctypes.byref(self._model), m) + 64
            if self._scratch.numel() < need:
                self._scratch = torch.empty(need, dtype=torch.uint8)
            aligned = (self._scratch.data_ptr() + 63) // 64 * 64
            model, cache = (self._model, cache) if layers is None else self._range(cache, *layers)
            model, view, at = ctypes.byref(model), ctypes.byref(cache), ctypes.byref(rows, 4 * m)
            if tree is None:
                status = lib.vsk_stack_forward(model, view, x.data_ptr(), m, rows, at, aligned)
            else:
                status = lib.vsk_stack_forward_tree(model, view, x.data_ptr(), m, rows, at, tree, aligned)
        if status == -2:
            raise ValueError("parents that make no token trees (a parent after its row, in another slot, not one "
                             f"position before it, or a tree of more than {TREE_ROWS} rows)")  # fmt: skip
        if status != 0:
            raise RuntimeError("the native stack met a weight type without a kernel")
