"""A Hugging Face config.json as a ModelConfig, and the rule for each of its fields.

The rule: every field of config.json is either
- read: it sets part of the computation (the architecture's own fields, below per model_type);
- known harmless: it cannot change a forward pass (HARMLESS: token ids, dtypes, dropouts, generation defaults,
  bookkeeping), or it only describes what the loader never loads (the vision tower of a multimodal checkpoint);
- or refused: the model is not loaded, and one line names the field and its value.
A field outside the first two lists is refused unless its value is null, false, 0 or empty (a flag that is off).
So a rope type, a bias, an activation or an option verispec does not compute is never silently ignored. The
rotary dictionary (`rope_parameters`, or `rope_scaling` in older files) has its own list per rope type (rope.py).

Multimodal checkpoints (`gemma3`, `mistral3`, `qwen3_5`) are read as their `text_config`: verispec takes text only, so a
prompt never reaches the vision tower and projector, whose weights are left unread (hf_source.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..errors import ModelLoadError
from .config import ModelConfig
from .rope import RopeScaling, yarn_attention_factor

# model_type -> the family whose rules apply
FAMILIES = {
    "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "phi3": "phi3",
    "smollm3": "smollm3", "gemma2": "gemma2", "gemma3_text": "gemma3", "gemma3": "gemma3", "mistral3": "mistral",
    "qwen3_5_text": "qwen35", "qwen3_5": "qwen35", "qwen3_5_moe_text": "qwen35moe", "qwen3_5_moe": "qwen35moe",
    "gpt_oss": "gptoss", "gemma4_text": "gemma4", "gemma4": "gemma4",
}  # fmt: skip
GEMMA = ("gemma2", "gemma3", "gemma4")
HYBRID = {"qwen35", "qwen35moe"}  # Qwen3.5's families: linear attention beside gated attention
# multimodal model_types: their text model is `text_config`, of one of these model_types
WRAPPERS = {"gemma3": {"gemma3_text"}, "mistral3": {"mistral", "llama"}, "qwen3_5": {"qwen3_5_text"},
            "qwen3_5_moe": {"qwen3_5_moe_text"}, "gemma4": {"gemma4_text"}}  # fmt: skip
# fields of a wrapper that only concern the vision part
_VISION_FIELDS = {
    "vision_config", "image_token_index", "image_token_id", "projector_hidden_act", "vision_feature_layer",
    "vision_feature_select_strategy", "multimodal_projector_bias", "spatial_merge_size", "mm_tokens_per_image",
    "boi_token_index", "eoi_token_index", "video_token_id", "vision_start_token_id", "vision_end_token_id",
    # Gemma 4's audio and video parts
    "audio_config", "audio_token_id", "boa_token_id", "eoa_token_id", "boi_token_id", "eoi_token_id",
    "vision_soft_tokens_per_image", "video_token_index", "audio_token_index", "initializer_range", "eoa_token_index",
}  # fmt: skip
HARMLESS = {
    # bookkeeping and dtypes
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "name_or_path",
    "auto_map", "tokenizer_class", "processor_class", "id2label", "label2id", "problem_type", "finetuning_task",
    "model_name", "_commit_hash", "_attn_implementation_autoset", "_sliding_window_pattern",
    # token ids and generation defaults (verispec takes stop tokens from generation_config.json and the tokenizer)
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "use_cache",
    "cache_implementation", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "task_specific_params", "prefix",
    # training only: initialisation, dropout, tensor-parallel slicing of the same products
    "initializer_range", "attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop",
    "pretraining_tp", "tf_legacy_loss", "use_bfloat16", "torchscript", "pruned_heads", "output_attentions",
    "output_hidden_states", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
    "add_cross_attention", "tie_encoder_decoder", "cross_attention_hidden_size", "router_aux_loss_coef",
    "output_router_logits",
}  # fmt: skip
# per rope type, the keys of its dictionary (beyond rope_type / type and rope_theta)
_ROPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
             "mscale_all_dim", "truncate"},
}  # fmt: skip


class _Fields:
    """config.json's fields, remembering which were read."""

    def __init__(self, raw: dict, where: str, model_type: str):
        self.raw, self.where, self.model_type, self.read = raw, where, model_type, set()

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value, or `default` when it is absent or null."""
        self.read.add(key)
        value = self.raw.get(key)
        return default if value is None else value

    def field(self, key: str, default: Any = None) -> Any:
        """The field's value (null included), or `default` when it is absent: where transformers' default is not
        its null (Gemma 2's soft-capping, Mistral's window)."""
        self.read.add(key)
        return self.raw.get(key, default)

    def require(self, key: str) -> Any:
        if self.raw.get(key) is None:
            raise ModelLoadError(f"{self.where}: config.json lacks '{key}'")
        return self.get(key)

    def refuse(self, key: str, value: Any, why: str = "") -> ModelLoadError:
        because = why or "not understood by verispec's loader: it may change the computation"
        return ModelLoadError(
            f"{self.where}: config.json field '{key}' = {value!r} ({self.model_type}): {because}; refused rather "
            "than ignored (docs/models.md)"
        )

    def check_the_rest(self, also_harmless: set[str] = frozenset()) -> None:
        for key, value in self.raw.items():
            if key in self.read or key in HARMLESS or key in also_harmless:
                continue
            if value is None or value is False or value == 0 or value in ([], {}, ""):
                continue  # a flag that is off
            raise self.refuse(key, value)


def config_from_hf(raw: dict, where: str) -> tuple[str, ModelConfig]:
    """(the family, the config) of a config.json; ModelLoadError for what verispec does not compute."""
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise ModelLoadError(
            f"{where}: model_type '{model_type}' is not supported (supported: {', '.join(sorted(FAMILIES))})"
        )
    outer = None
    if model_type in WRAPPERS:
        outer = _Fields(raw, where, model_type)
        text = outer.require("text_config")
        if text.get("model_type") not in WRAPPERS[model_type]:
            raise outer.refuse("text_config.model_type", text.get("model_type"), "not a text model verispec runs")
        outer.check_the_rest(_VISION_FIELDS | {"tie_word_embeddings", "vocab_size"})
        raw = text
    family = FAMILIES[model_type]
    fields = _Fields(raw, where, raw.get("model_type", model_type))
    config = _config(fields, family)
    fields.check_the_rest()
    return family, config


def _config(f: _Fields, family: str) -> ModelConfig:
    num_heads = f.require("num_attention_heads")
    hidden = f.require("hidden_size")
    layers = f.require("num_hidden_layers")
    head_dim = f.get("head_dim") or 0
    gemma = family in GEMMA
    activation = f.get("hidden_activation") if gemma else None
    activation = activation or f.get("hidden_act", "gelu_pytorch_tanh" if gemma else "silu")
    if gemma:
        f.read.add("hidden_act")  # Gemma's modules read hidden_activation, older files carry both
    wanted = "gelu_pytorch_tanh" if gemma else "silu"  # gpt-oss's config says silu; its experts clamp (gptoss below)
    if activation != wanted:
        raise f.refuse("hidden_act", activation, f"{family} is computed with {wanted} only")
    bias = f.get("attention_bias", False)
    if bias and family not in ("qwen2", "mistral", "gptoss"):  # qwen2's q/k/v always have a bias; mistral's never
        raise f.refuse("attention_bias", bias, "a bias on the attention's output projection is not computed")
    theta, scaling, local_theta = _rope(f, family, head_dim or hidden // num_heads)
    windows = _windows(f, family, layers) if family not in HYBRID else (0,) * layers
    experts = _experts(f, family, layers)
    hybrid = _hybrid(f, layers, head_dim or hidden // num_heads) if family in HYBRID else {}
    return ModelConfig(
        vocab_size=f.require("vocab_size"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=num_heads,
        num_kv_heads=f.get("num_key_value_heads", num_heads),
        intermediate_size=f.require("intermediate_size"),
        rope_theta=theta,
        rms_norm_eps=f.get("rms_norm_eps", 1e-6),
        qkv_bias=family == "qwen2" or (family == "gptoss" and bool(bias)),
        tie_word_embeddings=f.get("tie_word_embeddings", gemma or family == "smollm3"),
        max_position_embeddings=f.get("max_position_embeddings", 4096),
        head_dim=head_dim,
        rope_scaling=scaling,
        rope_local_theta=local_theta if any(windows) else 0.0,
        no_rope_layers=_no_rope_layers(f, family, layers),
        layer_windows=windows if any(windows) else (),
        qk_norm=family in ("qwen3", "qwen3moe", "gemma3", "gemma4") or family in HYBRID,
        post_norms=gemma,
        # Gemma 2/3's and Qwen3.5's norms multiply by 1 + w; Gemma 4's by w
        norm_offset=1.0 if family in ("gemma2", "gemma3") or family in HYBRID else 0.0,
        activation="gelu_tanh" if gemma else "swiglu_oai" if family == "gptoss" else "silu",
        embed_scale=gemma,
        query_scale=_query_scale(f, family),
        attn_softcap=_softcap(f, "attn_logit_softcapping", family, 50.0),
        final_softcap=_softcap(f, "final_logit_softcapping", family, 30.0),
        **experts,
        **hybrid,
        **(_gpt_oss(f, bool(bias)) if family == "gptoss" else {}),
        **(_gemma4(f, layers, windows) if family == "gemma4" else {}),
    )


def _query_scale(f: _Fields, family: str) -> float:
    """Gemma 2/3: query_pre_attn_scalar ** -0.5; Gemma 4: 1 (its q/k norms scale); others 0 (head size ** -0.5)."""
    if family == "gemma4":
        return 1.0
    return float(f.field("query_pre_attn_scalar", 256)) ** -0.5 if family in GEMMA else 0.0


def _gemma4(f: _Fields, layers: int, windows: tuple[int, ...]) -> dict:
    """Gemma 4: the full-attention layers' own head size and kv heads (per_layer_config, or global_head_dim and
    num_global_key_value_heads in files that predate it), the last num_kv_shared_layers layers attending to the keys
    and values of the last earlier layer of their kind, values that are keys (attention_k_eq_v) and normed, per-layer
    inputs, a scalar per layer, the shared layers' double-wide MLP."""
    dims, kv_heads = (
        [f.require("head_dim")] * layers,
        [f.get("num_key_value_heads", f.raw["num_attention_heads"])] * layers,
    )
    k_eq_v = bool(f.get("attention_k_eq_v", False))
    overrides = f.get("per_layer_config")
    if overrides is None:  # what transformers' config derives from the older fields
        full = {"head_dim": f.get("global_head_dim", 512)}
        if k_eq_v and f.get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = f.get("num_global_key_value_heads")
        overrides = {i: full for i in range(layers) if not windows[i]}
    f.read |= {"global_head_dim", "num_global_key_value_heads"}
    for layer, values in overrides.items():
        if not str(layer).isdigit() or int(layer) >= layers or set(values) - {"head_dim", "num_key_value_heads"}:
            raise f.refuse("per_layer_config", overrides, "only a layer's head_dim and num_key_value_heads are read")
        dims[int(layer)] = int(values.get("head_dim", dims[int(layer)]))
        kv_heads[int(layer)] = int(values.get("num_key_value_heads", kv_heads[int(layer)]))
    sources = _kv_sources(f, layers, windows)
    size = int(f.get("hidden_size_per_layer_input", 0))
    if size and int(f.get("vocab_size_per_layer_input", 0)) < int(f.raw["vocab_size"]):
        why = "a per-layer table smaller than the vocabulary: tokens past it would have no per-layer input"
        raise f.refuse("vocab_size_per_layer_input", f.get("vocab_size_per_layer_input"), why)
    moe = {}
    if f.get("enable_moe_block", False):  # every layer: the mixture beside the MLP
        moe = dict(num_experts=int(f.require("num_experts")), experts_per_token=int(f.require("top_k_experts")),
                   expert_intermediate_size=int(f.require("moe_intermediate_size")), moe_beside_mlp=True)  # fmt: skip
    return moe | dict(
        layer_head_dims=tuple(dims), layer_kv_heads=tuple(kv_heads), kv_sources=sources, k_eq_v=k_eq_v, v_norm=True,
        per_layer_input_size=size, per_layer_vocab=int(f.get("vocab_size_per_layer_input", 0)) if size else 0,
        layer_scalar=True,
        wide_mlp_layers=tuple(i for i in range(layers) if sources[i] != i) if f.get("use_double_wide_mlp") else (),
    )  # fmt: skip


