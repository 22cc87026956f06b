"""A GGUF file's tensors as the native kernels take them, and the parts of a block every family builds the same way.

The shared build (gguf_native.py) and a family's own (family.py: `native_build`) put a block's matrices on the native
kernels from here: q/k/v and the output projection (`attention_matrices`), the MLP or a mixture's router and experts
(`mlp_matrices`), the norms (`layer_norms`), or a whole model whose blocks run on PyTorch with every matrix on the
kernels (`matrices_on_the_kernels`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..kernels import native
from ..kernels.linear import GGUFEmbedding, NativeLinear
from .config import ModelConfig
from .model import Transformer
from .weights import undo_rope_permutation

FLOAT_TYPES = {0: np.float32, 1: np.float16, 30: np.uint16}  # F32, F16, BF16 (bits): their element types


class FileTensors:
    """The GGUF file's tensors by name, as the native stack takes them: quantized rows (with their cached tile form),
    an expert's rows of a 3-D expert tensor, or float32 values."""

    def __init__(self, index: dict, data: dict[str, np.memmap]):
        """`data`: the GGUF file (key ""), the cached tile forms ("tiles") and requantized rows (COARSE)."""
        self.entries, self.files = index["tensors"], data
        self.tiles = data.get("tiles")

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def raw_rows(self, name: str, permute_heads: int | None = None) -> tuple[int, torch.Tensor]:
        entry = self.entries[name]
        qtype, rows = entry["type"], entry["shape"][-1] if len(entry["shape"]) > 1 else 1
        data = self.files[entry.get("file", "")]
        weight = torch.from_numpy(data[entry["offset"] : entry["offset"] + entry["bytes"]].reshape(rows, -1))
        if permute_heads is not None:
            weight = undo_rope_permutation(weight, permute_heads).contiguous()
        return qtype, weight

    def part(self, name: str, permute_heads: int | None = None) -> tuple[tuple[int, torch.Tensor], tuple | None]:
        """(the GGUF rows, their cached tile form or None)"""
        tile = self.entries[name].get("tile")
        cached = None
        if tile is not None and self.tiles is not None:
            cached = (tile["type"], torch.from_numpy(self.tiles[tile["offset"] : tile["offset"] + tile["bytes"]]))
        return self.raw_rows(name, permute_heads), cached

    def expert_rows(self, name: str, expert: int) -> tuple[int, torch.Tensor]:
        """Expert `expert`'s matrix of a 3-D expert tensor [experts, rows, row bytes] (tile forms made at load)."""
        entry = self.entries[name]
        count, rows = entry["shape"][2], entry["shape"][1]
        size = entry["bytes"] // count
        start = entry["offset"] + expert * size
        return entry["type"], torch.from_numpy(self.files[""][start : start + size].reshape(rows, -1))

    def linear(self, names: list[str], in_features: int, bias=None, heads=None) -> NativeLinear:
        made = [self.part(name, heads[i] if heads else None) for i, name in enumerate(names)]
        return NativeLinear(in_features, [m[0] for m in made], bias, [m[1] for m in made])

    def floats(self, name: str, permute_heads: int | None = None) -> torch.Tensor:
        entry = self.entries[name]
        raw = self.files[""][entry["offset"] : entry["offset"] + entry["bytes"]]
        values = torch.from_numpy(as_float32(raw, entry["type"]))
        return values if permute_heads is None else undo_rope_permutation(values, permute_heads).contiguous()


def matrices_on_the_kernels(
    config: ModelConfig,
    tensors: FileTensors,
    block_state: Callable[..., dict],
    extras: Callable[..., dict] | None = None,
) -> Transformer:
    """A model of a GGUF file whose blocks run on PyTorch with every matrix on the native kernels (Gemma 4, gpt-oss):
    `block_state(block, tensors, config, layer=i)` puts block i's matrices there and returns its other weights,
    `extras(model, tensors)` the same for the model's own parts beyond its embeddings, head and final norm."""
    with torch.device("meta"):
        model = Transformer(config)
    state = {"norm.weight": tensors.floats("output_norm.weight")}
    for i, block in enumerate(model.layers):
        state |= block_state(block, tensors, config, layer=i)
    embed_type, embed = tensors.raw_rows("token_embd.weight")
    model.embed = GGUFEmbedding(embed_type, embed, config.hidden_size)
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    model.lm_head = tensors.linear([head], config.hidden_size)
    state |= extras(model, tensors) if extras is not None else {}
    state |= {name: value for name, value in model.state_dict().items() if value.device.type != "meta"}  # biases
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval()


