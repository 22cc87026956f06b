"""The Triton source of kernels/triton_attention.py's kernels (imported at their first use: Triton is there only in
PyTorch's CUDA builds, and takes a moment to import). What they compute and the rule they keep: triton_attention.py.

`attention` walks all of a program's older keys; past the first CHUNK positions (SPLIT) `chunk` splits them, one
program per CHUNK positions computing a chunk's running state from scratch, and `attention` merges the chunks' states
in position order instead of walking. A row whose older keys fit in one chunk gets the same bits either way (its one
state merged into the empty one: products by exactly 0 and 1), and a row reaching further is only ever in passes that
split."""

import triton
import triton.language as tl

LEAST = tl.constexpr(-3.4028234663852886e38)  # float32's least finite number


@triton.jit
def attention(q_ptr, k_ptr, v_ptr, out_ptr, read_ptr, limit_ptr, pos_ptr, rblock_ptr, rrow_ptr, rpos_ptr,
              top_ptr, total_ptr, state_ptr, sinks_ptr, scale, window, span, chunks,
              q_g, q_w, q_h, k_b, k_h, k_r, v_b, v_h, v_r, o_g, o_w, read_g, read_w,
              WIDTH: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, SIZE: tl.constexpr,
              D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, CHUNK: tl.constexpr,
              RECENT: tl.constexpr, WINDOWED: tl.constexpr, SINKS: tl.constexpr, SPLIT: tl.constexpr):  # fmt: skip
    """One program: ROWS of group g's (row, query head) pairs for kv head `kv`, over all their keys: the older ones
    walked here, or (SPLIT) their `chunks` chunks' states merged; then the recent ones."""
    g, kv, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    real, w, head, d, in_size, q, limit, position = _rows(q_ptr=q_ptr, limit_ptr=limit_ptr, pos_ptr=pos_ptr,
                                                          scale=scale, g=g, kv=kv, part=part, q_g=q_g, q_w=q_w,
                                                          q_h=q_h, WIDTH=WIDTH, GROUP=GROUP, ROWS=ROWS, SIZE=SIZE,
                                                          D=D)  # fmt: skip
    if SPLIT:
        top, total, out = _merged(top_ptr=top_ptr, total_ptr=total_ptr, state_ptr=state_ptr, chunks=chunks, g=g,
                                  w=w, head=head, real=real, d=d, limit=limit, span=span, WIDTH=WIDTH, GROUP=GROUP,
                                  ROWS=ROWS, D=D, CHUNK=CHUNK)  # fmt: skip
    else:
        first, reach = _tiles(limit=limit, position=position, window=window, span=span, TILE=TILE,
                              WINDOWED=WINDOWED)  # fmt: skip
        top, total, out = _older(q=q, keys=k_ptr + kv * k_h, values=v_ptr + kv * v_h, read=read_ptr + g * read_g,
                                 read_w=read_w, k_b=k_b, k_r=k_r, v_b=v_b, v_r=v_r, limit=limit, position=position,
                                 window=window, first=first, reach=reach, d=d, in_size=in_size, ROWS=ROWS, D=D,
                                 BLOCK_SIZE=BLOCK_SIZE, TILE=TILE, WINDOWED=WINDOWED)  # fmt: skip
    recent = (g * WIDTH + w) * RECENT  # the row's RECENT addresses
    top, total, out = _recent(q=q, keys=k_ptr + kv * k_h, values=v_ptr + kv * v_h, blocks=rblock_ptr + recent,
                              rows=rrow_ptr + recent, positions=rpos_ptr + recent, real=real, position=position,
                              window=window, k_b=k_b, k_r=k_r, v_b=v_b, v_r=v_r, d=d, in_size=in_size, top=top,
                              total=total, out=out, RECENT=RECENT, WINDOWED=WINDOWED)  # fmt: skip
    if SINKS:  # a sink logit per head takes its share of the softmax, with no value
        total = total + tl.exp(tl.load(sinks_ptr + head).to(tl.float32) - top)
    out = out / tl.where(real, total, 1.0)[:, None]  # rows past the group's: no keys, not stored
    tl.store(out_ptr + g * o_g + w[:, None] * o_w + head[:, None] * SIZE + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=real[:, None] & in_size[None, :])  # fmt: skip