def _kv_sources(f: _Fields, layers: int, windows: tuple[int, ...]) -> tuple[int, ...]:
    """Per layer, whose keys and values it attends to: the last num_kv_shared_layers layers share those of the last
    layer before them of the same kind (sliding or full), as transformers' Gemma 4 does."""
    shared = int(f.get("num_kv_shared_layers", 0))
    first = layers - shared
    if shared and (first <= 0 or {bool(w) for w in windows[first:]} - {bool(w) for w in windows[:first]}):
        raise f.refuse("num_kv_shared_layers", shared, "its shared layers need an earlier layer of their kind")
    return tuple(
        i if i < first else max(j for j in range(first) if bool(windows[j]) == bool(windows[i])) for i in range(layers)
    )


def _gpt_oss(f: _Fields, bias: bool) -> dict:
    """gpt-oss: sinks in every attention, biases on its output and on the mixture's router and experts (every layer a
    mixture, the softmax over the chosen experts' logits), the clamped SwiGLU."""
    alpha, limit = float(f.get("swiglu_alpha", 1.702)), float(f.get("swiglu_limit", 7.0))
    return dict(attn_sinks=True, o_bias=bias, moe_biases=True, router_softmax_topk=True, swiglu_alpha=alpha,
                swiglu_limit=limit)  # fmt: skip


