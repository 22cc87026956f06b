"""A GGUF file's metadata as a ModelConfig, and the rule for each of its keys.

The rule: every key is either
- read: `{arch}.` keys that set part of the computation (READ; their meaning is llama.cpp's, src/llama-model.cpp);
- known harmless: `general.*`, `tokenizer.*` (the tokenizer is read separately), `quantize.*`, the `{arch}.`
  keys in HARMLESS (a count verispec takes from the tensors, a flag with no effect on a forward pass), and any
  key whose value is 0, false or empty (an option that is off: some converters write expert_count 0);
- or refused: the file is not loaded, and one line names the key and its value (an attention temperature, a
  yarn variant llama.cpp and transformers disagree on, a partial rotary, a split file, ...).
Which family a file is of: its `general.architecture`, in families.py; what a family computes otherwise than a Llama:
its entry there (family.py).
Where llama.cpp fixes a value by architecture rather than by key, so does verispec, in the family's entry: Gemma's
attention scale (1/sqrt(hidden / heads) for the 27B models, 46 or 62 layers, else 1/sqrt(head dim)), Gemma 2's
soft-capping defaults (50 and 30), the sliding layers' patterns (Gemma 2: every other layer from the first; Gemma 3:
five of six) and SmolLM3's layers without rotary (every fourth). One departure: a Phi-3 file's sliding window is applied
on every layer, as transformers applies it; llama.cpp leaves it off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..errors import ModelLoadError
from .config import ModelConfig
from .family import Family, Shape
from .rope import RopeScaling, yarn_attention_factor

READ = {
    "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length",
    "rope.dimension_count", "rope.freq_base", "rope.freq_base_swa", "rope.scaling.type", "rope.scaling.factor",
    "rope.scale_linear", "rope.scaling.original_context_length", "rope.scaling.attn_factor",
    "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "attention.sliding_window",
    "attention.sliding_window_pattern", "attn_logit_softcapping", "final_logit_softcapping", "attention.causal",
    "expert_count", "expert_used_count", "expert_feed_forward_length",
}  # fmt: skip
# Qwen3.5 (qwen35): its linear-attention layers' shape, which blocks are recurrent, the MTP blocks after the rest
READ |= {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
         "attention.recurrent_layers", "full_attention_interval", "nextn_predict_layers",
         "expert_shared_feed_forward_length"}  # fmt: skip
# Gemma 4: its sliding layers' own head size and rotary, the layers sharing keys and values, the per-layer inputs
READ |= {"attention.key_length_swa", "attention.value_length_swa", "rope.dimension_count_swa",
         "attention.shared_kv_layers", "embedding_length_per_layer_input"}  # fmt: skip
# the multimodal rotary's sections: text tokens' three positions are equal, so they turn as the plain rotary does
HARMLESS = {"vocab_size", "rope.scaling.finetuned", "rope.dimension_sections"}
_SHOWN = 8  # values of an array key shown in a refusal
HARMLESS_PREFIXES = ("general.", "tokenizer.", "quantize.")


class GGUFKeys:
    """The file's metadata under `{arch}.`, remembering which keys were read."""

    def __init__(self, fields, arch: str, where: str):
        self.fields, self.arch, self.where, self.read = fields, arch, where, set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        field = self.fields.get(f"{self.arch}.{key}")
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelLoadError(f"{self.where}: GGUF metadata lacks '{self.arch}.{key}'")
        return value

    def refuse(self, key: str, value: Any, why: str = "") -> ModelLoadError:
        because = why or "not understood by verispec's loader: it may change the computation"
        return ModelLoadError(
            f"{self.where}: GGUF key '{key}' = {value!r} ({self.arch}): {because}; refused rather than ignored "
            "(docs/models.md)"
        )

    def check_the_rest(self) -> None:
        for name, field in self.fields.items():
            if name.startswith(HARMLESS_PREFIXES) or name.startswith("GGUF."):
                continue
            short = name.removeprefix(f"{self.arch}.")
            if name.startswith(f"{self.arch}.") and (short in READ or short in HARMLESS):
                continue
            value = field.contents()
            if value in (0, False, "", []):
                continue  # an option that is off
            raise self.refuse(
                name, f"[{len(value)} values]" if isinstance(value, list) and len(value) > _SHOWN else value
            )


def config_from_gguf(
    fields, tensors: dict[str, tuple[int, ...]], floats: Callable[[str], list[float]], *, where: str, family: Family
) -> ModelConfig:
    """The config of a GGUF file of `family` (families.of_gguf): `fields` its metadata (GGUFReader.fields), `tensors`
    name -> shape (rows last, as GGUF lists them), `floats(name)` the values of a small float tensor."""
    keys = GGUFKeys(fields, str(fields["general.architecture"].contents()), where)
    if family.gguf_config is not None:  # a reader of its own
        config = family.gguf_config(keys, tensors, floats, lambda layers: _windows(keys, family, layers))
    else:
        config = _config(keys, family, tensors, floats)
    keys.check_the_rest()
    return config


