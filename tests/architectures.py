"""Tiny random models of each architecture, made by transformers from a seed, and their logits by transformers:
the proofs of test_architectures.py, and the GGUF fixtures made from them (fixtures/architectures/make.py).

Each spec is a model_type and the config fields that exercise what the architecture adds (rope scaling, sliding
windows a 48-token sequence crosses, soft-caps that bite, layers without rotary). The weights are drawn again
from a seed (transformers' own init is too small to move the logits): embeddings N(0, 1), matrices N(0, 1.5^2 /
fan-in), norms 1 + N(0, 0.1^2) (Gemma's: N(0, 0.1^2), its norms add the 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

VOCAB = 258  # the fixture tokenizer's: 256 bytes, one merge, <eos>
SEQUENCE = 48
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
TINY = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
WINDOW = 8

_TEXT_SPECS: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "llama-linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    # llama3 with an original context of 16, so that at this head size low, high and ramped frequencies all occur
    "llama3": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    "llama-yarn": ("llama", {"max_position_embeddings": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                                            "original_max_position_embeddings": 16}}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    # four experts, two per token, and a dense layer between mixtures
    "qwen3-moe": ("qwen3_moe", {"num_hidden_layers": 3, "num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 32, "norm_topk_prob": True, "mlp_only_layers": [1]}),
    "mistral": ("mistral", {"sliding_window": WINDOW}),
    "phi3": ("phi3", {"sliding_window": WINDOW}),
    "smollm3": ("smollm3", {"num_hidden_layers": 4}),  # layer 3 has no rotary (every fourth)
    "gemma2": ("gemma2", {"sliding_window": WINDOW, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 3.0,
                          "final_logit_softcapping": 10.0}),
    # five local layers (their own rotary base) and a global one (linear scaling)
    "gemma3": ("gemma3_text", {"num_hidden_layers": 6, "sliding_window": WINDOW, "query_pre_attn_scalar": 24,
                               "rope_local_base_freq": 100.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    # three Gated DeltaNet layers (two key heads shared by four value heads) and a gated full-attention layer whose
    # rotary turns half of each head; the sequence (48) crosses no DeltaNet chunk (64): HYBRID_LONG does
    "qwen3.5": ("qwen3_5_text", {"num_hidden_layers": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                 "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.5}}),
    # the same with a mixture in every layer: four experts, two per token, and a shared expert beside them
    "qwen3.5-moe": ("qwen3_5_moe_text", {"num_hidden_layers": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                         "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 4,
                                         "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                         "shared_expert_intermediate_size": 48,
                                         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                             "partial_rotary_factor": 0.5}}),
    # sinks, biases, four experts (two per token) with the clamped SwiGLU (a limit of 1 that bites; gpt-oss's is 7), a
    # sliding layer then a global one, yarn; its experts' intermediate size is intermediate_size (SMALL's 128)
    "gpt-oss": ("gpt_oss", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW,
                            "layer_types": ["sliding_attention", "full_attention"], "swiglu_limit": 1.0}),
    # two sliding layers and a full one with wider heads (32), one kv head, values that are keys, a proportional
    # rotary turning a quarter of them; then a sliding and a full layer attending to layers 2's and 1's keys and
    # values with double-wide MLPs; per-layer inputs of 8; soft-capped logits
    "gemma4": ("gemma4_text", {"num_hidden_layers": 5, "sliding_window": WINDOW, "global_head_dim": 32,
                               "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                                               "sliding_attention", "full_attention"],
                               "num_global_key_value_heads": 1, "attention_k_eq_v": True, "num_kv_shared_layers": 2,
                               "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": VOCAB,
                               "use_double_wide_mlp": True, "final_logit_softcapping": 30.0,
                               "rope_parameters": {
                                   "full_attention": {"rope_type": "proportional", "rope_theta": 1e4,
                                                      "partial_rotary_factor": 0.25},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}}),
}  # fmt: skip
# Gemma 4's 26B-A4B form: the same with a mixture beside every layer's MLP (four experts of 32, two per token)
_TEXT_SPECS["gemma4-moe"] = ("gemma4_text", {**_TEXT_SPECS["gemma4"][1], "enable_moe_block": True, "num_experts": 4,
                                             "top_k_experts": 2, "moe_intermediate_size": 32})  # fmt: skip
HYBRID = ["qwen3.5", "qwen3.5-moe"]  # architectures with linear-attention layers: not on the native stack
# what the native stack does not run (sinks, biased experts, shared keys)
PYTORCH_ONLY = [*HYBRID, "gpt-oss", "gemma4", "gemma4-moe", "gemma4-vision"]
# multimodal checkpoints: the text model of text_config beside a one-layer vision tower verispec leaves unread
_WRAPPER_SPECS: dict[str, tuple[str, dict, dict, dict]] = {
    "mistral3": ("mistral3", {"model_type": "mistral", "sliding_window": None},
                 {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                  "num_attention_heads": 2, "head_dim": 16, "image_size": 28, "patch_size": 14},
                 {"image_token_index": 255}),
    "gemma3-vision": ("gemma3", {"model_type": "gemma3_text", "num_hidden_layers": 2, "sliding_window": WINDOW,
                                 "layer_types": ["sliding_attention", "full_attention"]},
                      {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
                      {"image_token_index": 255, "mm_tokens_per_image": 4, "boi_token_index": 253,
                       "eoi_token_index": 254}),
    "gemma4-vision": ("gemma4", {"model_type": "gemma4_text", **_TEXT_SPECS["gemma4"][1]},
                      {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16},
                      {"audio_config": None}),
}  # fmt: skip
NAMES = [*_TEXT_SPECS, *_WRAPPER_SPECS]


def _base(dims: dict) -> dict:
    return dict(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
                eos_token_id=VOCAB - 1, **dims)  # fmt: skip


def make_config(name: str, dims: dict = SMALL, **overrides):
    from transformers import AutoConfig

    if name in _TEXT_SPECS:
        model_type, fields = _TEXT_SPECS[name]
        config = AutoConfig.for_model(model_type, **(_base(dims) | fields | overrides))
    else:
        model_type, text, vision, fields = _WRAPPER_SPECS[name]
        config = AutoConfig.for_model(
            model_type, text_config=_base(dims) | text | overrides, vision_config=vision, **fields
        )
    config._attn_implementation = "eager"  # soft-capping needs it; the same for all
    if hasattr(config, "text_config"):
        config.text_config._attn_implementation = "eager"
    return config


def make_model(name: str, seed: int = 0, dims: dict = SMALL, half_exact: bool = False, **overrides):
    """The transformers model of a spec, weights drawn from `seed` (`half_exact`: rounded to float16 values, so that
    an F16 GGUF holds them exactly)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = make_config(name, dims, **overrides)
    torch.manual_seed(seed)
    wrapper = name in _WRAPPER_SPECS
    model = (AutoModelForImageTextToText if wrapper else AutoModelForCausalLM).from_config(config).eval()
    # their norms multiply by 1 + w (a DeltaNet's own norm, and Gemma 4's, by w)
    zero_centred = (name.startswith("gemma") and not name.startswith("gemma4")) or name in HYBRID
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if "norm" in key:
                p.copy_((0.0 if zero_centred and "linear_attn.norm" not in key else 1.0) + 0.1 * noise)
            elif p.dim() == 1 and name.startswith("gemma4") and key.endswith("scale"):  # its router's scales
                p.copy_(1.0 + 0.1 * noise)
            elif p.dim() == 1:
                p.copy_(0.1 * noise)
            elif "embed" in key:
                p.copy_(noise)
            else:
                # gpt-oss keeps its experts as [experts, in, out] (x @ W): their fan-in is the second dimension
                fan_in = p.shape[1] if p.dim() == 2 or name == "gpt-oss" else p[0].numel()
                p.copy_(noise * 1.5 / math.sqrt(fan_in))
            if half_exact:
                p.copy_(p.half().float())
        for key, b in model.named_buffers():
            if key.endswith("layer_scalar"):  # Gemma 4's, a buffer: drawn too, so that leaving it out shows
                b.copy_(1.0 + 0.2 * torch.randn(b.shape, generator=generator))
    return model


