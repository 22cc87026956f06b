"""Assemble the native model's state dict from any checkpoint format.

A source (GGUF file, Hugging Face folder) only has to answer `fetch(name)` for the canonical names
below; fusing q/k/v and gate/up into single matrices happens here, once, for every format.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .config import ModelConfig

# canonical names: "embed", "norm", "lm_head", and per layer "{i}.attn_norm", "{i}.q", "{i}.k", "{i}.v",
# "{i}.q_bias", "{i}.k_bias", "{i}.v_bias", "{i}.o", "{i}.mlp_norm", "{i}.gate", "{i}.up", "{i}.down"
Fetch = Callable[[str], "torch.Tensor | None"]


def assemble_state_dict(
    config: ModelConfig, fetch: Fetch, dtype: torch.dtype, on_layer: Callable[[], None] = lambda: None
) -> dict[str, torch.Tensor]:
    def get(name: str) -> torch.Tensor:
        tensor = fetch(name)
        if tensor is None:
            raise KeyError(name)
        return tensor.to(dtype)

    state = {"embed.weight": get("embed"), "norm.weight": get("norm")}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = get("lm_head")
    for i in range(config.num_layers):
        prefix = f"layers.{i}"
        state[f"{prefix}.attn_norm.weight"] = get(f"{i}.attn_norm")
        state[f"{prefix}.attn.wqkv.weight"] = torch.cat([get(f"{i}.q"), get(f"{i}.k"), get(f"{i}.v")])
        if config.qkv_bias:
            biases = [get(f"{i}.{n}_bias") for n in "qkv"]
            state[f"{prefix}.attn.wqkv.bias"] = torch.cat(biases)
        state[f"{prefix}.attn.wo.weight"] = get(f"{i}.o")
        state[f"{prefix}.mlp_norm.weight"] = get(f"{i}.mlp_norm")
        state[f"{prefix}.mlp.w_gate_up.weight"] = torch.cat([get(f"{i}.gate"), get(f"{i}.up")])
        state[f"{prefix}.mlp.w_down.weight"] = get(f"{i}.down")
        on_layer()
    return state
