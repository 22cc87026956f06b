"""A shaped pass's attention (models/shaped_attention.py) as one Triton kernel a layer, on CUDA.

Written out in PyTorch's operations, a layer's attention at the pass shape is four products and five fused kernels
even compiled (benchmarks/pass_kernels.py), and its keys are gathered into copies first; at a decode step's size each
of those kernels costs about what reading its data does. Here one kernel reads each key once, where the cache holds
it, and keeps the running softmax in registers.

The rule it keeps (docs/decisions.md "One pass shape on a GPU"): a row's result is a function of its own query and
keys. A program computes ROWS of one group's (row, query head) pairs for one kv head: every product has one shape
(ROWS x D times D x TILE), the older keys are read in tiles of TILE positions from position 0 up, the same tiles in
every pass, then the row's RECENT newest positions one by one in position order (a token tree's node: its ancestors,
wherever the pass stored them). A tile every key of which is hidden from every row of the program leaves the running
(maximum, sum, output) as they were, bit for bit (weights exp(-inf) = 0, the old state scaled by exp(0) = 1), so the
kernel skips the tiles beyond its rows' reach and before their window: a row's bits do not depend on how far the
pass's other rows reach.

Past the first CHUNK older positions a program would walk a long context alone, while the card's other processors
wait: a pass whose older keys reach further splits them into chunks of CHUNK positions, each chunk's state (maximum,
sum, output) computed by a program of its own from scratch, then merged in position order by one program per rows,
which adds the recent keys. The chunks are fixed by position, so a row's bits still do not depend on the other rows;
and a row whose older keys fit in the first chunk gets the same bits in a pass that splits as in one that does not
(its one chunk's state merged into the empty state is multiplied by exactly 1, the empty one by exactly 0).

Products are taken in float32 (input_precision "ieee"), as the written-out attention takes them. Soft-capped scores
are not covered (`covers`): such a model keeps the written-out attention. `usable(device)` runs the kernel once on
the device before a model takes it, so that a Triton or a card it does not run on is found before the first pass, not
between two passes whose bits would then differ.
"""

from __future__ import annotations

import functools
import importlib.util
import logging

import torch

log = logging.getLogger("verispec")

TILE = 32  # older keys per tile: a multiple of 16 (tl.dot), a divisor of shaped_attention.KEY_BLOCK
ROWS = 16  # a group's rows (x query heads of one kv head) per program: at least 16 (tl.dot)
WARPS = 8  # with ROWS and TILE: no register spilled at head sizes 64 and 128 (tests/test_triton_attention.py)
# older keys one program walks: a pass reaching further splits them into chunks of this many positions, a program
# each (the card's processors share a long context), and merges the chunks' states. Not under shaped_attention's
# KEY_BLOCK: a pass reads at least one such block (its span), and a row must not be split in one pass and walked in
# another (triton_attention_kernel.py)
CHUNK = 1024


def available() -> bool:
    """Whether Triton is installed (PyTorch's CUDA builds bring it)."""
    return importlib.util.find_spec("triton") is not None


def use_interpreter() -> None:
    """The kernel runs in Triton's interpreter from now on, in Python, on any device (a CPU: the tests,
    benchmarks/pass_kernels.py); before its first use, which decides between compiling and interpreting it. Triton
    3.6's interpreter reads a loop bound held in a tensor by int() of a one-element array, which NumPy 2 refuses:
    read by .item() instead."""
    import os  # noqa: PLC0415

    os.environ["TRITON_INTERPRET"] = "1"
    if not available():
        return
    from triton.runtime import interpreter  # noqa: PLC0415

    patch = interpreter._patch_lang_tensor
    if getattr(patch, "bounds_read_by_item", False):
        return

    def patched(tensor, scope) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched.bounds_read_by_item = True
    interpreter._patch_lang_tensor = patched


def covers(attn) -> bool:
    """Whether the kernel computes `attn`'s (an Attention's) attention: not soft-capped scores."""
    return not attn.softcap


