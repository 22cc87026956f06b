"""Read a Hugging Face checkpoint folder: config.json, *.safetensors, tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import ModelLoadError
from .config import ModelConfig

SUPPORTED_MODEL_TYPES = {"llama", "qwen2", "mistral"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight",
    "q_bias": "self_attn.q_proj.bias",
    "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "o": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight",
    "down": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}


class HFSource:
    def __init__(self, folder: Path):
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise ModelLoadError(f"{folder}: not a model folder (no config.json) and not a GGUF file")
        try:
            raw = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{config_path}: unreadable ({exc})") from None
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(f"{folder}: model_type '{model_type}' is not supported")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        scaling = rope.get("rope_type", rope.get("type", "default"))
        if scaling != "default":  # the model computes plain rope: it would give other logits, silently
            raise ModelLoadError(f"{folder}: rope scaling '{scaling}' is not supported")
        self.config = _config_from_hf(raw)
        generation = folder / "generation_config.json"
        eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
        self.stop_ids = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.handles = [safe_open(str(f), framework="pt") for f in sorted(folder.glob("*.safetensors"))]
        if not self.handles:
            raise ModelLoadError(f"{folder}: no *.safetensors weight files")
        self.index = {key: h for h in self.handles for key in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)

    def fetch(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor | None:
        layer, _, short = name.partition(".")
        key = f"model.layers.{layer}.{_LAYER_NAMES[short]}" if short else _GLOBAL_NAMES[name]
        handle = self.index.get(key)
        if handle is None:
            return None
        return handle.get_tensor(key) if rows is None else handle.get_slice(key)[rows[0] : rows[1]]


def _config_from_hf(raw: dict) -> ModelConfig:
    num_heads = raw["num_attention_heads"]
    return ModelConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads", num_heads),
        intermediate_size=raw["intermediate_size"],
        rope_theta=raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        qkv_bias=raw.get("attention_bias", raw["model_type"] == "qwen2"),
        tie_word_embeddings=raw.get("tie_word_embeddings", False),
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        head_dim=raw.get("head_dim") or 0,
    )
