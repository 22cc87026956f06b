"""The Triton source of kernels/triton_attention.py's kernel (imported at its first use: Triton is there only in
PyTorch's CUDA builds, and takes a moment to import). What it computes and the rule it keeps: triton_attention.py."""

import triton
import triton.language as tl


@triton.jit
def attention(q_ptr, k_ptr, v_ptr, out_ptr, read_ptr, limit_ptr, pos_ptr, rblock_ptr, rrow_ptr, rpos_ptr,
               sinks_ptr, scale, window, span,
               q_g, q_w, q_h, k_b, k_h, k_r, v_b, v_h, v_r, o_g, o_w, read_g, read_w,
               WIDTH: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, SIZE: tl.constexpr,
               D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, RECENT: tl.constexpr,
               WINDOWED: tl.constexpr, SINKS: tl.constexpr):  # fmt: skip
    g, kv, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r = part * ROWS + tl.arange(0, ROWS)  # row r: the group's row r // GROUP, the kv head's query head r % GROUP
    real = r < WIDTH * GROUP
    w = tl.where(real, r // GROUP, 0)
    head = kv * GROUP + r % GROUP
    d = tl.arange(0, D)
    in_size = d < SIZE
    q = tl.load(q_ptr + g * q_g + w[:, None] * q_w + head[:, None] * q_h + d[None, :],
                mask=real[:, None] & in_size[None, :], other=0.0).to(tl.float32) * scale  # fmt: skip
    limit = tl.load(limit_ptr + g * WIDTH + w, mask=real, other=0)  # older keys: positions below the limit
    position = tl.load(pos_ptr + g * WIDTH + w, mask=real, other=0)
    top = tl.full([ROWS], float("-inf"), tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    out = tl.zeros([ROWS, D], tl.float32)
    # the tiles some row of the group reaches: the others leave every row's state as it is (skipped)
    reach = tl.cdiv(tl.minimum(tl.max(limit, 0), span), TILE)
    first = 0
    if WINDOWED:  # from the tile of the first key the earliest row reading older keys sees
        first = tl.maximum(tl.min(tl.where(limit > 0, position, 1 << 30), 0) - window + 1, 0) // TILE
    for tile in range(first, reach):
        keys_at = tile * TILE + tl.arange(0, TILE)
        block = tl.load(read_ptr + g * read_g + (keys_at // BLOCK_SIZE) * read_w)
        row = keys_at % BLOCK_SIZE
        k = tl.load(k_ptr + block[:, None] * k_b + kv * k_h + row[:, None] * k_r + d[None, :],
                    mask=in_size[None, :], other=0.0).to(tl.float32)  # fmt: skip
        v = tl.load(v_ptr + block[:, None] * v_b + kv * v_h + row[:, None] * v_r + d[None, :],
                    mask=in_size[None, :], other=0.0).to(tl.float32)  # fmt: skip
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        hidden = keys_at[None, :] >= limit[:, None]
        if WINDOWED:
            hidden = hidden | (keys_at[None, :] <= position[:, None] - window)
        scores = tl.where(hidden, float("-inf"), scores)
        new_top = tl.maximum(top, tl.max(scores, 1))
        shift = tl.maximum(new_top, -3.4028234663852886e38)  # no key yet (-inf): exp(-inf - shift) = 0
        weights = tl.exp(scores - shift[:, None])
        kept = tl.exp(top - shift)
        total = total * kept + tl.sum(weights, 1)
        out = out * kept[:, None] + tl.dot(weights, v, input_precision="ieee")
        top = new_top
    for j in range(RECENT):  # the newest positions, one at a time, in position order
        at = (g * WIDTH + w) * RECENT + j
        block = tl.load(rblock_ptr + at, mask=real, other=0)
        row = tl.load(rrow_ptr + at, mask=real, other=0)
        recent_position = tl.load(rpos_ptr + at, mask=real, other=-1)
        hidden = recent_position < 0
        if WINDOWED:
            hidden = hidden | (recent_position <= position - window)
        seen = (~hidden)[:, None] & in_size[None, :]  # a hidden key is not read: its weight is 0
        k = tl.load(k_ptr + block[:, None] * k_b + kv * k_h + row[:, None] * k_r + d[None, :], mask=seen,
                    other=0.0).to(tl.float32)  # fmt: skip
        score = tl.where(hidden, float("-inf"), tl.sum(q * k, 1))
        v = tl.load(v_ptr + block[:, None] * v_b + kv * v_h + row[:, None] * v_r + d[None, :], mask=seen,
                    other=0.0).to(tl.float32)  # fmt: skip
        new_top = tl.maximum(top, score)
        shift = tl.maximum(new_top, -3.4028234663852886e38)
        weight = tl.exp(score - shift)
        kept = tl.exp(top - shift)
        total = total * kept + weight
        out = out * kept[:, None] + weight[:, None] * v
        top = new_top
    if SINKS:  # a sink logit per head takes its share of the softmax, with no value
        total = total + tl.exp(tl.load(sinks_ptr + head).to(tl.float32) - top)
    out = out / tl.where(real, total, 1.0)[:, None]  # rows past the group's: no keys, not stored
    tl.store(out_ptr + g * o_g + w[:, None] * o_w + head[:, None] * SIZE + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=real[:, None] & in_size[None, :])  # fmt: skip
