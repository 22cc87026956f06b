"""A Hugging Face config.json as a ModelConfig, by its family's rules (family.py), and the rule for each of its fields.

The rule: every field of config.json is either
- read: it sets part of the computation (the architecture's own fields: the shared ones below, the family's own in its
  entry's hooks);
- known harmless: it cannot change a forward pass (HARMLESS: token ids, dtypes, dropouts, generation defaults,
  bookkeeping), or it only describes what the loader never loads (the vision tower of a multimodal checkpoint);
- or refused: the model is not loaded, and one line names the field and its value.
A field outside the first two lists is refused unless its value is null, false, 0 or empty (a flag that is off).
So a rope type, a bias, an activation or an option verispec does not compute is never silently ignored. The
rotary dictionary (`rope_parameters`, or `rope_scaling` in older files) has its own list per rope type (rope.py).

Multimodal checkpoints (`gemma3`, `mistral3`, `qwen3_5`) are read as their `text_config`: verispec takes text only, so a
prompt never reaches the vision tower and projector, whose weights are left unread (hf_source.py). Which family a
config.json is of: families.py (`config_from_hf`).
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ModelLoadError
from .config import ModelConfig
from .family import Family, Shape
from .rope import RopeScaling, yarn_attention_factor

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


class JsonFields:
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


def read_hf_config(raw: dict, where: str, family: Family) -> ModelConfig:
    """The config of a config.json of `family` (its model_type the family's, or a wrapper of it); ModelLoadError for
    what verispec does not compute."""
    model_type = raw.get("model_type")
    if model_type in family.wrappers:
        outer = JsonFields(raw, where, model_type)
        text = outer.require("text_config")
        if text.get("model_type") not in family.wrappers[model_type]:
            raise outer.refuse("text_config.model_type", text.get("model_type"), "not a text model verispec runs")
        outer.check_the_rest(_VISION_FIELDS | {"tie_word_embeddings", "vocab_size"})
        raw = text
    fields = JsonFields(raw, where, raw.get("model_type", model_type))
    config = _config(fields, family)
    fields.check_the_rest(family.hf_harmless)
    return config


def _config(f: JsonFields, family: Family) -> ModelConfig:
    num_heads = f.require("num_attention_heads")
    hidden = f.require("hidden_size")
    layers = f.require("num_hidden_layers")
    head_dim = f.get("head_dim") or 0
    _check_activation(f, family)
    bias = f.get("attention_bias", False)
    if bias and not family.attention_bias:
        raise f.refuse("attention_bias", bias, "a bias on the attention's output projection is not computed")
    theta, scaling, local_theta = _rope(f, family, head_dim or hidden // num_heads)
    windows = _windows(f, family, layers) if family.windows else (0,) * layers
    shape = Shape(layers=layers, head_dim=head_dim or hidden // num_heads, windows=windows)
    own = family.hf_fields(f, shape) if family.hf_fields is not None else {}
    values = dict(
        vocab_size=f.require("vocab_size"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=num_heads,
        num_kv_heads=f.get("num_key_value_heads", num_heads),
        intermediate_size=f.require("intermediate_size"),
        rope_theta=theta,
        rms_norm_eps=f.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=f.get("tie_word_embeddings", family.tie_default),
        max_position_embeddings=f.get("max_position_embeddings", 4096),
        head_dim=head_dim,
        rope_scaling=scaling,
        rope_local_theta=local_theta if any(windows) else 0.0,
        layer_windows=windows if any(windows) else (),
        query_scale=_query_scale(f, family),
        attn_softcap=_softcap(f, "attn_logit_softcapping", family),
        final_softcap=_softcap(f, "final_logit_softcapping", family),
    )
    return ModelConfig(**(values | family.block | family.hf_block | own))


def _check_activation(f: JsonFields, family: Family) -> None:
    """The gated MLP's activation must be the family's, under config.json's name for it (Gemma's modules read
    hidden_activation first, older files carry both)."""
    *first, last = family.activation_fields
    activation = None
    for key in first:
        activation = activation or f.get(key)
    activation = activation or f.get(last, family.activation_name)
    f.read.update(family.activation_fields)
    if activation != family.activation_name:
        why = f"{family.name} is computed with {family.activation_name} only"
        raise f.refuse("hidden_act", activation, why)


def _query_scale(f: JsonFields, family: Family) -> float:
    """query_pre_attn_scalar ** -0.5 where the family scales queries by it (Gemma 2, 3), else 0 (head size ** -0.5;
    a family that scales otherwise says so in its block)."""
    if family.query_pre_attn_scalar is None:
        return 0.0
    return float(f.field("query_pre_attn_scalar", family.query_pre_attn_scalar)) ** -0.5


def _softcap(f: JsonFields, key: str, family: Family) -> float:
    """A soft-capping field: computed where the family computes it (transformers' default where config.json has none:
    Gemma 2 caps unless its config says null), read and left out where its modules do not apply it (Gemma 3's
    attention: neither transformers nor llama.cpp applies it), refused elsewhere."""
    if key in family.hf_harmless:
        return 0.0
    value = f.field(key, family.softcaps.get(key)) or 0.0
    if value and key not in family.softcaps:
        raise f.refuse(key, value, f"soft-capping is computed for Gemma only, not {family.name}")
    return float(value)


def _windows(f: JsonFields, family: Family, layers: int) -> tuple[int, ...]:
    """Per layer, the sliding window (0: full attention), as transformers' modules of this family apply it."""
    window = f.field("sliding_window", family.window_default)  # transformers' default where config.json has none
    if family.window_flag and not f.get("use_sliding_window", False):
        window = None  # transformers drops the window unless use_sliding_window is set
    if family.window_refused and window:
        raise f.refuse("sliding_window", window, family.window_refused)
    bidirectional = f.get("use_bidirectional_attention", False)
    if family.bidirectional is not None and bidirectional and bidirectional not in family.bidirectional:
        raise f.refuse("use_bidirectional_attention", bidirectional, "verispec decodes causally only")
    f.read |= {"max_window_layers", "sliding_window_pattern", "layer_types"}
    if not window:
        if family.window_needed and "sliding_attention" in (f.raw.get("layer_types") or []):
            raise f.refuse("sliding_window", window, family.window_needed)
        return (0,) * layers
    if family.slides_every_layer:
        return (int(window),) * layers
    types = f.raw.get("layer_types")
    if types is None:  # what transformers' config of this family derives
        slides = family.sliding_layers or _every_pattern_th_attends
        types = ["sliding_attention" if slides(f, i) else "full_attention" for i in range(layers)]
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise f.refuse("layer_types", types, "not one of sliding_attention / full_attention per layer")
    if family.last_layer_full:
        types = [*types[:-1], "full_attention"]
    return tuple(int(window) if kind == "sliding_attention" else 0 for kind in types)


