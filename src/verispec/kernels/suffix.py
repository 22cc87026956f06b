"""A suffix trie of bounded depth over token sequences, with counts (csrc/vsk_suffix.c), for drafting by lookup:
what followed the longest suffix of a context that earlier text holds, most frequent first.

`SuffixTrie(depth)`: `add(tokens, weight)` counts every window of a whole sequence (weight -1 removes it again),
`extend(token)` grows the one sequence the trie follows token by token, `match(context)` finds the longest suffix
of a context (up to depth - 1 tokens) with a continuation, `candidates(node, most, least, chain)` lists those
continuations best first: (tokens, parents, scores). The library is loaded whatever VERISPEC_KERNELS says (this is
not a kernel path), and needs only to be compiled.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidParameterError
from .native import library_path

_c_p, _c_int, _c_i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
_SIGNATURES = {
    "vsk_suffix_new": ([_c_int], _c_p),
    "vsk_suffix_free": ([_c_p], None),
    "vsk_suffix_nodes": ([_c_p], _c_i64),
    "vsk_suffix_live": ([_c_p], _c_i64),
    "vsk_suffix_add": ([_c_p, _c_p, _c_int, _c_int], _c_int),
    "vsk_suffix_extend": ([_c_p, _c_p, ctypes.c_int32], _c_int),
    "vsk_suffix_match": ([_c_p, _c_p, _c_int, ctypes.POINTER(_c_int)], _c_i64),
    "vsk_suffix_candidates": ([_c_p, _c_i64, _c_int, ctypes.c_double, _c_int, _c_p, _c_p, _c_p], _c_int),
}
MAX_DEPTH = 256  # the cursor of vsk_suffix_extend holds at most this many suffixes


@functools.cache
def _lib() -> ctypes.CDLL | None:
    path = library_path()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    for name, (args, result) in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    return lib


def available() -> bool:
    return _lib() is not None


@dataclass(frozen=True)
class Candidates:
    """Continuations after a matched suffix, best first: tokens[i] follows parents[i] (-1: the context itself;
    else the index of an earlier candidate), with scores[i] the product of frequencies along its path."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]


class SuffixTrie:
    def __init__(self, depth: int):
        lib = _lib()
        if lib is None:
            raise InvalidParameterError("suffix drafting needs verispec's native library (compiled at install time)")
        if not 2 <= depth <= MAX_DEPTH:
            raise InvalidParameterError(f"a suffix trie's depth must be in [2, {MAX_DEPTH}], got {depth}")
        self._lib, self.depth = lib, depth
        self._handle = lib.vsk_suffix_new(depth)
        if not self._handle:
            raise MemoryError("cannot allocate a suffix trie")
        self._cursor = np.zeros(depth + 1, dtype=np.int64)

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.vsk_suffix_free(handle)

    @property
    def nodes(self) -> int:
        return self._lib.vsk_suffix_nodes(self._handle)

    @property
    def live(self) -> int:
        """Nodes of a count above 0 (removed sequences leave nodes of count 0 behind)."""
        return self._lib.vsk_suffix_live(self._handle)

    def add(self, tokens: list[int], weight: int = 1) -> None:
        ids = np.asarray(tokens, dtype=np.int32)
        if self._lib.vsk_suffix_add(self._handle, ids.ctypes.data, len(ids), weight):
            raise MemoryError("the suffix trie ran out of memory")

    def extend(self, tokens: list[int]) -> None:
        """The followed sequence grew by `tokens`."""
        cursor = self._cursor.ctypes.data
        for token in tokens:
            if self._lib.vsk_suffix_extend(self._handle, cursor, token):
                raise MemoryError("the suffix trie ran out of memory")

    def match(self, context: list[int], longest: int | None = None) -> tuple[int, int]:
        """(node, length) of the longest suffix of `context` (at most `longest` tokens, and depth - 1) with a
        continuation; length 0 when none. The trie remembers depth - length tokens after a match of that length:
        a caller that wants continuations of n tokens caps `longest` at depth - n."""
        most = self.depth - 1 if longest is None else max(0, min(longest, self.depth - 1))
        if most == 0:
            return 0, 0
        tail = np.asarray(context[-most:], dtype=np.int32)
        length = _c_int(0)
        node = self._lib.vsk_suffix_match(self._handle, tail.ctypes.data, len(tail), ctypes.byref(length))
        return node, length.value

    def candidates(self, node: int, most: int, least: float = 0.0, chain: bool = False) -> Candidates:
        tokens, parents = np.zeros(most, dtype=np.int32), np.zeros(most, dtype=np.int32)
        scores = np.zeros(most, dtype=np.float64)
        found = self._lib.vsk_suffix_candidates(
            self._handle, node, most, least, int(chain), tokens.ctypes.data, parents.ctypes.data, scores.ctypes.data
        )
        return Candidates(tokens[:found].tolist(), parents[:found].tolist(), scores[:found].tolist())