def attention_matrices(block, tensors: FileTensors, config: ModelConfig, layer: int, permuted: bool) -> None:
    """Layer `layer`'s q/k/v and output matrices on the native kernels (llama.cpp permuted some families' q and
    k rows: `permuted` undoes it); its attention per query, so decode and verify passes stay identical."""
    p, hidden = f"blk.{layer}.", config.hidden_size
    q_heads, k_heads = (config.num_heads, config.num_kv_heads) if permuted else (None, None)
    bias = None
    if config.qkv_bias:
        parts = [tensors.floats(p + "attn_q.bias", q_heads), tensors.floats(p + "attn_k.bias", k_heads)]
        bias = torch.cat([*parts, tensors.floats(p + "attn_v.bias")])
    if p + "attn_qkv.weight" in tensors:  # Phi-3: q, k and v in one matrix
        block.attn.wqkv = tensors.linear([p + "attn_qkv.weight"], hidden, bias)
    else:
        qkv = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
        block.attn.wqkv = tensors.linear(qkv, hidden, bias, [q_heads, k_heads, None])
    block.attn.wo = tensors.linear([p + "attn_output.weight"], config.num_heads * config.head_size)
    block.attn.batch_invariant = True  # decode and verify passes attend per query: greedy stays identical
    block.attn.attend_per_query = native.attention


def mlp_matrices(
    block,
    tensors: FileTensors,
    config: ModelConfig,
    layer: int,
    fused_gate_up: bool = False,
    block_index: int | None = None,
) -> None:
    """Layer `layer`'s MLP (or its router and each expert's rows of the 3-D expert tensors) on the native kernels
    (`fused_gate_up`: ffn_up holds the gates, then the ups; `block_index`: the file's block where it is not `layer`)."""
    p, hidden = f"blk.{layer if block_index is None else block_index}.", config.hidden_size
    if config.moe(layer):
        block.mlp.router = tensors.linear([p + "ffn_gate_inp.weight"], hidden)
        for e, expert in enumerate(block.mlp.experts):
            gate_up = [
                tensors.expert_rows(p + "ffn_gate_exps.weight", e),
                tensors.expert_rows(p + "ffn_up_exps.weight", e),
            ]
            expert.w_gate_up = NativeLinear(hidden, gate_up)
            expert.w_down = NativeLinear(
                config.expert_intermediate_size, [tensors.expert_rows(p + "ffn_down_exps.weight", e)]
            )
        return
    gate_up = [p + "ffn_up.weight"] if fused_gate_up else [p + "ffn_gate.weight", p + "ffn_up.weight"]
    block.mlp.w_gate_up = tensors.linear(gate_up, hidden)
    block.mlp.w_down = tensors.linear([p + "ffn_down.weight"], config.intermediate_size)


def layer_norms(tensors: FileTensors, config: ModelConfig, layer: int) -> dict[str, torch.Tensor]:
    p, s = f"blk.{layer}.", f"layers.{layer}."
    norms = {"attn_norm.weight": "attn_norm.weight", "mlp_norm.weight": "ffn_norm.weight"}
    if config.qk_norm:
        norms |= {"attn.q_norm.weight": "attn_q_norm.weight", "attn.k_norm.weight": "attn_k_norm.weight"}
    if config.post_norms:
        norms |= {"post_attn_norm.weight": "post_attention_norm.weight", "post_mlp_norm.weight": "post_ffw_norm.weight"}
    return {s + ours: tensors.floats(p + theirs) for ours, theirs in norms.items()}


def as_float32(raw: np.ndarray, qtype: int) -> np.ndarray:
    """The values of a float tensor's bytes (F32, F16, or BF16: the upper half of a float32)."""
    values = raw.view(FLOAT_TYPES[qtype])
    if qtype == 30:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)