def _every_pattern_th_attends(f: JsonFields, i: int) -> bool:
    """Every sliding_window_pattern-th layer (6 by default) attends fully, the others slide (Gemma 3's, Gemma 4's)."""
    return bool((i + 1) % f.raw.get("sliding_window_pattern", 6))


def _rope(f: JsonFields, family: Family, head_dim: int) -> tuple[float, RopeScaling | None, float]:
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
    if family.hf_rope is not None:
        return family.hf_rope(f, params)
    if f.raw.get("partial_rotary_factor", 1.0) != 1.0 and not family.partial_rotary:
        raise f.refuse("partial_rotary_factor", f.raw["partial_rotary_factor"], "partial rotary is not computed")
    nested = isinstance(params, dict) and ({"full_attention", "sliding_attention"} & set(params))
    if nested:
        glob, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    else:
        glob, local = params, {}
    theta = float(glob.get("rope_theta", f.raw.get("rope_theta", family.rope_theta_default)))
    if family.partial_rotary:
        # Qwen3.5's multimodal rotary: text tokens have equal time, height and width positions, so its interleaved
        # sections turn every frequency by the token's position, the plain rotary (on partial_rotary_factor of it)
        glob = {key: value for key, value in glob.items() if key not in ("mrope_section", "mrope_interleaved")}
        glob.pop("partial_rotary_factor", None)
    scaling = _scaling(f, glob, head_dim)
    local_theta = 0.0
    if family.local_rope:
        if local.get("rope_type", local.get("type", "default")) != "default":
            raise f.refuse("rope_parameters.sliding_attention", local, "the local layers' rotary is plain")
        local_theta = float(local.get("rope_theta", f.raw.get("rope_local_base_freq", 10_000.0)))
    return theta, scaling, local_theta


_UNSUPPORTED_ROPE = {
    "dynamic": "its frequencies change with the sequence's length",
    "longrope": "its frequencies switch at the original context, by the sequence's length in transformers and by "
    "the context size in llama.cpp",
}


def _scaling(f: JsonFields, params: dict, head_dim: int) -> RopeScaling | None:
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