@triton.jit
def chunk(q_ptr, k_ptr, v_ptr, read_ptr, limit_ptr, pos_ptr, top_ptr, total_ptr, state_ptr, scale, window, span,
          chunks, q_g, q_w, q_h, k_b, k_h, k_r, v_b, v_h, v_r, read_g, read_w,
          WIDTH: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, SIZE: tl.constexpr, D: tl.constexpr,
          BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, CHUNK: tl.constexpr, WINDOWED: tl.constexpr):  # fmt: skip
    """One program: `attention`'s rows over the older keys of chunk c alone (positions c x CHUNK up to the next
    chunk's), from an empty state; stores the state (maximum, sum, output) for `attention` to merge."""
    g, kv, at = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    part, c = at // chunks, at % chunks
    real, w, head, d, in_size, q, limit, position = _rows(q_ptr=q_ptr, limit_ptr=limit_ptr, pos_ptr=pos_ptr,
                                                          scale=scale, g=g, kv=kv, part=part, q_g=q_g, q_w=q_w,
                                                          q_h=q_h, WIDTH=WIDTH, GROUP=GROUP, ROWS=ROWS, SIZE=SIZE,
                                                          D=D)  # fmt: skip
    first, reach = _tiles(limit=limit, position=position, window=window, span=span, TILE=TILE, WINDOWED=WINDOWED)
    per = CHUNK // TILE
    top, total, out = _older(q=q, keys=k_ptr + kv * k_h, values=v_ptr + kv * v_h, read=read_ptr + g * read_g,
                             read_w=read_w, k_b=k_b, k_r=k_r, v_b=v_b, v_r=v_r, limit=limit, position=position,
                             window=window, first=tl.maximum(first, c * per), reach=tl.minimum(reach, (c + 1) * per),
                             d=d, in_size=in_size, ROWS=ROWS, D=D, BLOCK_SIZE=BLOCK_SIZE, TILE=TILE,
                             WINDOWED=WINDOWED)  # fmt: skip
    at_state = ((g * chunks + c) * WIDTH + w) * (tl.num_programs(1) * GROUP) + head  # [groups, chunks, width, heads]
    tl.store(top_ptr + at_state, top, mask=real)
    tl.store(total_ptr + at_state, total, mask=real)
    tl.store(state_ptr + at_state[:, None] * D + d[None, :], out, mask=real[:, None])


