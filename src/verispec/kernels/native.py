"""ctypes binding of the compiled kernel library (csrc/), and which path it runs.

`VERISPEC_KERNELS` picks the path: `auto` (default: the best this CPU runs), `scalar` (portable C), on x86-64
`avx512` (AVX-512 VNNI) or `avx2`, on AArch64 `neon_i8mm` (smmla), `neon_dot` (sdot) or `neon`, or `torch`
(PyTorch's kernels, as when no library was compiled). A CPU runs `scalar` and the paths of its own family up to
its best. The library runs its own
thread pool, sized like PyTorch's (`torch.set_num_threads`, `--threads`).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os
import sys
from pathlib import Path

import torch

from ..errors import InvalidParameterError

# the library's path ids (vsk.h): the portable path, the x86-64 family, the AArch64 family
ISAS = ("scalar", "avx2", "avx512", "neon", "neon_dot", "neon_i8mm")
_FAMILIES = (("avx2", "avx512"), ("neon", "neon_dot", "neon_i8mm"))
CHOICES = ("auto", *ISAS, "torch")
# GGML type ids with a native product, as (values, bytes) per block: Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, MXFP4, Q2_K,
# Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, and the dense F32, F16 and BF16 (whose activations are float32 rows: "blocks" of
# one value)
QUANT_TYPES = {
    2: (32, 18), 3: (32, 20), 6: (32, 22), 8: (32, 34), 20: (32, 18), 39: (32, 17),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 23: (256, 136),
    0: (1, 4), 1: (1, 2), 30: (1, 2),
}  # fmt: skip
DENSE_TYPES = (0, 1, 30)
# bytes of one activation block (vsk.h: vsk_act32, vsk_act256; a float for the dense types)
_ACT_BLOCK = {1: 4, 32: 40, 256: 308}
# tile forms (csrc/vsk_tiles.c): 16 rows interleaved, lossless, id 100 + the GGML type's; their activations are
# blocks of 32 values, or of 256 for the forms of the 256-weight types (as those types themselves)
TILE_OF = {qtype: 100 + qtype for qtype in (2, 3, 6, 8, 20, 10, 11, 12, 13, 14, 23)}
_ACT_OF_TILE = {tile: QUANT_TYPES[qtype][0] for qtype, tile in TILE_OF.items()}

_c_p, _c_int, _c_size, _c_f = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_float
_SIGNATURES = {
    "vsk_best_isa": ([], _c_int),
    "vsk_get_isa": ([], _c_int),
    "vsk_set_isa": ([_c_int], _c_int),
    "vsk_set_threads": ([_c_int], None),
    "vsk_get_threads": ([], _c_int),
    "vsk_act_row_bytes": ([_c_int, _c_int], _c_size),
    "vsk_quantize": ([_c_int, _c_p, _c_int, _c_int, _c_p], None),
    "vsk_matmul": ([_c_int, _c_p, _c_size, _c_int, _c_int, _c_p, _c_int, _c_p], _c_int),
    "vsk_linear": ([_c_int, _c_p, _c_size, _c_int, _c_int, _c_p, _c_int, _c_p, _c_p], _c_int),
    "vsk_repacked_bytes": ([_c_int, _c_int, _c_int], _c_size),
    "vsk_repack": ([_c_int, _c_p, _c_size, _c_int, _c_int, _c_p], _c_int),
    "vsk_stack_scratch_bytes": ([_c_p, _c_int], _c_size),
    "vsk_stack_forward": ([_c_p, _c_p, _c_p, _c_int, _c_p, _c_p, _c_p], _c_int),
    "vsk_stack_forward_tree": ([_c_p, _c_p, _c_p, _c_int, _c_p, _c_p, _c_p, _c_p], _c_int),
    "vsk_stack_timing": ([_c_p], None),
    "vsk_greedy_scratch_bytes": ([_c_p, _c_p, _c_int], _c_size),
    "vsk_greedy_steps": ([_c_p, _c_p, _c_p, _c_int, _c_p, _c_p, _c_p, _c_p, _c_int, _c_p, _c_p], _c_int),
    "vsk_read": ([_c_p, _c_size], ctypes.c_uint64),
    "vsk_has_rows_to_floats": ([_c_int], _c_int),
    "vsk_rows_to_floats": ([_c_int, _c_p, _c_size, _c_p, _c_int, _c_int, _c_p], _c_int),
    "vsk_requantize_q4_0": ([_c_int, _c_p, _c_size, _c_p, _c_int, _c_int, _c_p], _c_int),
    "vsk_rms_norm": ([_c_p, _c_p, _c_int, _c_int, ctypes.c_float, _c_p], None),
    "vsk_sum_squares": ([_c_p, _c_int], ctypes.c_float),
    "vsk_swiglu": ([_c_p, _c_p, _c_p, _c_int], None),
    "vsk_argmax": ([_c_p, _c_int], _c_int),
    "vsk_attention": (
        [_c_p, _c_int, _c_int, _c_int, _c_int, _c_p, _c_p, _c_size, _c_int, _c_f, _c_int, _c_f, _c_p],
        None,
    ),
    "vsk_delta_steps": ([_c_p] * 8 + [_c_int] * 4, None),
}


def library_path() -> Path | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (here / f"_vsk{suffix}").is_file():
            return here / f"_vsk{suffix}"
    return None


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library on the chosen path, or None (not compiled, or VERISPEC_KERNELS=torch)."""
    choice = os.environ.get("VERISPEC_KERNELS", "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise InvalidParameterError(f"VERISPEC_KERNELS={choice!r} is not one of {', '.join(CHOICES)}")
    path = library_path()
    if choice == "torch":
        return None
    if path is None:
        print(
            "verispec: warning: the native kernels were not compiled (no C compiler at install time?); "
            "running PyTorch's slower kernels. Reinstall with gcc present to get them.",
            file=sys.stderr,
        )
        return None
    lib = ctypes.CDLL(str(path))
    for name, (args, result) in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    if choice != "auto" and lib.vsk_set_isa(ISAS.index(choice)) != 0:
        raise InvalidParameterError(
            f"VERISPEC_KERNELS={choice}: this CPU cannot run that path (best: {ISAS[lib.vsk_best_isa()]})"
        )
    lib.vsk_set_threads(torch.get_num_threads())
    return lib


def available() -> bool:
    return library() is not None


def isa() -> str:
    """The path products run on: one of ISAS, or torch."""
    lib = library()
    return "torch" if lib is None else ISAS[lib.vsk_get_isa()]


def set_isa(name: str) -> None:
    """Switch path at run time (tests compare paths); raises if this CPU cannot run it."""
    if _lib().vsk_set_isa(ISAS.index(name)) != 0:
        raise InvalidParameterError(f"this CPU cannot run the {name} kernels")


def best_isa() -> str:
    return ISAS[_lib().vsk_best_isa()]


def runnable_isas() -> list[str]:
    """The paths this CPU runs: the portable one, then those of its own family up to its best."""
    best = best_isa()
    family = next((f for f in _FAMILIES if best in f), ())
    return ["scalar", *family[: family.index(best) + 1]] if family else ["scalar"]


def set_threads(count: int) -> None:
    _lib().vsk_set_threads(count)


def threads() -> int:
    """The native pool's threads."""
    return int(_lib().vsk_get_threads())


_claimed = False


def claim_threads(count: int | None = None) -> None:
    """Give the native pool `count` threads (default: those PyTorch has, the first time) and leave PyTorch's
    own ops one: two pools spinning on the same cores halve the speed of both."""
    global _claimed
    if count is None and _claimed:
        return
    set_threads(count or torch.get_num_threads())
    torch.set_num_threads(1)
    _claimed = True


def _lib() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError("the native kernels are not available")
    return lib


def read_bandwidth(megabytes: int = 512, repeats: int = 3) -> float:
    """The machine's read bandwidth in GB/s, with the pool's threads (best of `repeats` passes)."""
    import time

    buffer = torch.ones(megabytes << 20, dtype=torch.uint8)
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        _lib().vsk_read(buffer.data_ptr(), buffer.numel())
        best = min(best, time.perf_counter() - begin)
    return buffer.numel() / best / 1e9


def activation_block(qtype: int) -> int:
    """Values per quantized activation block for weights of `qtype` (a GGML type or a tile form): 32 or 256, or 1
    for the dense types (their activations are float32 rows)."""
    return _ACT_OF_TILE[qtype] if qtype in _ACT_OF_TILE else QUANT_TYPES[qtype][0]


def activation_row_bytes(qtype: int, k: int) -> int:
    block = activation_block(qtype)
    return k // block * _ACT_BLOCK[block]


def repack(qtype: int, weight: torch.Tensor, k: int) -> tuple[int, torch.Tensor] | None:
    """The tile form of an [N, row bytes] matrix (a lossless re-arrangement), or None for types without one."""
    if qtype not in TILE_OF or k % QUANT_TYPES[qtype][0]:
        return None
    lib = _lib()
    n, row_bytes = weight.shape
    out = torch.empty(lib.vsk_repacked_bytes(qtype, n, k), dtype=torch.uint8)
    tile = lib.vsk_repack(qtype, weight.data_ptr(), row_bytes, n, k, out.data_ptr())
    return tile, out


def quantize(qtype: int, x: torch.Tensor) -> torch.Tensor:
    """[M, K] float32 -> [M, row bytes] uint8 quantized activation blocks for weights of `qtype`."""
    x = x.contiguous().float()
    m, k = x.shape
    out = torch.empty(m, activation_row_bytes(qtype, k), dtype=torch.uint8)
    _lib().vsk_quantize(qtype, x.data_ptr(), m, k, out.data_ptr())
    return out


def matmul(qtype: int, weight: torch.Tensor, xq: torch.Tensor, k: int, n: int | None = None) -> torch.Tensor:
    """y [M, N] = x W^T from quantized activations; `weight` is [N, row bytes] uint8 in GGUF blocks, or a
    tile form (then `n` gives N)."""
    n, row_bytes = _rows(qtype, weight, n)
    y = torch.empty(xq.shape[0], n, dtype=torch.float32)
    _lib().vsk_matmul(qtype, weight.data_ptr(), row_bytes, n, k, xq.data_ptr(), xq.shape[0], y.data_ptr())
    return y


def linear(qtype: int, weight: torch.Tensor, x: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """y [M, N] = x W^T for float32 x [M, K] (quantized per row inside the call); `n` as in `matmul`."""
    x = x.contiguous().float()
    m, k = x.shape
    n, row_bytes = _rows(qtype, weight, n)
    scratch = torch.empty(m * activation_row_bytes(qtype, k), dtype=torch.uint8)
    y = torch.empty(m, n, dtype=torch.float32)
    _lib().vsk_linear(qtype, weight.data_ptr(), row_bytes, n, k, x.data_ptr(), m, scratch.data_ptr(), y.data_ptr())
    return y


def _rows(qtype: int, weight: torch.Tensor, n: int | None) -> tuple[int, int]:
    """(N, bytes per row): a GGUF matrix is [N, row bytes]; a tile form is flat, with N given."""
    if qtype in _ACT_OF_TILE:
        if n is None:
            raise ValueError("a tile form needs its row count")
        return n, 0
    if n is not None and n != weight.shape[0]:
        raise ValueError(f"weight has {weight.shape[0]} rows, not {n}")
    return int(weight.shape[0]), int(weight.shape[1])


def has_rows_to_floats(qtype: int) -> bool:
    """Whether `rows_to_floats` takes this GGML type."""
    return available() and bool(_lib().vsk_has_rows_to_floats(qtype))


def rows_to_floats(qtype: int, weight: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Rows `ids` of a GGUF matrix [N, row bytes] (uint8) as float32 [len(ids), k]: the `gguf` package's
    dequantization, the same bits."""
    ids = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), k, dtype=torch.float32)
    if _lib().vsk_rows_to_floats(qtype, weight.data_ptr(), weight.shape[1], ids.data_ptr(), ids.numel(), k,
                                 out.data_ptr()):  # fmt: skip
        raise ValueError(f"no native dequantization for GGML type {qtype}")
    return out


Q4_0 = 2


def requantize_q4_0(qtype: int, weight: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """Rows `ids` of a GGUF matrix [N, row bytes] (uint8) requantized to Q4_0 (ggml's reference rounding), as
    [len(ids), k / 32 * 18] uint8: a coarser copy (a draft's head, models/draft_head.py)."""
    ids = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), k // 32 * QUANT_TYPES[Q4_0][1], dtype=torch.uint8)
    if _lib().vsk_requantize_q4_0(qtype, weight.data_ptr(), weight.shape[1], ids.data_ptr(), ids.numel(), k,
                                  out.data_ptr()):  # fmt: skip
        raise ValueError(f"no native requantization from GGML type {qtype} (or {k} is not a multiple of 32)")
    return out


def sum_squares(x: torch.Tensor) -> float:
    """RMSNorm's sum of squares of a float32 vector, in the library's fixed order (csrc/vsk_rows.h)."""
    x = x.contiguous().float()
    return float(_lib().vsk_sum_squares(x.data_ptr(), x.numel()))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Each row of float32 x [..., n] normalized and scaled by `weight` [n], as the native stack does it."""
    rows = x.reshape(-1, x.shape[-1]).contiguous().float()
    weight = weight.contiguous().float()
    out = torch.empty_like(rows)
    _lib().vsk_rms_norm(rows.data_ptr(), weight.data_ptr(), rows.shape[0], rows.shape[1], eps, out.data_ptr())
    return out.reshape(x.shape)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up elementwise (float32 vectors), as the native stack computes it."""
    gate, up = gate.contiguous().float(), up.contiguous().float()
    out = torch.empty_like(gate)
    _lib().vsk_swiglu(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel())
    return out


def argmax(x: torch.Tensor) -> int:
    """The first index of the largest of a float32 vector (a NaN counts as largest), as greedy steps take it."""
    x = x.contiguous().float()
    if x.numel() < 1:
        raise ValueError("argmax of an empty vector")
    return int(_lib().vsk_argmax(x.data_ptr(), x.numel()))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1) (torch's rule: first maximum, first NaN), by the library's vector scan for float32 CPU
    tensors: PyTorch's, on the one thread its ops keep beside the pool, takes 0.5 ms for the four rows of a verify
    pass over a 152k vocabulary, against 0.05 ms. Other tensors, or without the library: torch's own."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.shape[-1] < 1 or not available():
        return x.argmax(-1)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    lib, width, stride = _lib(), rows.shape[1], rows.stride(0) * rows.element_size()
    base = rows.data_ptr()
    chosen = [lib.vsk_argmax(base + i * stride, width) for i in range(rows.shape[0])]
    return torch.tensor(chosen, dtype=torch.long).reshape(x.shape[:-1])


DELTA_MAX_VALUE = 1024  # vsk_delta.c's VSK_DELTA_MAX_V


def delta_steps(
    q, k, v, g, beta, state: torch.Tensor, into: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gated DeltaNet recurrence of T tokens of one sequence (vsk_delta.c; models/delta_net.py's `recurrent`):
    q, k [T, heads, key size] (normalised, scaled, one per value head), v [T, heads, value size], g and beta [T, heads],
    state [heads, key size, value size]; all float32. Returns the outputs [T, heads, value size] and the state after
    each token [T, heads, key size, value size] (written into `into`, contiguous float32, where given: memory already
    touched, not fresh pages). Each head's result is its own, in one fixed order."""
    q, k, v, g, beta, state = (t.contiguous().float() for t in (q, k, v, g, beta, state))
    steps, heads, key = q.shape
    value = v.shape[-1]
    if value > DELTA_MAX_VALUE:
        raise ValueError(f"a value head of {value} (the kernel takes at most {DELTA_MAX_VALUE})")
    states = torch.empty(steps, heads, key, value) if into is None else into
    out = torch.empty(steps, heads, value)
    _lib().vsk_delta_steps(
        state.data_ptr(), states.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(),
        out.data_ptr(), steps, heads, key, value,
    )  # fmt: skip
    return out, states


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, scale: float, window: int = 0,
              softcap: float = 0.0) -> torch.Tensor:  # fmt: skip
    """Causal attention of one sequence's new queries q [S, H, D] (positions start .. start + S - 1) over its
    cached keys and values [kv heads, length, D] (float32, written up to start + S): [S, H, D]. Each query
    attends to exactly its own prefix (its last `window` keys, 0: all; scores soft-capped when `softcap`) in one
    fixed order, so a query's result does not depend on how many others share the call."""
    q = q.contiguous().float()
    s, h, d = q.shape
    if keys.dtype != torch.float32 or not keys.is_contiguous() or not values.is_contiguous() or d % 8:
        raise ValueError("attention needs contiguous float32 caches and a head size that is a multiple of 8")
    out = torch.empty_like(q)
    _lib().vsk_attention(
        q.data_ptr(), s, h, keys.shape[0], d, keys.data_ptr(), values.data_ptr(), keys.stride(0), start, scale,
        window, softcap, out.data_ptr(),
    )  # fmt: skip
    return out
