"""Modules over GGUF weights as stored: a linear layer on the native kernels, and an embedding lookup.

Both hold uint8 views of the GGUF file's own blocks (memory-mapped; nothing is converted). A fused layer
(q/k/v, gate/up) keeps one part per source tensor, since the parts may be of different block types.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from . import native


class NativeLinear(nn.Module):
    """y = x @ W.T + b, W the row-stacked parts [(GGML type, [rows, row bytes] uint8)]; x and y float32.

    Parts whose type has a tile form (every quantized type with a kernel: native.TILE_OF) are repacked into it
    when the layer is built (a lossless re-arrangement, see csrc/vsk_tiles.c); the GGUF rows stay referenced for
    `select_rows`.
    """

    def __init__(
        self,
        in_features: int,
        parts: list[tuple[int, torch.Tensor]],
        bias: torch.Tensor | None = None,
        tiles: list[tuple[int, torch.Tensor] | None] | None = None,
    ):
        """`tiles`: per part, its tile form when already made (a cache), else None (made here if it has one)."""
        super().__init__()
        self.in_features = in_features
        self.source = parts
        self.kernels: list[tuple[int, int]] = []  # (kernel type, rows) per part
        for i, (qtype, weight) in enumerate(parts):
            tiled = tiles[i] if tiles and tiles[i] is not None else native.repack(qtype, weight, in_features)
            kernel_type, data = tiled if tiled is not None else (qtype, weight)
            self.register_buffer(f"part{i}", data, persistent=False)
            self.kernels.append((kernel_type, int(weight.shape[0])))
        self.out_features = sum(rows for _, rows in self.kernels)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        outputs = [
            native.linear(kernel_type, getattr(self, f"part{i}"), flat, rows)
            for i, (kernel_type, rows) in enumerate(self.kernels)
        ]
        y = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def parts(self) -> list[tuple[int, torch.Tensor, int, int]]:
        """Per part: (kernel type, data, bytes per row or 0 for a tile form, rows), as the native stack takes them."""
        out = []
        for i, (kernel_type, rows) in enumerate(self.kernels):
            data = getattr(self, f"part{i}")
            out.append((kernel_type, data, 0 if kernel_type in native.TILE_OF.values() else int(data.shape[1]), rows))
        return out

    def select_rows(self, rows: torch.Tensor, at_most_q4_0: bool = False) -> NativeLinear:
        """The same layer computing only output rows `rows` (a restricted draft head); one part only.
        `at_most_q4_0`: rows stored in more bytes per weight than Q4_0 are requantized to Q4_0 (a coarser copy:
        fewer bytes to read, slightly other values)."""
        if len(self.source) != 1:
            raise ValueError("select_rows needs a single-part layer")
        qtype, weight = self.source[0]
        bias = None if self.bias is None else self.bias.detach()[rows]
        values, size = native.QUANT_TYPES[qtype]
        q4_values, q4_size = native.QUANT_TYPES[native.Q4_0]
        if at_most_q4_0 and size * q4_values > q4_size * values and self.in_features % q4_values == 0:
            coarse = native.requantize_q4_0(qtype, weight, rows, self.in_features)
            return NativeLinear(self.in_features, [(native.Q4_0, coarse)], bias)
        return NativeLinear(self.in_features, [(qtype, weight[rows].contiguous())], bias)


class GGUFEmbedding(nn.Module):
    """Token embeddings looked up in a GGUF matrix: only the rows asked for are dequantized (float32), by the
    native library where it has the type (the `gguf` package's bits, faster), else by the `gguf` package."""

    def __init__(self, qtype: int, weight: torch.Tensor, dim: int):
        super().__init__()
        self.qtype = qtype
        self.register_buffer("weight_blocks", weight, persistent=False)
        self.dim = dim

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if native.has_rows_to_floats(self.qtype):
            ids = tokens.reshape(-1).cpu()
            if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < self.weight_blocks.shape[0]:
                raise IndexError("token id out of the embedding's range")
            rows = native.rows_to_floats(int(self.qtype), self.weight_blocks, ids, self.dim)
            return rows.reshape(*tokens.shape, self.dim)
        ids = tokens.reshape(-1).cpu().numpy()
        rows = self.weight_blocks.numpy()[ids]
        from gguf import GGMLQuantizationType  # the package only where the native library lacks the type
        from gguf.quants import dequantize

        values = dequantize(rows, GGMLQuantizationType(self.qtype)).reshape(len(ids), self.dim)
        values = values.astype(np.float32, copy=False)
        return torch.from_numpy(values).reshape(*tokens.shape, self.dim)


class NativeRMSNorm(nn.Module):
    """RMSNorm (model.RMSNorm's weight and eps) computed by the native library, in the stack's order: a
    model's final norm in one call instead of five PyTorch ops."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.float(), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return native.rms_norm(x, self.weight, self.eps).to(x.dtype)
