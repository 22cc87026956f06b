"""Tiny EAGLE-3 heads in the published checkpoint layouts (models/eagle3_checkpoint.py), drawn from a seed, for the
tiny targets of tests/architectures.py: written as config.json + model.safetensors, as the layouts store them
(test_eagle3.py reads them; tests/fixtures/eagle3/make.py converts them with llama.cpp's converter).

- `specforge`: SpecForge's LlamaForCausalLMEagle3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): the layer under
  `midlayer.`, no embeddings of its own (it looks tokens up in the target's), the default target layers, d2t;
- `vllm`: vLLM's and AngelSlim's Eagle3LlamaForCausalLM: the layer under `layers.0.`, embeddings of its own, a hidden
  size of its own (target_hidden_size: the target's), the target layers named in eagle_config,
  norm_before_residual (RedHat's speculators' variant of the residual).
Weights as tests/architectures.py draws them: matrices N(0, 1.5^2 / fan-in), embeddings N(0, 1), norms 1 + N(0, 0.1^2);
d2t maps the draft vocabulary onto every other target id from 0 (the stop token's kept last).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

LAYOUTS = ("specforge", "vllm")  # the layouts llama.cpp's converter takes (the fixtures of make.py)
FOLDER_LAYOUTS = (*LAYOUTS, "speculators")  # and RedHat's speculators layout, read from its folder


def head_config(layout: str, target: dict, draft_vocab: int, hidden: int | None = None) -> dict:
    """A head's config.json for a target of config `target` (a transformers config as a dict)."""
    hidden = hidden or target["hidden_size"]
    heads = 4 if layout == "specforge" else 2
    config = {
        "architectures": ["LlamaForCausalLMEagle3" if layout == "specforge" else "Eagle3LlamaForCausalLM"],
        "model_type": "llama", "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": heads // 2, "head_dim": hidden // heads,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
        "vocab_size": target["vocab_size"], "draft_vocab_size": draft_vocab, "tie_word_embeddings": False,
        "bos_token_id": target.get("bos_token_id"), "eos_token_id": target.get("eos_token_id"),
        "torch_dtype": "float32",
    }  # fmt: skip
    if layout == "vllm":
        layers = target["num_hidden_layers"]
        config |= {"target_hidden_size": target["hidden_size"], "norm_before_residual": True,
                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, layers // 2, layers - 1],
                                    "use_aux_hidden_state": True}}  # fmt: skip
    if layout == "speculators":  # the layer's config nested, the head's own fields and bookkeeping at the top
        layers = target["num_hidden_layers"]
        own = {key: config.pop(key) for key in ("draft_vocab_size", "torch_dtype")}
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "speculators_version": "0.3.0", "speculators_config": {"algorithm": "eagle3",
                  "default_proposal_method": "greedy", "verifier": {"architectures": ["LlamaForCausalLM"]}},
                  "transformer_layer_config": config | {"architectures": ["LlamaForCausalLM"]},
                  "target_hidden_size": target["hidden_size"], "norm_before_residual": False,
                  "eagle_aux_hidden_state_layer_ids": [0, layers // 2 - 1, layers - 2], **own}  # fmt: skip
    return config


def layer_config(config: dict) -> dict:
    """A head config's decoder-layer fields, wherever its layout keeps them."""
    return config | config.get("transformer_layer_config", {})


def draft_ids(vocab: int, draft_vocab: int) -> torch.Tensor:
    """The target id of each draft row: every other id from 0, the last row the last id (the stop token)."""
    ids = torch.arange(0, 2 * draft_vocab, 2)[:draft_vocab]
    ids[-1] = vocab - 1
    return ids


def head_tensors(layout: str, config: dict, seed: int = 11) -> dict[str, torch.Tensor]:
    """The head's tensors by the layout's names, drawn from `seed`."""
    config = layer_config(config)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv, dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    target_hidden = config.get("target_hidden_size", hidden)
    layer = "midlayer." if layout == "specforge" else "layers.0."
    shapes = {
        "fc.weight": (hidden, 3 * target_hidden),
        f"{layer}input_layernorm.weight": (hidden,), f"{layer}hidden_norm.weight": (hidden,),
        f"{layer}self_attn.q_proj.weight": (heads * dim, 2 * hidden),
        f"{layer}self_attn.k_proj.weight": (kv * dim, 2 * hidden),
        f"{layer}self_attn.v_proj.weight": (kv * dim, 2 * hidden),
        f"{layer}self_attn.o_proj.weight": (hidden, heads * dim),
        f"{layer}post_attention_layernorm.weight": (hidden,),
        f"{layer}mlp.gate_proj.weight": (inter, hidden), f"{layer}mlp.up_proj.weight": (inter, hidden),
        f"{layer}mlp.down_proj.weight": (hidden, inter),
        "norm.weight": (hidden,), "lm_head.weight": (config["draft_vocab_size"], hidden),
    }  # fmt: skip
    if layout in ("vllm", "speculators"):
        shapes["embed_tokens.weight"] = (config["vocab_size"], hidden)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        if len(shape) == 1:
            tensors[name] = 1.0 + 0.1 * noise
        elif "embed" in name:
            tensors[name] = noise
        else:
            tensors[name] = noise * 1.5 / math.sqrt(shape[1])
    ids = draft_ids(config["vocab_size"], config["draft_vocab_size"])
    tensors["d2t"] = ids - torch.arange(ids.numel())  # stored as offsets
    tensors["t2d"] = torch.zeros(config["vocab_size"], dtype=torch.bool).index_fill_(0, ids, True)
    return tensors


def write_head(folder: Path, layout: str, target: dict, draft_vocab: int = 96, hidden: int | None = None,
               seed: int = 11) -> Path:  # fmt: skip
    """A head of `layout` for the target of config `target`, written to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    config = head_config(layout, target, draft_vocab, hidden)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(head_tensors(layout, config, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def write_agreeing_head(folder: Path, target, draft_vocab: int | None = None) -> Path:
    """A head that drafts what `target` (a verispec Transformer whose layers are small corrections: tiny_model's
    residual_gain) would say after each token alone: its attention reads the token's own normed embedding (q = k =
    v = that half of its input, so each row attends to itself), the MLP adds nothing, and its output head is the
    target's. A bigram reading of the target, which the target accepts often: drafts that the verify pass keeps,
    chains and tree paths accepted in part."""
    config = target.config
    hidden, vocab = config.hidden_size, config.vocab_size
    draft_vocab = draft_vocab or vocab
    dims = {"hidden_size": hidden, "vocab_size": vocab, "num_hidden_layers": config.num_layers}
    head = head_config("specforge", dims, draft_vocab) | {"num_attention_heads": 4, "num_key_value_heads": 4,
                                                          "head_dim": hidden // 4}  # fmt: skip
    half = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)  # the embedding's half of the input
    zeros = torch.zeros
    ids = draft_ids(vocab, draft_vocab) if draft_vocab < vocab else torch.arange(vocab)
    tensors = {
        "fc.weight": zeros(hidden, 3 * hidden), "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden), "midlayer.self_attn.q_proj.weight": half.clone(),
        "midlayer.self_attn.k_proj.weight": half.clone(), "midlayer.self_attn.v_proj.weight": half.clone(),
        "midlayer.self_attn.o_proj.weight": torch.eye(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "midlayer.mlp.gate_proj.weight": zeros(2 * hidden, hidden),
        "midlayer.mlp.up_proj.weight": zeros(2 * hidden, hidden),
        "midlayer.mlp.down_proj.weight": zeros(hidden, 2 * hidden), "norm.weight": target.norm.weight.detach().clone(),
        "lm_head.weight": target.lm_head.weight.detach()[ids].clone(), "d2t": ids - torch.arange(ids.numel()),
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(head, indent=2))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