def _hybrid(f: _Fields, layers: int, head_dim: int) -> dict:
    """Qwen3.5: which layers are Gated DeltaNets (layer_types, else every full_attention_interval-th layer attends),
    their shape, the attention's output gate and partial rotary, and the MTP layers."""
    types = f.get("layer_types")
    if types is None:
        interval = f.get("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    f.read.add("full_attention_interval")
    if len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
        raise f.refuse("layer_types", types, "not one of linear_attention / full_attention per layer")
    if f.get("mtp_use_dedicated_embeddings", False):
        raise f.refuse("mtp_use_dedicated_embeddings", True, "an MTP layer with embeddings of its own is not read")
    params = f.raw.get("rope_parameters") or f.raw.get("rope_scaling") or {}
    factor = params.get("partial_rotary_factor", f.raw.get("partial_rotary_factor", 0.25))
    return dict(
        linear_layers=tuple(i for i, kind in enumerate(types) if kind == "linear_attention"),
        linear_key_heads=int(f.require("linear_num_key_heads")),
        linear_key_dim=int(f.require("linear_key_head_dim")),
        linear_value_heads=int(f.require("linear_num_value_heads")),
        linear_value_dim=int(f.require("linear_value_head_dim")),
        linear_conv_kernel=int(f.get("linear_conv_kernel_dim", 4)),
        attn_output_gate=True,
        rotary_dim=int(head_dim * factor),
        mtp_layers=int(f.get("mtp_num_hidden_layers", 0)),
    )


def _experts(f: _Fields, family: str, layers: int) -> dict:
    """Qwen3-MoE's mixture: its size, and the layers left dense (mlp_only_layers, or off decoder_sparse_step);
    Qwen3.5-MoE's: every layer, the chosen experts' weights renormalized, and a shared expert beside them."""
    if family == "gptoss":
        count = int(f.require("num_local_experts"))
        return dict(num_experts=count, experts_per_token=int(f.require("num_experts_per_tok")),
                    expert_intermediate_size=int(f.require("intermediate_size")))  # fmt: skip
    if family == "qwen35moe":
        return dict(num_experts=int(f.require("num_experts")), experts_per_token=int(f.require("num_experts_per_tok")),
                    expert_intermediate_size=int(f.require("moe_intermediate_size")), norm_topk_prob=True,
                    shared_expert_intermediate_size=int(f.require("shared_expert_intermediate_size")))  # fmt: skip
    if family != "qwen3moe":
        return {}
    count = f.get("num_experts") or f.require("num_local_experts")  # transformers 5 saves the second name
    f.read.add("num_local_experts")
    only, step = f.get("mlp_only_layers", []), f.get("decoder_sparse_step", 1)
    return dict(num_experts=int(count), experts_per_token=int(f.require("num_experts_per_tok")),
                expert_intermediate_size=int(f.require("moe_intermediate_size")),
                norm_topk_prob=bool(f.get("norm_topk_prob", False)),
                dense_layers=tuple(i for i in range(layers) if i in only or (i + 1) % step))  # fmt: skip


def _softcap(f: _Fields, key: str, family: str, gemma2_default: float) -> float:
    """Gemma 2 caps unless its config says null (transformers' defaults); Gemma 3 caps its final logits where its
    config says so, and never its attention scores: transformers' Gemma 3 reads attn_logit_softcapping and does not
    apply it, nor does llama.cpp's gemma3 (the field is read and left out, as the GGUF path leaves it)."""
    value = f.field(key, gemma2_default if family == "gemma2" else None) or 0.0
    if family == "gemma3" and key == "attn_logit_softcapping":
        return 0.0
    if value and family not in GEMMA:
        raise f.refuse(key, value, f"soft-capping is computed for Gemma only, not {family}")
    return float(value)


def _no_rope_layers(f: _Fields, family: str, layers: int) -> tuple[int, ...]:
    """SmolLM3: the layers whose no_rope_layers entry is 0 (every no_rope_layer_interval-th by default)."""
    if family != "smollm3":
        return ()
    flags = f.get("no_rope_layers")
    if flags is None:
        interval = f.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    f.read.add("no_rope_layer_interval")
    if len(flags) != layers:
        raise f.refuse("no_rope_layers", flags, f"not one entry per layer ({layers})")
    return tuple(i for i, use in enumerate(flags) if not use)


def _windows(f: _Fields, family: str, layers: int) -> tuple[int, ...]:
    """Per layer, the sliding window (0: full attention), as transformers' modules of this family apply it."""
    # transformers' default where config.json has no sliding_window
    window = f.field(
        "sliding_window", None if family in ("llama", "phi3", "smollm3") else 512 if family == "gemma4" else 4096
    )
    if family in ("qwen2", "qwen3", "qwen3moe", "smollm3") and not f.get("use_sliding_window", False):
        window = None  # transformers drops the window unless use_sliding_window is set
    if family == "llama" and window:
        raise f.refuse("sliding_window", window, "Llama's modules take no sliding window")
    bidirectional = f.get("use_bidirectional_attention", False)
    if family in GEMMA and bidirectional and not (family == "gemma4" and bidirectional == "vision"):
        raise f.refuse("use_bidirectional_attention", bidirectional, "verispec decodes causally only")
    f.read |= {"max_window_layers", "sliding_window_pattern", "layer_types"}
    if not window:
        if family == "gemma3" and "sliding_attention" in (f.raw.get("layer_types") or []):
            raise f.refuse("sliding_window", window, "Gemma 3's sliding layers need their window")
        return (0,) * layers
    if family in ("mistral", "phi3"):
        return (int(window),) * layers  # every layer slides
    types = f.raw.get("layer_types")
    if types is None:
        types = [_default_layer_type(f, family, i) for i in range(layers)]
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise f.refuse("layer_types", types, "not one of sliding_attention / full_attention per layer")
    if family == "gemma4":  # transformers' Gemma 4 makes its last layer a full-attention one whatever the file says
        types = [*types[:-1], "full_attention"]
    return tuple(int(window) if kind == "sliding_attention" else 0 for kind in types)


def _default_layer_type(f: _Fields, family: str, i: int) -> str:
    """What transformers' config of this family derives when config.json has no layer_types."""
    if family in ("qwen2", "qwen3", "qwen3moe"):
        sliding = i >= f.raw.get("max_window_layers", 28)
    elif family == "smollm3":
        sliding = i in _no_rope_layers(f, family, f.raw["num_hidden_layers"])
    elif family in ("gemma2", "gptoss"):  # every other layer, from the first
        sliding = bool((i + 1) % 2)
    else:  # gemma3, gemma4
        sliding = bool((i + 1) % f.raw.get("sliding_window_pattern", 6))
    return "sliding_attention" if sliding else "full_attention"


def _rope(f: _Fields, family: str, head_dim: int) -> tuple[float, RopeScaling | None, float]:
    """(global theta, its scaling, the sliding layers' own theta or 0) from the rotary fields."""
    params = f.get("rope_parameters") or f.get("rope_scaling") or {}
    f.read |= {
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "rope_local_base_freq",
        "partial_rotary_factor",
        "original_max_position_embeddings",
    }  # the last: the pretraining context, read by scaled types
    if family == "gemma4":
        return _gemma4_rope(f, params)
    if f.raw.get("partial_rotary_factor", 1.0) != 1.0 and family not in HYBRID:
        raise f.refuse("partial_rotary_factor", f.raw["partial_rotary_factor"], "partial rotary is not computed")
    nested = isinstance(params, dict) and ({"full_attention", "sliding_attention"} & set(params))
    if nested:
        glob, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    else:
        glob, local = params, {}
    default_global = 1_000_000.0 if family == "gemma3" else 10_000.0
    theta = float(glob.get("rope_theta", f.raw.get("rope_theta", default_global)))
    if family in HYBRID:
        # Qwen3.5's multimodal rotary: text tokens have equal time, height and width positions, so its interleaved
        # sections turn every frequency by the token's position, the plain rotary (on partial_rotary_factor of it)
        glob = {key: value for key, value in glob.items() if key not in ("mrope_section", "mrope_interleaved")}
        glob.pop("partial_rotary_factor", None)
    scaling = _scaling(f, glob, head_dim)
    local_theta = 0.0
    if family == "gemma3":
        if local.get("rope_type", local.get("type", "default")) != "default":
            raise f.refuse("rope_parameters.sliding_attention", local, "the local layers' rotary is plain")
        local_theta = float(local.get("rope_theta", f.raw.get("rope_local_base_freq", 10_000.0)))
    return theta, scaling, local_theta


def _gemma4_rope(f: _Fields, params: dict) -> tuple[float, RopeScaling | None, float]:
    """Gemma 4: its full-attention layers' proportional rotary (rope.py), its sliding layers' plain one."""
    glob, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    glob = glob or {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}
    kinds = (glob.get("rope_type", "default"), local.get("rope_type", "default"))
    known = {"rope_type", "rope_theta", "partial_rotary_factor", "factor"}
    if kinds[0] not in ("proportional", "default") or set(glob) - known:
        raise f.refuse("rope_parameters.full_attention", glob, "verispec computes Gemma 4's proportional rotary")
    if kinds[1] != "default" or set(local) - {"rope_type", "rope_theta"}:
        raise f.refuse("rope_parameters.sliding_attention", local, "the sliding layers' rotary is plain")
    partial = 1.0 if kinds[0] == "default" else float(glob.get("partial_rotary_factor", 1.0))
    scaling = RopeScaling("proportional", factor=float(glob.get("factor", 1.0)), partial=partial)
    return float(glob.get("rope_theta", 10_000.0)), scaling, float(local.get("rope_theta", 10_000.0))


_UNSUPPORTED_ROPE = {
    "dynamic": "its frequencies change with the sequence's length",
    "longrope": "its frequencies switch at the original context, by the sequence's length in transformers and by "
    "the context size in llama.cpp",
}


def _scaling(f: _Fields, params: dict, head_dim: int) -> RopeScaling | None:
    where = "rope_parameters" if f.raw.get("rope_parameters") else "rope_scaling"
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _ROPE_KEYS:
        why = _UNSUPPORTED_ROPE.get(kind, "an unknown rope type")
        raise f.refuse(f"{where}.rope_type", kind, f"{why}; verispec computes default, linear, llama3 and yarn")
    for key, value in params.items():
        if key not in _ROPE_KEYS[kind] | {"rope_type", "type", "rope_theta", "partial_rotary_factor"}:
            raise f.refuse(f"{where}.{key}", value, f"not a parameter of rope type {kind} verispec reads")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise f.refuse("partial_rotary_factor", params["partial_rotary_factor"], "partial rotary is not computed")
    if kind == "default":
        return None
    factor = params.get("factor")
    original = f.raw.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    original = original or f.raw.get("max_position_embeddings", 4096)
    if kind == "linear":
        return RopeScaling("linear", factor=float(factor))
    if kind == "llama3":
        return RopeScaling("llama3", factor=float(factor), original_max_position_embeddings=int(original),
                           low_freq_factor=float(params["low_freq_factor"]),
                           high_freq_factor=float(params["high_freq_factor"]))  # fmt: skip
    factor = float(factor if factor is not None else f.raw.get("max_position_embeddings", 4096) / original)
    attention = params.get("attention_factor")
    if attention is None:
        attention = yarn_attention_factor(factor, params.get("mscale"), params.get("mscale_all_dim"))
    if not math.isfinite(attention):
        raise f.refuse("rope_parameters.attention_factor", attention, "not a finite number")
    return RopeScaling("yarn", factor=factor, original_max_position_embeddings=int(original),
                       beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                       truncate=bool(params.get("truncate", True)), attention_factor=float(attention))  # fmt: skip


def assistant_config(raw: dict, where: str) -> tuple[ModelConfig, int, tuple[int, int]]:
    """(its layers' config, the target's hidden size, (centroids, chosen per step) or (0, 0)) of a gemma4_assistant
    config.json: a Gemma 4 text model whose every layer reads its target's keys and values (kv_sources -1)."""
    outer = _Fields(raw, where, "gemma4_assistant")
    text = dict(outer.require("text_config"))
    if text.get("model_type") != "gemma4_text":
        raise outer.refuse("text_config.model_type", text.get("model_type"), "an assistant of Gemma 4's text model")
    layers = text.get("num_hidden_layers", 0)
    if text.get("num_kv_shared_layers", layers) not in (0, layers):
        raise outer.refuse(
            "text_config.num_kv_shared_layers", text["num_kv_shared_layers"], "every layer reads its target's"
        )
    for key in ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "use_double_wide_mlp", "enable_moe_block"):
        if text.get(key):
            raise outer.refuse(f"text_config.{key}", text[key], "an assistant has none (transformers checks the same)")
    family, config = config_from_hf({**text, "num_kv_shared_layers": 0}, where)
    config = replace(config, kv_sources=(-1,) * config.num_layers, tie_word_embeddings=True)
    ordered = bool(outer.get("use_ordered_embeddings", False))
    centroids = (int(outer.get("num_centroids", 2048)), int(outer.get("centroid_intermediate_top_k", 32)))
    if ordered and config.vocab_size % centroids[0]:
        raise outer.refuse("num_centroids", centroids[0], f"it does not divide the vocabulary ({config.vocab_size})")
    if not outer.get("tie_word_embeddings", True):
        raise outer.refuse("tie_word_embeddings", False, "an assistant's head is its embedding matrix")
    backbone = int(outer.require("backbone_hidden_size"))
    outer.check_the_rest()
    return config, backbone, centroids if ordered else (0, 0)
