"""Greedy draft steps in one native call (csrc/vsk_greedy.c).

A greedy draft of k tokens takes k passes of the draft model: the first feeds what the draft's cache lacks, each
one after feeds the token the pass before chose; each pass runs the embedding, the stack, the final norm and the
head, then takes the argmax. Driven from Python, a pass crosses into the library four times and spends about
0.3-0.4 ms in PyTorch and ctypes; `GreedySteps` runs all k in one call, with the same functions in the same
order, so it chooses the same tokens.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from . import native
from .linear import GGUFEmbedding, NativeLinear, NativeRMSNorm
from .stack import NativeStack, _Part

_c_p, _c_int, _c_size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
MAX_ROWS = 256  # tokens fed in a call's first pass (VSK_GREEDY_ROWS)


class _Head(ctypes.Structure):
    _fields_ = [
        ("embed_type", _c_int), ("embed", _c_p), ("embed_row_bytes", _c_size), ("vocab", _c_int),
        ("norm", _c_p), ("head", _Part), ("head_bias", _c_p), ("ids", _c_p), ("rows", _c_int),
        ("softcap", ctypes.c_float),
    ]  # fmt: skip


class GreedySteps:
    """Greedy steps of a native model for several sequences, in one call."""

    def __init__(self, model, head: NativeLinear, ids: torch.Tensor | None, rows: int):
        """`head` computes the logits (the model's own, or a restricted draft head); row r of it is token
        ids[r] (None: r); the argmax runs over its first `rows` rows."""
        stack, embed = model.fused_blocks, model.embed
        kind, data, row_bytes, n = head.parts()[0]
        self._ids = None if ids is None else ids.to(torch.int64).contiguous()
        self._keep = (data, head.bias, model.norm.weight, embed.weight_blocks)
        self._head = _Head(
            int(embed.qtype), embed.weight_blocks.data_ptr(), embed.weight_blocks.shape[1],
            embed.weight_blocks.shape[0], model.norm.weight.data_ptr(), _Part(kind, data.data_ptr(), row_bytes, n),
            0 if head.bias is None else head.bias.data_ptr(), 0 if self._ids is None else self._ids.data_ptr(), rows,
            model.config.final_softcap,
        )  # fmt: skip
        self._stack: NativeStack = stack
        self._model = model
        self._scratch = torch.empty(0, dtype=torch.uint8)
        self._lock = threading.Lock()

    @staticmethod
    def supports(model, head) -> bool:
        """Whether `model` with output head `head` runs natively end to end: a native stack, embeddings the
        library dequantizes, the native final norm, and a one-part native head."""
        return (
            isinstance(model.fused_blocks, NativeStack)
            and isinstance(model.embed, GGUFEmbedding)
            and native.has_rows_to_floats(int(model.embed.qtype))
            and isinstance(model.norm, NativeRMSNorm)
            and isinstance(head, NativeLinear)
            and len(head.kernels) == 1
        )

    def __call__(self, cache, slots: list[int], feeds: list[list[int]], steps: int) -> list[list[int]]:
        """Feed slot slots[m] the tokens feeds[m] (after its cached ones) and choose a token, then feed each
        chosen token and choose again: `steps` choices per sequence, returned. A slot's cache length advances by
        the tokens fed: len(feeds[m]) + steps - 1."""
        m, rows = len(slots), sum(len(feed) for feed in feeds)
        if steps < 1 or len(feeds) != m or not all(feeds) or not 1 <= m <= rows <= MAX_ROWS:
            raise ValueError(f"greedy steps take at least one step and 1 to {MAX_ROWS} tokens, one or more per slot")
        starts = [cache.lengths[slot] for slot in slots]
        longest = max(start + len(feed) + steps - 1 for start, feed in zip(starts, feeds, strict=True))
        if longest > cache.max_len:
            raise ValueError(f"sequence of {longest} tokens exceeds the cache's {cache.max_len}")
        for slot, start, feed in zip(slots, starts, feeds, strict=True):
            cache.ensure(slot, start + len(feed) + steps - 1)  # every position the steps write, the slot's own
        lib = native.library()
        where = (_c_int * (3 * m))(*slots, *starts, *(len(feed) for feed in feeds))
        tokens = (ctypes.c_int64 * rows)(*(token for feed in feeds for token in feed))
        chosen = (ctypes.c_int64 * (m * steps))()
        cos, sin = self._model.rope_tables(cache.max_len)
        with self._lock:
            view = self._stack.cache_view(cache, cos, sin)
            model = ctypes.byref(self._stack.model_view)
            need = lib.vsk_greedy_scratch_bytes(model, ctypes.byref(self._head), rows) + 64
            if self._scratch.numel() < need:
                self._scratch = torch.empty(need, dtype=torch.uint8)
            aligned = (self._scratch.data_ptr() + 63) // 64 * 64
            status = lib.vsk_greedy_steps(model, ctypes.byref(view), ctypes.byref(self._head), m, where,
                                          ctypes.byref(where, 4 * m), ctypes.byref(where, 8 * m), tokens, steps,
                                          chosen, aligned)  # fmt: skip
        if status == -2:
            raise IndexError("token id out of the embedding's range")
        if status != 0:
            raise RuntimeError("the native greedy steps met a weight type without a kernel")
        for slot, feed in zip(slots, feeds, strict=True):
            cache.lengths[slot] += len(feed) + steps - 1
        return [list(chosen[i * steps : (i + 1) * steps]) for i in range(m)]