def attend(attn, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, read: torch.Tensor,
           older_limit: torch.Tensor, positions: torch.Tensor, recent_block: torch.Tensor, recent_row: torch.Tensor,
           recent_position: torch.Tensor, span: int, block_size: int) -> torch.Tensor:  # fmt: skip
    """[groups, width, heads x head size] in q's dtype: `attn`'s queries `q` [groups, width, heads, head size] over the
    pools `keys`, `values` [blocks, kv heads, block size, head size], as ShapedPages.attend defines it: each group's
    older keys (positions below its rows' `older_limit`, at most `span`) in the cache blocks `read` [groups, blocks]
    names, its rows' recent keys at (`recent_block`, `recent_row`) [groups, width, RECENT] where `recent_position` is
    not negative; within `attn.window` of the row's `positions` where the layer has a window."""
    return shaped_attention(q=q.contiguous(), keys=keys, values=values, read=read,
                            older_limit=older_limit.contiguous(), positions=positions.contiguous(),
                            recent_block=recent_block.contiguous(), recent_row=recent_row.contiguous(),
                            recent_position=recent_position.contiguous(), sinks=attn.sinks,
                            kv_heads=attn.num_kv_heads, scale=float(attn.scale), window=int(attn.window or 0),
                            span=int(span), block_size=int(block_size))  # fmt: skip


# an operation of its own to torch.compile (one call in a compiled region, traced no further) and to CUDA graphs
@torch.library.custom_op("verispec::shaped_attention", mutates_args=())
def shaped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, read: torch.Tensor,
                     older_limit: torch.Tensor, positions: torch.Tensor, recent_block: torch.Tensor,
                     recent_row: torch.Tensor, recent_position: torch.Tensor, sinks: torch.Tensor | None,
                     kv_heads: int, scale: float, window: int, span: int, block_size: int) -> torch.Tensor:  # fmt: skip
    """`attend`'s launch: one program per (group, kv head, ROWS of the group's rows x query heads); where the pass's
    older keys reach past CHUNK positions, one per chunk of those before, whose states those programs merge."""
    from .triton_attention_kernel import attention, chunk, triton  # noqa: PLC0415 - Triton at first use

    groups, width, heads, size = q.shape
    group = heads // kv_heads
    parts = triton.cdiv(width * group, ROWS)
    out = q.new_empty(groups, width, heads * size)
    strides = (*q.stride()[:3], *keys.stride()[:3], *values.stride()[:3])
    shapes = dict(WIDTH=width, GROUP=group, ROWS=ROWS, SIZE=size, D=max(16, triton.next_power_of_2(size)),
                  TILE=TILE, CHUNK=CHUNK, WINDOWED=window > 0)  # fmt: skip
    split = span > CHUNK
    chunks = triton.cdiv(span, CHUNK) if split else 1
    # the chunks' states: (maximum, sum) and output per (group, chunk, row, query head), in float32
    tops, totals = (q.new_empty(groups * chunks * width * heads if split else 1, dtype=torch.float32)
                    for _ in range(2))  # fmt: skip
    states = q.new_empty(tops.shape[0], shapes["D"] if split else 1, dtype=torch.float32)
    if split:
        chunk[(groups, kv_heads, parts * chunks)](
            q, keys, values, read, older_limit, positions, tops, totals, states, scale, window, span, chunks,
            *strides, read.stride(0), read.stride(1), **shapes, BLOCK_SIZE=block_size, num_warps=WARPS,
        )  # fmt: skip
    attention[(groups, kv_heads, parts)](
        q, keys, values, out, read, older_limit, positions, recent_block, recent_row, recent_position, tops, totals,
        states, sinks if sinks is not None else q, scale, window, span, chunks, *strides, out.stride(0),
        out.stride(1), read.stride(0), read.stride(1), **shapes, BLOCK_SIZE=block_size,
        RECENT=recent_block.shape[-1], SINKS=sinks is not None, SPLIT=split, num_warps=WARPS,
    )  # fmt: skip
    return out


