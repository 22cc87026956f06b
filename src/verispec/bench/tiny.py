"""In-process tiny models for the bench's tests and `--tiny` smoke runs: nothing is read from disk.

`hf_twin` rebuilds one of verispec's tiny models as a transformers Qwen2 model with the very same
weights, so `--peers hf` can run (and be compared) without model files.
"""

from __future__ import annotations

import torch

from ..models.loading import LoadedModel, resolve_dtype
from ..models.model import Transformer
from ..testing import tiny_pair


def tiny_models(dtype: str = "float32") -> tuple[LoadedModel, LoadedModel]:
    return tiny_pair(dtype=resolve_dtype(dtype))


def hf_twin(model: Transformer) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = model.config
    hf_config = Qwen2Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_size, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
    )  # fmt: skip
    twin = Qwen2ForCausalLM(hf_config)
    twin.load_state_dict(_hf_state(model), strict=not cfg.tie_word_embeddings)
    return twin.to(model.dtype).eval()


def _hf_state(model: Transformer) -> dict[str, torch.Tensor]:
    cfg, state = model.config, model.state_dict()
    q, kv = cfg.num_heads * cfg.head_size, cfg.num_kv_heads * cfg.head_size
    out = {"model.embed_tokens.weight": state["embed.weight"], "model.norm.weight": state["norm.weight"]}
    if "lm_head.weight" in state:
        out["lm_head.weight"] = state["lm_head.weight"]
    for i in range(cfg.num_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        out[theirs + "input_layernorm.weight"] = state[ours + "attn_norm.weight"]
        out[theirs + "post_attention_layernorm.weight"] = state[ours + "mlp_norm.weight"]
        for part in ("weight", "bias"):
            fused = state[ours + f"attn.wqkv.{part}"].split([q, kv, kv])
            for name, tensor in zip(("q_proj", "k_proj", "v_proj"), fused, strict=True):
                out[theirs + f"self_attn.{name}.{part}"] = tensor
        out[theirs + "self_attn.o_proj.weight"] = state[ours + "attn.wo.weight"]
        gate, up = state[ours + "mlp.w_gate_up.weight"].chunk(2)
        out[theirs + "mlp.gate_proj.weight"], out[theirs + "mlp.up_proj.weight"] = gate, up
        out[theirs + "mlp.down_proj.weight"] = state[ours + "mlp.w_down.weight"]
    return {name: tensor.clone() for name, tensor in out.items()}
