"""Weight-only int4 / int8 linears on PyTorch's own CPU kernels, with bfloat16 activations.

- int4: groups of 32 weights along the input axis, w = (q - 8) * scale + zero, q in 0..15
  (`_weight_int4pack_mm_for_cpu`). GGUF Q4_K, Q4_0 and Q4_1 blocks have exactly this form
  (Q4_K: scale = d * sc, zero = 8 * scale - dmin * m), so they map without re-quantizing; the only
  change is that scale and zero are stored in bfloat16.
- int8: one scale per output row, w = q * scale, q in -127..127 (`_weight_int8pack_mm`): a
  re-quantization of the source weights (round to nearest).

Both kernels compute every output row independently of how many rows share the call (checked by
tests), which is what keeps greedy speculative decoding token-identical to plain decoding in this
format: a position's logits do not depend on how many tokens share its forward pass.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .model import Transformer
from .mtp import transformer

GROUP = 32
DENSE_BELOW_MULTIPLE = 16  # a matrix's row width PyTorch's int8 and int4 products need a multiple of
ACTIVATION_DTYPE = torch.bfloat16


@dataclass
class Int4Weight:
    """w = (q - 8) * scale + zero; q [N, K] uint8, scale and zero [N, K / 32] float32."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        expand = lambda t: t.repeat_interleave(GROUP, dim=1)  # noqa: E731
        return (self.q.float() - 8) * expand(self.scale) + expand(self.zero)


def int4_from_gguf(data: np.ndarray, qtype: int, rows: int, cols: int) -> Int4Weight | None:
    """The exact int4 form of a 4-bit GGUF tensor, or None for other types."""
    from gguf import GGMLQuantizationType  # the gguf package only where a GGUF file is converted

    if qtype == GGMLQuantizationType.Q4_K:
        return _from_q4_k(data.reshape(-1, 144), rows, cols)
    if qtype in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
        return _from_q4_0_1(data, qtype, rows, cols)
    return None