def _config(k: GGUFKeys, family: Family, tensors: dict, floats) -> ModelConfig:
    arch = k.arch
    num_heads = int(k.require("attention.head_count"))
    hidden = int(k.require("embedding_length"))
    trailing = int(k.get(family.trailing_blocks_key, 0)) if family.trailing_blocks_key else 0
    layers = int(k.require("block_count")) - trailing  # the trailing (MTP) blocks come after the model's own
    head_dim = int(k.get("attention.key_length", hidden // num_heads))
    if int(k.get("attention.value_length", head_dim)) != head_dim:
        raise k.refuse(f"{arch}.attention.value_length", k.get("attention.value_length"), "not the key length")
    rotary = int(k.get("rope.dimension_count", head_dim))
    if rotary != head_dim and not family.partial_rotary:
        raise k.refuse(f"{arch}.rope.dimension_count", rotary, "partial rotary")
    if not k.get("attention.causal", True):
        raise k.refuse(f"{arch}.attention.causal", False, "verispec decodes causally only")
    context = int(k.get("context_length", 4096))
    theta = float(k.get("rope.freq_base", 10000.0))
    windows = _windows(k, family, layers)
    local_theta = float(k.get("rope.freq_base_swa", 10000.0 if family.local_rope else theta))
    values = dict(
        vocab_size=int(tensors["token_embd.weight"][1]),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=num_heads,
        num_kv_heads=int(k.get("attention.head_count_kv", num_heads)),
        intermediate_size=int(k.require("feed_forward_length")),
        rope_theta=theta,
        rms_norm_eps=float(k.get("attention.layer_norm_rms_epsilon", 1e-6)),
        qkv_bias="blk.0.attn_q.bias" in tensors,  # gpt-oss: on q, k and v (its output's: its own fields)
        tie_word_embeddings="output.weight" not in tensors,
        max_position_embeddings=context,
        head_dim=head_dim,
        rope_scaling=_scaling(k, tensors, floats=floats, context=context, theta=theta, dim=head_dim),
        rope_local_theta=local_theta if any(windows) and local_theta != theta else 0.0,
        layer_windows=windows if any(windows) else (),
        qk_norm=any(name.endswith(".attn_q_norm.weight") for name in tensors),  # qwen35's block 0 is recurrent
    )
    shape = Shape(layers=layers, head_dim=head_dim, windows=windows, rotary=rotary if rotary != head_dim else 0,
                  trailing=trailing, tensors=tensors)  # fmt: skip
    own = family.gguf_fields(k, shape) if family.gguf_fields is not None else {}
    count = int(k.get("expert_count", 0))
    if count and not own.get("num_experts"):
        raise k.refuse(f"{arch}.expert_count", count, "verispec computes a mixture of experts for qwen3moe only")
    return ModelConfig(**(values | family.block | own))


def _windows(k: GGUFKeys, family: Family, layers: int) -> tuple[int, ...]:
    """Per layer, the sliding window or 0, as llama.cpp sets it (and transformers, for Phi-3)."""
    window = int(k.get("attention.sliding_window", family.gguf_window_default))
    pattern = k.get("attention.sliding_window_pattern")
    if not window:
        return (0,) * layers
    if family.gguf_slides == "every":
        return (window,) * layers
    if family.gguf_slides != "pattern":
        raise k.refuse(f"{k.arch}.attention.sliding_window", window, f"llama.cpp's {k.arch} takes no sliding window")
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise k.refuse(f"{k.arch}.attention.sliding_window_pattern", pattern, "not one flag per layer")
        return tuple(window if flag else 0 for flag in pattern)
    n = int(pattern) if pattern is not None else family.gguf_pattern_default
    return tuple(window if n == 0 or i % n < n - 1 else 0 for i in range(layers))


def _scaling(k: GGUFKeys, tensors: dict, floats, context: int, theta: float, dim: int) -> RopeScaling | None:
    kind = k.get("rope.scaling.type")
    factor = k.get("rope.scaling.factor") or k.get("rope.scale_linear")
    attn_factor = float(k.get("rope.scaling.attn_factor", 1.0))
    if kind is None and factor:
        kind = "linear"  # llama.cpp's default type
    if kind not in (None, "none", "linear", "yarn"):
        raise k.refuse(f"{k.arch}.rope.scaling.type", kind, "verispec computes rope scaling none, linear and yarn")
    if attn_factor != 1.0 and kind != "yarn":
        raise k.refuse(f"{k.arch}.rope.scaling.attn_factor", attn_factor, "an attention factor without yarn")
    if "rope_freqs.weight" in tensors:
        if kind not in (None, "none") and factor and factor != 1.0:
            raise k.refuse(f"{k.arch}.rope.scaling.type", kind, "rope scaling on top of the rope_freqs tensor")
        return RopeScaling("factors", factors=tuple(floats("rope_freqs.weight")))
    if kind in (None, "none") or not factor or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear":
        return RopeScaling("linear", factor=float(factor))
    original = int(k.get("rope.scaling.original_context_length", context))
    attention = yarn_attention_factor(float(factor)) * attn_factor
    if not math.isfinite(attention):
        raise k.refuse(f"{k.arch}.rope.scaling.attn_factor", attn_factor, "not a finite number")
    beta_fast, beta_slow = k.get("rope.scaling.yarn_beta_fast", 32.0), k.get("rope.scaling.yarn_beta_slow", 1.0)
    return RopeScaling("yarn", factor=float(factor), original_max_position_embeddings=original,
                       beta_fast=float(beta_fast), beta_slow=float(beta_slow), attention_factor=attention)  # fmt: skip
