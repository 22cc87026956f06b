"""Assemble the native model's state dict from any checkpoint format.

A source (GGUF file, Hugging Face folder) only has to answer `fetch(name)` for the canonical names
below; fusing q/k/v and gate/up into single matrices happens here, once, for every format.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .config import ModelConfig
from .quantize import ACTIVATION_DTYPE, Int4Weight, quantized_entries

# canonical names: "embed", "norm", "lm_head", and per layer "{i}.attn_norm", "{i}.q", "{i}.k", "{i}.v",
# "{i}.q_bias", "{i}.k_bias", "{i}.v_bias", "{i}.o", "{i}.mlp_norm", "{i}.gate", "{i}.up", "{i}.down"
Fetch = Callable[[str], "torch.Tensor | None"]
FetchInt4 = Callable[[str], "Int4Weight | None"]


def assemble_state_dict(
    config: ModelConfig,
    fetch: Fetch,
    dtype: torch.dtype,
    on_layer: Callable[[], None] = lambda: None,
    quantization: str = "none",
    fetch_int4: FetchInt4 = lambda name: None,
) -> dict[str, torch.Tensor]:
    """Native state dict; with a quantization, linears become QuantizedLinear buffers (see quantize.py)."""
    if quantization != "none":
        dtype = ACTIVATION_DTYPE

    def get(name: str) -> torch.Tensor:
        tensor = fetch(name)
        if tensor is None:
            raise KeyError(name)
        return tensor.to(dtype)

    def linear(prefix: str, names: list[str]) -> dict[str, torch.Tensor]:
        if quantization == "none":
            return {f"{prefix}.weight": torch.cat([get(n) for n in names])}
        parts = [fetch_int4(n) or get(n) for n in names]
        return {f"{prefix}.{key}": value for key, value in quantized_entries(parts, quantization).items()}

    state = {"embed.weight": get("embed"), "norm.weight": get("norm")}
    if not config.tie_word_embeddings:
        state |= linear("lm_head", ["lm_head"])
    elif quantization != "none":
        state |= linear("lm_head", ["embed"])  # the tied head gets its own quantized copy
    for i in range(config.num_layers):
        prefix = f"layers.{i}"
        state[f"{prefix}.attn_norm.weight"] = get(f"{i}.attn_norm")
        state |= linear(f"{prefix}.attn.wqkv", [f"{i}.q", f"{i}.k", f"{i}.v"])
        if config.qkv_bias:
            state[f"{prefix}.attn.wqkv.bias"] = torch.cat([get(f"{i}.{n}_bias") for n in "qkv"])
        state |= linear(f"{prefix}.attn.wo", [f"{i}.o"])
        state[f"{prefix}.mlp_norm.weight"] = get(f"{i}.mlp_norm")
        state |= linear(f"{prefix}.mlp.w_gate_up", [f"{i}.gate", f"{i}.up"])
        state |= linear(f"{prefix}.mlp.w_down", [f"{i}.down"])
        on_layer()
    return state
