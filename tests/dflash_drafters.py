"""Tiny DFlash block drafters in the published checkpoint layout (models/dflash_checkpoint.py), drawn from a seed, for
the tiny targets of tests/architectures.py: written as config.json + model.safetensors as z-lab's DFlashDraftModel
checkpoints store them (z-lab/Qwen3-8B-DFlash-b16: `model_type` qwen3, the drafter's own fields `block_size`,
`num_target_layers` and `dflash_config` {mask_token_id, target_layer_ids}; tensors `fc`, `hidden_norm`, `norm` and
Qwen3 decoder layers under `layers.N.`, no embeddings and no output head: the target's). test_dflash.py reads them;
tests/fixtures/dflash/make.py converts them with llama.cpp's converter.

Weights as tests/architectures.py draws them: matrices N(0, 1.5^2 / fan-in), norms 1 + N(0, 0.1^2).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

MASK = 256  # the tiny vocabulary's mask token (the byte tokenizer's one merge: a token prompts never hold)


def drafter_config(target: dict, layers: int = 2, block_size: int = 8, target_layer_ids: list[int] | None = None,
                   heads: int = 2, kv_heads: int = 1, mask: int = MASK) -> dict:  # fmt: skip
    """A drafter's config.json for a target of config `target` (a transformers config as a dict): hidden size and
    vocabulary the target's (it embeds and reads out with the target's), its own heads and MLP."""
    hidden, depth = target["hidden_size"], target["num_hidden_layers"]
    ids = target_layer_ids if target_layer_ids is not None else [1, depth - 2][:layers]
    return {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
        "rms_norm_eps": 1e-6, "rope_theta": float(target.get("rope_theta", 10000.0)), "rope_scaling": None,
        "max_position_embeddings": 2048, "max_window_layers": layers, "use_sliding_window": False,
        "sliding_window": None, "layer_types": ["full_attention"] * layers, "tie_word_embeddings": False,
        "vocab_size": target["vocab_size"], "bos_token_id": target.get("bos_token_id"),
        "eos_token_id": target.get("eos_token_id"), "torch_dtype": "float32", "use_cache": True,
        "block_size": block_size, "num_target_layers": depth,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": ids},
    }  # fmt: skip


def drafter_tensors(config: dict, target_hidden: int | None = None, seed: int = 13) -> dict[str, torch.Tensor]:
    """The drafter's tensors by the layout's names, drawn from `seed`."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv, dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    features = len(config["dflash_config"]["target_layer_ids"]) * (target_hidden or hidden)
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (hidden, features), "hidden_norm.weight": (hidden,),
                                          "norm.weight": (hidden,)}  # fmt: skip
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * dim, hidden), p + "self_attn.k_proj.weight": (kv * dim, hidden),
            p + "self_attn.v_proj.weight": (kv * dim, hidden), p + "self_attn.o_proj.weight": (hidden, heads * dim),
            p + "self_attn.q_norm.weight": (dim,), p + "self_attn.k_norm.weight": (dim,),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        tensors[name] = 1.0 + 0.1 * noise if len(shape) == 1 else noise * 1.5 / math.sqrt(shape[1])
    return tensors


def write_drafter(folder: Path, target: dict, seed: int = 13, **shape) -> Path:
    """A drafter for the target of config `target`, written to `folder` (`shape`: drafter_config's arguments)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = drafter_config(target, **shape)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(drafter_tensors(config, seed=seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def write_agreeing_drafter(folder: Path, target, mask: int = MASK, block_size: int = 8) -> Path:
    """A drafter that drafts, at every position of its block, what `target` (a verispec Transformer whose layers are
    small corrections: tiny_model's residual_gain, its mask token's embedding zero) would say after the block's first
    token alone: the context's features are fused to zero (fc zero) and the mask rows embed to zero, so every key but
    the first token's is zero and every query is zero; each row's attention is the first token's value over the keys
    it sees, which the final norm scales back to the target's normed embedding of that token, read out by the
    target's head. Its first draft is the target's bigram reading, accepted often; the rest repeat it."""
    config = target.config
    hidden, heads = config.hidden_size, 4
    dims = {"hidden_size": hidden, "vocab_size": config.vocab_size, "num_hidden_layers": config.num_layers}
    raw = drafter_config(dims, layers=1, block_size=block_size, target_layer_ids=[0], heads=heads, kv_heads=heads,
                         mask=mask)  # fmt: skip
    zeros, eye = torch.zeros, torch.eye(hidden)
    tensors = {
        "fc.weight": zeros(hidden, hidden), "hidden_norm.weight": torch.ones(hidden),
        "norm.weight": target.norm.weight.detach().float().clone(),
        "layers.0.input_layernorm.weight": torch.ones(hidden),
        "layers.0.post_attention_layernorm.weight": torch.ones(hidden),
        "layers.0.self_attn.q_proj.weight": zeros(hidden, hidden), "layers.0.self_attn.k_proj.weight": eye.clone(),
        "layers.0.self_attn.v_proj.weight": eye.clone(), "layers.0.self_attn.o_proj.weight": eye.clone(),
        "layers.0.self_attn.q_norm.weight": torch.ones(hidden // heads),
        "layers.0.self_attn.k_norm.weight": torch.ones(hidden // heads),
        "layers.0.mlp.gate_proj.weight": zeros(2 * hidden, hidden),
        "layers.0.mlp.up_proj.weight": zeros(2 * hidden, hidden),
        "layers.0.mlp.down_proj.weight": zeros(hidden, 2 * hidden),
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
