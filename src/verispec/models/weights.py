"""Assemble the native model's state dict from any checkpoint format, one part at a time.

A source (GGUF file, Hugging Face folder) only has to answer `fetch(name, rows)` for the canonical names
below; fusing q/k/v and gate/up into single matrices happens here, once, for every format.

Conversion streams: `state_dict_parts` yields the embedding, the head, the final norm and each layer as
separate parts, and matrices with more than CHUNK_ROWS rows (embeddings and heads of 150k-token
vocabularies) are dequantized and re-packed CHUNK_ROWS rows at a time, so converting a model never holds
more than one part plus one chunk in float32. Every fetched tensor is checked to be finite: a damaged file
is refused with the tensor's name before anything is cached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from ..errors import ModelLoadError
from .config import ModelConfig
from .quantize import ACTIVATION_DTYPE, Int4Weight, concat_quantized, quantized_entries

# canonical names: "embed", "norm", "lm_head", and per layer "{i}.attn_norm", "{i}.q", "{i}.k", "{i}.v",
# "{i}.q_bias", "{i}.k_bias", "{i}.v_bias", "{i}.o", "{i}.mlp_norm", "{i}.gate", "{i}.up", "{i}.down", and where
# the config has them "{i}.q_norm", "{i}.k_norm" (qk_norm), "{i}.post_attn_norm", "{i}.post_mlp_norm" (post_norms)
Rows = tuple[int, int] | None  # a [start, stop) range of a matrix's rows, or all of them
Fetch = Callable[[str, Rows], "torch.Tensor | None"]
FetchInt4 = Callable[[str, Rows], "Int4Weight | None"]
RowCount = Callable[[str], int]
CHUNK_ROWS = 16384  # a multiple of every int4 packing block (16, 32, 64 rows)


def canonical_names(config: ModelConfig) -> list[str]:
    """Every canonical name a model of `config` reads (a source checks that it holds nothing else)."""
    names = ["embed", "norm"] + ([] if config.tie_word_embeddings else ["lm_head"])
    per_layer = ["attn_norm", "q", "k", "v", "o", "mlp_norm"]
    per_layer += ["q_bias", "k_bias", "v_bias"] if config.qkv_bias else []
    per_layer += ["q_norm", "k_norm"] if config.qk_norm else []
    per_layer += ["post_attn_norm", "post_mlp_norm"] if config.post_norms else []
    for i in range(config.num_layers):
        names += [f"{i}.{name}" for name in per_layer + _mlp_names(config, i)]
    return names


def _mlp_names(config: ModelConfig, layer: int) -> list[str]:
    """A layer's MLP: gate, up, down; or a mixture's router and each expert's (expert{e}.gate, ...)."""
    if not config.moe(layer):
        return ["gate", "up", "down"]
    return ["router"] + [f"expert{e}.{n}" for e in range(config.num_experts) for n in ("gate", "up", "down")]


def assemble_state_dict(
    config: ModelConfig,
    fetch: Fetch,
    dtype: torch.dtype,
    quantization: str = "none",
    fetch_int4: FetchInt4 = lambda name, rows=None: None,
    row_count: RowCount | None = None,
) -> dict[str, torch.Tensor]:
    """The whole state dict at once (for sources small enough to hold; conversion streams the parts)."""
    state: dict[str, torch.Tensor] = {}
    for _, part in state_dict_parts(config, fetch, dtype, quantization, fetch_int4, row_count):
        state |= part
    return state


def state_dict_parts(
    config: ModelConfig,
    fetch: Fetch,
    dtype: torch.dtype,
    quantization: str = "none",
    fetch_int4: FetchInt4 = lambda name, rows=None: None,
    row_count: RowCount | None = None,
) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    """(part name, tensors) for "embed", "head", "norm" and "layer-NN"; with a quantization, linears become
    QuantizedLinear buffers (see quantize.py). `row_count(name)` lets big matrices be read in chunks."""
    if quantization != "none":
        dtype = ACTIVATION_DTYPE

    def chunks(name: str) -> list[Rows]:
        rows = row_count(name) if row_count else 0
        if rows <= CHUNK_ROWS:
            return [None]
        return [(start, min(start + CHUNK_ROWS, rows)) for start in range(0, rows, CHUNK_ROWS)]

    def get(name: str, rows: Rows = None) -> torch.Tensor:
        tensor = fetch(name, rows)
        if tensor is None:
            raise KeyError(name)
        _check_finite(name, tensor)
        return tensor.to(dtype)

    def get_int4(name: str, rows: Rows = None) -> Int4Weight | None:
        weight = fetch_int4(name, rows)
        if weight is not None:
            _check_finite(name, weight.scale, weight.zero)
        return weight

    def linear(prefix: str, names: list[str]) -> dict[str, torch.Tensor]:
        if quantization == "none":
            return {f"{prefix}.weight": torch.cat([get(n) for n in names])}
        pieces = chunks(names[0]) if len(names) == 1 else [None]
        packed = [
            quantized_entries([get_int4(n, rows) or get(n, rows) for n in names], quantization) for rows in pieces
        ]
        return {f"{prefix}.{key}": value for key, value in concat_quantized(packed).items()}

    yield "embed", {"embed.weight": torch.cat([get("embed", rows) for rows in chunks("embed")])}
    if not config.tie_word_embeddings:
        yield "head", linear("lm_head", ["lm_head"])
    elif quantization != "none":
        yield "head", linear("lm_head", ["embed"])  # the tied head gets its own quantized copy
    yield "norm", {"norm.weight": get("norm")}
    for i in range(config.num_layers):
        prefix = f"layers.{i}"
        state = {f"{prefix}.attn_norm.weight": get(f"{i}.attn_norm")}
        state |= linear(f"{prefix}.attn.wqkv", [f"{i}.q", f"{i}.k", f"{i}.v"])
        if config.qkv_bias:
            state[f"{prefix}.attn.wqkv.bias"] = torch.cat([get(f"{i}.{n}_bias") for n in "qkv"])
        state |= linear(f"{prefix}.attn.wo", [f"{i}.o"])
        if config.qk_norm:
            state[f"{prefix}.attn.q_norm.weight"] = get(f"{i}.q_norm")
            state[f"{prefix}.attn.k_norm.weight"] = get(f"{i}.k_norm")
        if config.post_norms:
            state[f"{prefix}.post_attn_norm.weight"] = get(f"{i}.post_attn_norm")
            state[f"{prefix}.post_mlp_norm.weight"] = get(f"{i}.post_mlp_norm")
        state[f"{prefix}.mlp_norm.weight"] = get(f"{i}.mlp_norm")
        if config.moe(i):
            state[f"{prefix}.mlp.router.weight"] = get(f"{i}.router")  # never quantized: it picks the experts
            for e in range(config.num_experts):
                expert = f"{prefix}.mlp.experts.{e}"
                state |= linear(f"{expert}.w_gate_up", [f"{i}.expert{e}.gate", f"{i}.expert{e}.up"])
                state |= linear(f"{expert}.w_down", [f"{i}.expert{e}.down"])
        else:
            state |= linear(f"{prefix}.mlp.w_gate_up", [f"{i}.gate", f"{i}.up"])
            state |= linear(f"{prefix}.mlp.w_down", [f"{i}.down"])
        yield f"layer-{i:03d}", state


def _check_finite(name: str, *tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(
                f"weight '{name}' holds NaN or infinite values: the model file is damaged (nothing was cached)"
            )