def _from_q4_k(blocks: np.ndarray, rows: int, cols: int) -> Int4Weight:
    n = blocks.shape[0]
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    from gguf.quants import Q4_K

    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(rows, cols)
    scale = (d * sc.astype(np.float32)).reshape(rows, cols // GROUP)
    zero = 8 * scale - (dmin * m.astype(np.float32)).reshape(rows, cols // GROUP)
    return Int4Weight(torch.from_numpy(q.copy()), torch.from_numpy(scale), torch.from_numpy(zero))


def _from_q4_0_1(data: np.ndarray, qtype: int, rows: int, cols: int) -> Int4Weight:
    from gguf import GGMLQuantizationType

    has_min = qtype == GGMLQuantizationType.Q4_1
    blocks = data.reshape(-1, 20 if has_min else 18)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    offset = blocks[:, 2:4].copy().view(np.float16).astype(np.float32) if has_min else np.zeros_like(d)
    qs = blocks[:, 4:] if has_min else blocks[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).reshape(rows, cols)  # low nibbles first, as in ggml
    scale = d.reshape(rows, cols // GROUP)
    zero = offset.reshape(rows, cols // GROUP) + (8 * scale if has_min else 0)  # Q4_0: w = d * (q - 8)
    return Int4Weight(torch.from_numpy(q.copy()), torch.from_numpy(scale), torch.from_numpy(zero))


class QuantizedLinear(nn.Module):
    """y = x @ W.T + b with W stored as int4 (bits=4) or int8 (bits=8); x is cast to bfloat16."""

    def __init__(self, in_features: int, out_features: int, bits: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        rows = _padded(out_features)
        if bits == 4:
            self.register_buffer("qweight", torch.empty(rows, in_features // 2, dtype=torch.uint8))
            self.register_buffer("qscales", torch.empty(in_features // GROUP, rows, 2, dtype=ACTIVATION_DTYPE))
        else:
            self.register_buffer("qweight", torch.empty(rows, in_features, dtype=torch.int8))
            self.register_buffer("qscales", torch.empty(rows, dtype=ACTIVATION_DTYPE))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=ACTIVATION_DTYPE)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(ACTIVATION_DTYPE)
        if self.bits == 4:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.qweight, GROUP, self.qscales)
        else:
            y = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.qscales)
        y = y[:, : self.out_features].reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def select_rows(linear: QuantizedLinear, rows: torch.Tensor) -> QuantizedLinear:
    """A QuantizedLinear computing only output rows `rows` of `linear` (same weights, re-packed)."""
    small = QuantizedLinear(linear.in_features, len(rows), linear.bits, bias=linear.bias is not None)
    picked = torch.cat([rows, rows[-1:].expand(_padded(len(rows)) - len(rows))])  # padding rows: any row
    if linear.bits == 4:
        # Packed blocks are independent: a leading run 0..m-1 of whole blocks is kept as packed, and only the
        # rows after it are unpacked and packed again (a restricted draft head keeps its first 64k rows).
        block = _int4_layout()[0]
        same = int((picked == torch.arange(len(picked))).cumprod(0).sum()) // block * block
        q = _unpack_rows_int4(linear.qweight, linear.in_features, picked[same:])
        rest = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1) if len(q) else q
        small.qweight = torch.cat([linear.qweight[:same], rest.to(linear.qweight.dtype)])
        small.qscales = linear.qscales.index_select(1, picked)
    else:
        small.qweight = linear.qweight.index_select(0, picked)
        small.qscales = linear.qscales.index_select(0, picked)
    if linear.bias is not None:
        small.bias = nn.Parameter(linear.bias.detach()[rows])
    return small


def _unpack_int4(packed: torch.Tensor, cols: int, layout: tuple[int, bool] | None = None) -> torch.Tensor:
    """The [rows, cols] 0..15 values that _convert_weight_to_int4pack_for_cpu packed.

    PyTorch's layout depends on the CPU it dispatches to: blocks of `block` rows laid out [cols, block / 2],
    pairing row j with row j + block / 2 (AVX-512: 64 rows, AVX2: 32) or neighbouring rows (no vector unit);
    a last, partial block always pairs neighbours. _int4_layout() finds which by packing a probe."""
    block, halves = layout or _int4_layout()
    rows = packed.shape[0]
    full = rows // block * block
    parts = []
    if full:
        blocks = packed[:full].reshape(-1, cols, block // 2)
        if halves:
            values = torch.cat([blocks & 15, blocks >> 4], dim=2)
        else:
            values = torch.stack([blocks & 15, blocks >> 4], dim=3).reshape(-1, cols, block)
        parts.append(values.permute(0, 2, 1).reshape(full, cols))
    if rows > full:
        tail = packed[full:].reshape(cols, (rows - full) // 2)
        parts.append(torch.stack([tail & 15, tail >> 4], dim=2).reshape(cols, rows - full).t())
    return torch.cat(parts)


def _unpack_rows_int4(packed: torch.Tensor, cols: int, rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` of the [rows, cols] 0..15 values of `packed`, unpacking only the blocks that hold them."""
    block = _int4_layout()[0]
    count = packed.shape[0]
    full = count // block * block
    pieces: dict[int, torch.Tensor] = {}
    for start in sorted({min(r // block * block, full) for r in rows.tolist()}):
        stop = count if start == full else start + block
        pieces[start] = _unpack_int4(packed[start:stop], cols)
    if not pieces:
        return packed.new_empty(0, cols)
    return torch.stack(
        [pieces[min(r // block * block, full)][r - min(r // block * block, full)] for r in rows.tolist()]
    )


_LAYOUTS = ((64, True), (32, True), (32, False))


@functools.cache
def _int4_layout() -> tuple[int, bool]:
    """(rows per block, whether a byte pairs row j with j + block / 2) of this machine's int4 packer."""
    probe = torch.randint(0, 16, (64, 32), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    for layout in _LAYOUTS:
        if torch.equal(_unpack_int4(packed, 32, layout).to(torch.int32), probe):
            return layout
    raise RuntimeError(f"unknown int4 packing layout for CPU capability {torch.backends.cpu.get_cpu_capability()}")


def _padded(rows: int) -> int:
    return -(-rows // 16) * 16  # the int4 packer wants rows in multiples of 16


def quantized_entries(parts: list[torch.Tensor | Int4Weight], mode: str) -> dict[str, torch.Tensor]:
    """Buffers of one QuantizedLinear from its row-stacked parts (q/k/v, gate/up, or a single matrix).

    int4: exact int4 when every part comes from a 4-bit GGUF tensor, int8 otherwise.
    int4-all: int4 everywhere, rounding non-4-bit parts to nearest (cheapest; meant for drafts).
    int8: int8 everywhere.
    A matrix whose rows are not a multiple of DENSE_BELOW_MULTIPLE wide stays dense ({"weight": ...}, in the
    activations' dtype): PyTorch's int8 product reads past such rows (NaN or a crash: Gemma 4's per-layer inputs of a
    tiny model, 8 wide).
    """
    width = parts[0].q.shape[1] if isinstance(parts[0], Int4Weight) else parts[0].shape[1]
    if width % DENSE_BELOW_MULTIPLE:
        dense = torch.cat([p.dequantize() if isinstance(p, Int4Weight) else p.float() for p in parts])
        return {"weight": dense.to(ACTIVATION_DTYPE)}
    if mode in ("int4", "int4-all") and all(isinstance(p, Int4Weight) for p in parts):
        q, scale, zero = (torch.cat([getattr(p, field) for p in parts]) for field in ("q", "scale", "zero"))
        return _pack_int4(Int4Weight(q, scale, zero))
    dense = torch.cat([p.dequantize() if isinstance(p, Int4Weight) else p.float() for p in parts])
    if mode == "int4-all" and dense.shape[1] % GROUP == 0:
        return _pack_int4(_int4_round_to_nearest(dense))
    return _pack_int8(dense)


def quantized_linear(pieces: Iterable[list[torch.Tensor | Int4Weight]], mode: str) -> dict[str, torch.Tensor]:
    """One QuantizedLinear's buffers from its consecutive row ranges (each one range's row-stacked parts), each
    range quantized as it comes (a 150k-row head is never held whole in float32)."""
    return concat_quantized([quantized_entries(parts, mode) for parts in pieces])


def concat_quantized(pieces: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One QuantizedLinear's buffers from those of consecutive row ranges (each a multiple of 64 rows but the
    last): the int4 packer works in independent blocks of at most 64 rows, so this equals packing all at once."""
    if len(pieces) == 1:
        return pieces[0]
    if "weight" in pieces[0]:  # kept dense
        return {"weight": torch.cat([p["weight"] for p in pieces])}
    int4 = pieces[0]["qweight"].dtype == torch.uint8
    return {
        "qweight": torch.cat([p["qweight"] for p in pieces]),
        "qscales": torch.cat([p["qscales"] for p in pieces], dim=1 if int4 else 0),
    }


def _int4_round_to_nearest(w: torch.Tensor) -> Int4Weight:
    groups = w.reshape(w.shape[0], -1, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp_min(1e-10)
    q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8)
    return Int4Weight(q.reshape(w.shape), scale, low + 8 * scale)


def _pack_int4(weight: Int4Weight) -> dict[str, torch.Tensor]:
    rows = weight.q.shape[0]
    pad = _padded(rows) - rows
    q, scale, zero = (F.pad(t, (0, 0, 0, pad)) for t in (weight.q, weight.scale, weight.zero))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    scales = torch.stack([scale.t(), zero.t()], dim=-1).to(ACTIVATION_DTYPE).contiguous()
    return {"qweight": packed, "qscales": scales}


def _pack_int8(w: torch.Tensor) -> dict[str, torch.Tensor]:
    pad = _padded(w.shape[0]) - w.shape[0]
    w = F.pad(w, (0, 0, 0, pad))
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-10)
    q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return {"qweight": q, "qscales": scale.to(ACTIVATION_DTYPE)}


def quantize_model(model, mode: str):
    """A quantized copy of an in-memory float Transformer (every linear, and a tied head, quantized)."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        owner, _, field = name.rpartition(".")
        if field == "weight" and isinstance(model.get_submodule(owner), nn.Linear):
            state |= {f"{owner}.{key}": value for key, value in quantized_entries([tensor], mode).items()}
        else:
            state[name] = tensor.to(ACTIVATION_DTYPE)
    if model.lm_head is None:
        state |= {f"lm_head.{key}": value for key, value in quantized_entries([model.embed.weight], mode).items()}
    with torch.device("meta"):
        quantized = transformer(model.config)
        use_quantized_linears(quantized, state)
    quantized.load_state_dict(state, assign=True, strict=True)
    return quantized.eval()


def use_quantized_linears(model: Transformer, state: dict[str, torch.Tensor]) -> None:
    """Swap each nn.Linear of `model` that `state` holds quantized for a QuantizedLinear, and make attention
    batch-invariant, so that greedy speculative decoding stays token-identical in this format."""

    def quantized(name: str, in_features: int, out_features: int) -> QuantizedLinear:
        bits = 8 if state[f"{name}.qweight"].dtype == torch.int8 else 4
        return QuantizedLinear(in_features, out_features, bits, bias=f"{name}.bias" in state)

    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and f"{name}.qweight" in state:
            parent, _, attr = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, attr, quantized(name, module.in_features, module.out_features))
    if model.lm_head is None and "lm_head.qweight" in state:  # tied embeddings: a quantized copy
        model.lm_head = quantized("lm_head", model.config.hidden_size, model.config.vocab_size)
    for block in model.layers:
        block.attn.batch_invariant = True