@triton.jit
def _merged(top_ptr, total_ptr, state_ptr, chunks, g, w, head, real, d, limit, span, WIDTH: tl.constexpr,
            GROUP: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """The running (maximum, sum, output) over the chunks' states `chunk` stored, in position order, as far as a row
    of the program reaches (a chunk past a row's reach holds the empty state, which leaves its sums as they were)."""
    top = tl.full([ROWS], float("-inf"), tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    out = tl.zeros([ROWS, D], tl.float32)
    for c in range(0, tl.cdiv(tl.minimum(tl.max(limit, 0), span), CHUNK)):
        at_state = ((g * chunks + c) * WIDTH + w) * (tl.num_programs(1) * GROUP) + head
        chunk_top = tl.load(top_ptr + at_state, mask=real, other=float("-inf"))
        chunk_total = tl.load(total_ptr + at_state, mask=real, other=0.0)
        chunk_out = tl.load(state_ptr + at_state[:, None] * D + d[None, :], mask=real[:, None], other=0.0)
        new_top = tl.maximum(top, chunk_top)
        shift = tl.maximum(new_top, LEAST)
        kept, taken = tl.exp(top - shift), tl.exp(chunk_top - shift)
        total = total * kept + chunk_total * taken
        out = out * kept[:, None] + chunk_out * taken[:, None]
        top = new_top
    return top, total, out


@triton.jit
def _rows(q_ptr, limit_ptr, pos_ptr, scale, g, kv, part, q_g, q_w, q_h, WIDTH: tl.constexpr, GROUP: tl.constexpr,
          ROWS: tl.constexpr, SIZE: tl.constexpr, D: tl.constexpr):  # fmt: skip
    """A program's rows: pair r is the group's row r // GROUP, the kv head's query head r % GROUP; their scaled
    queries (float32), the limits of their older keys (positions below) and their positions."""
    r = part * ROWS + tl.arange(0, ROWS)
    real = r < WIDTH * GROUP
    w = tl.where(real, r // GROUP, 0)
    head = kv * GROUP + r % GROUP
    d = tl.arange(0, D)
    in_size = d < SIZE
    q = tl.load(q_ptr + g * q_g + w[:, None] * q_w + head[:, None] * q_h + d[None, :],
                mask=real[:, None] & in_size[None, :], other=0.0).to(tl.float32) * scale  # fmt: skip
    limit = tl.load(limit_ptr + g * WIDTH + w, mask=real, other=0)
    position = tl.load(pos_ptr + g * WIDTH + w, mask=real, other=0)
    return real, w, head, d, in_size, q, limit, position


@triton.jit
def _tiles(limit, position, window, span, TILE: tl.constexpr, WINDOWED: tl.constexpr):
    """The older keys' tiles some row of the program sees: from `first` (the tile of the first key the earliest row
    reading older keys sees in its window) up to `reach`. The others leave every row's state as it is (skipped)."""
    reach = tl.cdiv(tl.minimum(tl.max(limit, 0), span), TILE)
    first = 0
    if WINDOWED:
        first = tl.maximum(tl.min(tl.where(limit > 0, position, 1 << 30), 0) - window + 1, 0) // TILE
    return first, reach


@triton.jit
def _older(q, keys, values, read, read_w, k_b, k_r, v_b, v_r, limit, position, window, first, reach, d, in_size,
           ROWS: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
           WINDOWED: tl.constexpr):  # fmt: skip
    """The running (maximum, sum, output) over the older keys' tiles `first` .. `reach` - 1, in position order, each
    tile one product of the rows' queries and one of their weights."""
    top = tl.full([ROWS], float("-inf"), tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    out = tl.zeros([ROWS, D], tl.float32)
    for tile in range(first, reach):
        keys_at = tile * TILE + tl.arange(0, TILE)
        block = tl.load(read + (keys_at // BLOCK_SIZE) * read_w)
        row = keys_at % BLOCK_SIZE
        k = tl.load(keys + block[:, None] * k_b + row[:, None] * k_r + d[None, :], mask=in_size[None, :],
                    other=0.0).to(tl.float32)  # fmt: skip
        v = tl.load(values + block[:, None] * v_b + row[:, None] * v_r + d[None, :], mask=in_size[None, :],
                    other=0.0).to(tl.float32)  # fmt: skip
        hidden = keys_at[None, :] >= limit[:, None]
        if WINDOWED:
            hidden = hidden | (keys_at[None, :] <= position[:, None] - window)
        scores = tl.where(hidden, float("-inf"), tl.dot(q, tl.trans(k), input_precision="ieee"))
        new_top = tl.maximum(top, tl.max(scores, 1))
        shift = tl.maximum(new_top, LEAST)  # no key yet (-inf): exp(-inf - shift) = 0
        weights = tl.exp(scores - shift[:, None])
        kept = tl.exp(top - shift)
        total = total * kept + tl.sum(weights, 1)
        out = out * kept[:, None] + tl.dot(weights, v, input_precision="ieee")
        top = new_top
    return top, total, out


@triton.jit
def _recent(q, keys, values, blocks, rows, positions, real, position, window, k_b, k_r, v_b, v_r, d, in_size, top,
            total, out, RECENT: tl.constexpr, WINDOWED: tl.constexpr):  # fmt: skip
    """The running (maximum, sum, output) after each row's RECENT newest keys, one at a time in position order, at
    the addresses (`blocks`, `rows`) of each row's; a hidden one (`positions` negative, or outside the window) is not
    read."""
    for j in range(RECENT):
        block = tl.load(blocks + j, mask=real, other=0)
        row = tl.load(rows + j, mask=real, other=0)
        recent_position = tl.load(positions + j, mask=real, other=-1)
        hidden = recent_position < 0
        if WINDOWED:
            hidden = hidden | (recent_position <= position - window)
        seen = (~hidden)[:, None] & in_size[None, :]
        k = tl.load(keys + block[:, None] * k_b + row[:, None] * k_r + d[None, :], mask=seen, other=0.0).to(tl.float32)
        score = tl.where(hidden, float("-inf"), tl.sum(q * k, 1))
        v = tl.load(values + block[:, None] * v_b + row[:, None] * v_r + d[None, :], mask=seen,
                    other=0.0).to(tl.float32)  # fmt: skip
        new_top = tl.maximum(top, score)
        shift = tl.maximum(new_top, LEAST)
        weight = tl.exp(score - shift)
        kept = tl.exp(top - shift)
        total = total * kept + weight
        out = out * kept[:, None] + weight[:, None] * v
        top = new_top
    return top, total, out