def tokenizer():
    """A byte-level BPE tokenizer: the 256 bytes, one merge (two spaces: a GGUF file without merges is read by
    transformers as a sentencepiece-scored vocabulary) and <eos> (id 257)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from verispec.testing import EOS_TEXT

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    space = "\u0120"
    vocab = {ch: i for i, ch in enumerate(alphabet)} | {space + space: 256}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[(space, space)]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([EOS_TEXT])
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=EOS_TEXT)


def save(model, folder: Path) -> Path:
    """The checkpoint (safetensors) and a tokenizer: a Hugging Face folder as verispec loads it."""
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer().save_pretrained(folder)
    return folder


def tokens(seed: int = 1, length: int = SEQUENCE) -> torch.Tensor:
    """Byte tokens (below the multimodal specs' image token ids, 253 and up)."""
    return torch.randint(0, 253, (1, length), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def reference_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """transformers' float32 logits [positions, vocab] of one sequence."""
    return model(input_ids=ids).logits[0].float()


def add_mtp(
    folder: Path, seed: int = 5, half_exact: bool = False, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """Give a saved qwen3.5 checkpoint an MTP layer in Qwen3.5's published layout (transformers has no MTP module: its
    Qwen3.5 loaders skip `mtp.*`): `mtp.fc` [hidden, 2 x hidden], the two input norms, a full-attention decoder layer
    `mtp.layers.0.*` shaped as the model's own, `mtp.norm`; drawn from `generator` (else one seeded with `seed`): norms
    0.1 N(0, 1) (around 0: Qwen3.5's multiply by 1 + w), matrices 1.5 / sqrt(fan-in) N(0, 1), rounded to float16
    values where `half_exact`; added to model.safetensors (where converters look), and `mtp_num_hidden_layers: 1` in
    config.json. Returns the tensors. (tests/fixtures/llamacpp/make_fixtures.py draws its fixtures' with it too.)"""
    import json

    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    own = f"model.layers.{config['layer_types'].index('full_attention')}."
    saved = load_file(folder / "model.safetensors")
    hidden = config["hidden_size"]
    shapes = {"mtp.fc.weight": (hidden, 2 * hidden), "mtp.pre_fc_norm_embedding.weight": (hidden,),
              "mtp.pre_fc_norm_hidden.weight": (hidden,)}  # fmt: skip
    shapes |= {
        f"mtp.layers.0.{key.removeprefix(own)}": tuple(v.shape) for key, v in saved.items() if key.startswith(own)
    }
    shapes["mtp.norm.weight"] = (hidden,)
    generator = generator or torch.Generator().manual_seed(seed)
    tensors = {}
    for key, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        tensors[key] = 0.1 * noise if len(shape) == 1 else 1.5 / shape[1] ** 0.5 * noise
        if half_exact:  # as make_model's
            tensors[key] = tensors[key].half().float()
    save_file(saved | tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config | {"mtp_num_hidden_layers": 1}, indent=2))
    return tensors


def make_assistant(seed: int = 7, ordered: bool = True, hidden: int = 32):
    """A gemma4_assistant for the "gemma4" spec's target (its hidden size 64): two layers (sliding, full) whose head
    shapes are the target's last sliding and full layers', ordered embeddings of 6 clusters of 43 tokens (2 chosen a
    step) or the whole head; weights drawn as make_model draws them (norms 1 + noise: Gemma 4's multiply by w)."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    target = _TEXT_SPECS["gemma4"][1]
    text = dict(_base(dict(SMALL, hidden_size=hidden, intermediate_size=2 * hidden)), model_type="gemma4_text",
                num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=WINDOW,
                global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=0, rope_parameters=target["rope_parameters"])  # fmt: skip
    config = Gemma4AssistantConfig(
        text_config=text,
        backbone_hidden_size=SMALL["hidden_size"],
        use_ordered_embeddings=ordered,
        num_centroids=6,
        centroid_intermediate_top_k=2,
    )
    config.text_config._attn_implementation = "eager"
    config._attn_implementation = "eager"
    model = Gemma4AssistantForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if "norm" in key:
                p.copy_(1.0 + 0.1 * noise)
            elif "embed" in key or "lm_head" in key:
                p.copy_(noise)
            else:
                p.copy_(noise * 1.5 / math.sqrt(p.shape[1]))
        if ordered:
            model.masked_embedding.token_ordering.copy_(torch.randperm(VOCAB, generator=generator))
    return model