@shaped_attention.register_fake
def _(q, keys, values, read, older_limit, positions, recent_block, recent_row, recent_position, sinks, kv_heads,
      scale, window, span, block_size):  # fmt: skip
    groups, width, heads, size = q.shape
    return q.new_empty(groups, width, heads * size)


@functools.cache
def usable(device: str, dtype: torch.dtype = torch.float32, sizes: tuple[int, ...] = (64,)) -> bool:
    """Whether the kernel runs on `device` (a CUDA device's name) over queries and pools of `dtype` and heads of each
    of `sizes` values, and agrees with plain attention there, on a small case; said once in the log where it does
    not."""
    if not available():
        return False
    try:
        # a pass of one chunk of older keys, and one that splits them (a group reaching past CHUNK)
        return all(_agrees(torch.device(device), dtype, size, far) for size in sizes for far in (900, CHUNK + 900))
    except Exception:  # any failure to compile or launch: the written-out attention, for every pass
        log.warning("the fused shaped attention does not run on %s; shaped passes write attention out", device,
                    exc_info=True)  # fmt: skip
        return False


def _agrees(device: torch.device, dtype: torch.dtype, size: int, far: int) -> bool:
    class Layer:
        num_kv_heads, scale, window, softcap, sinks = 2, size**-0.5, 0, None, None

    gen = torch.Generator().manual_seed(0)
    groups, width, heads, block_size, recent = 2, 2, 4, 16, 16
    span = -(-far // CHUNK) * CHUNK
    keys, values = (torch.randn(2 * span // block_size, 2, block_size, size, generator=gen).to(device, dtype)
                    for _ in range(2))  # fmt: skip
    q = torch.randn(groups, width, heads, size, generator=gen).to(device, dtype)
    read = torch.arange(keys.shape[0], device=device).view(groups, -1)
    positions = torch.tensor([[40, 41], [far, far + 1]], device=device)
    recent_position = positions[..., None] + torch.arange(1 - recent, 1, device=device)
    recent_block = read.gather(1, (recent_position // block_size).flatten(1)).view_as(recent_position)
    got = attend(Layer(), q, keys, values, read=read, older_limit=positions - recent + 1, positions=positions,
                 recent_block=recent_block, recent_row=recent_position % block_size, recent_position=recent_position,
                 span=span, block_size=block_size).float()  # fmt: skip
    expected = _reference(
        q.float(),
        keys.float(),
        values.float(),
        read=read,
        positions=positions,
        block_size=block_size,
        scale=Layer.scale,
    )
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2  # the output rounded to a 16-bit type
    if not torch.allclose(got, expected, atol=tolerance, rtol=tolerance):
        log.warning("the fused shaped attention disagrees on %s in %s at head size %d (largest difference %.3g); "
                    "shaped passes write attention out", device, dtype, size,
                    (got - expected).abs().max().item())  # fmt: skip
        return False
    return True


def _reference(q, keys, values, *, read, positions, block_size: int, scale: float) -> torch.Tensor:
    """Causal attention of each row over its group's positions 0 .. its own, read plainly."""
    groups, width, heads, size = q.shape
    group = heads // keys.shape[1]
    out = torch.empty(groups, width, heads, size, device=q.device)
    for g in range(groups):
        for i in range(width):
            at = torch.arange(int(positions[g, i]) + 1, device=q.device)
            blocks, rows = read[g, at // block_size], at % block_size
            k = keys[blocks, :, rows].repeat_interleave(group, 1)  # [keys, heads, size]
            v = values[blocks, :, rows].repeat_interleave(group, 1)
            weights = torch.softmax(torch.einsum("hd,khd->hk", q[g, i] * scale, k), -1)
            out[g, i] = torch.einsum("hk,khd->hd", weights, v)
    return out.reshape(groups, width, -1)
