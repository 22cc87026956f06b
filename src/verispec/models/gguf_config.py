"""A GGUF file's metadata as a ModelConfig, and the rule for each of its keys.

The rule: every key is either
- read: `{arch}.` keys that set part of the computation (READ; their meaning is llama.cpp's, src/llama-model.cpp);
- known harmless: `general.*`, `tokenizer.*` (the tokenizer is read separately), `quantize.*`, the `{arch}.`
  keys in HARMLESS (a count verispec takes from the tensors, a flag with no effect on a forward pass), and any
  key whose value is 0, false or empty (an option that is off: some converters write expert_count 0);
- or refused: the file is not loaded, and one line names the key and its value (an attention temperature, a
  yarn variant llama.cpp and transformers disagree on, a partial rotary, a split file, ...).
Where llama.cpp fixes a value by architecture rather than by key, so does verispec: Gemma's attention scale
(1/sqrt(hidden / heads) for the 27B models, 46 or 62 layers, else 1/sqrt(head dim)), Gemma 2's soft-capping
defaults (50 and 30), the sliding layers' patterns (Gemma 2: every other layer from the first; Gemma 3: five of
six) and SmolLM3's layers without rotary (every fourth). One departure: a Phi-3 file's sliding window is applied
on every layer, as transformers applies it; llama.cpp leaves it off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..errors import ModelLoadError
from .config import ModelConfig
from .rope import RopeScaling, yarn_attention_factor

ARCHITECTURES = (
    "llama", "mistral", "mistral3", "qwen2", "qwen3", "qwen3moe", "phi3", "smollm3", "gemma2", "gemma3", "qwen35",
    "qwen35moe", "gpt-oss", "gemma4",
)  # fmt: skip
HYBRID = {"qwen35", "qwen35moe"}  # Qwen3.5: linear attention beside gated attention (qwen35moe: with experts)
# llama.cpp's converter interleaves each head's rotary halves of q and k for these (its "normal" rope type)
PERMUTED = {"llama", "mistral", "mistral3", "smollm3"}
GEMMA = {"gemma2", "gemma3"}
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


class _Keys:
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
    fields, tensors: dict[str, tuple[int, ...]], floats: Callable[[str], list[float]], where: str
) -> tuple[str, ModelConfig]:
    """(architecture, config) of a GGUF file: `fields` its metadata (GGUFReader.fields), `tensors` name -> shape
    (rows last, as GGUF lists them), `floats(name)` the values of a small float tensor."""
    arch_field = fields.get("general.architecture")
    arch = str(arch_field.contents()) if arch_field is not None else None
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{where}: architecture '{arch}' is not supported (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    keys = _Keys(fields, arch, where)
    config = _gemma4(keys, tensors, floats) if arch == "gemma4" else _config(keys, arch, tensors, floats)
    keys.check_the_rest()
    return arch, config


def _config(k: _Keys, arch: str, tensors: dict, floats) -> ModelConfig:
    num_heads = int(k.require("attention.head_count"))
    hidden = int(k.require("embedding_length"))
    mtp = int(k.get("nextn_predict_layers", 0)) if arch in HYBRID else 0
    layers = int(k.require("block_count")) - mtp  # the MTP blocks come after the model's own
    head_dim = int(k.get("attention.key_length", hidden // num_heads))
    if int(k.get("attention.value_length", head_dim)) != head_dim:
        raise k.refuse(f"{arch}.attention.value_length", k.get("attention.value_length"), "not the key length")
    rotary = int(k.get("rope.dimension_count", head_dim))
    if rotary != head_dim and arch not in HYBRID:
        raise k.refuse(f"{arch}.rope.dimension_count", rotary, "partial rotary")
    if not k.get("attention.causal", True):
        raise k.refuse(f"{arch}.attention.causal", False, "verispec decodes causally only")
    context = int(k.get("context_length", 4096))
    theta = float(k.get("rope.freq_base", 10000.0))
    windows = _windows(k, arch, layers)
    gemma = arch in GEMMA
    big_gemma = (arch, layers) in {("gemma2", 46), ("gemma3", 62)}  # llama.cpp's test for the 27B models
    local_theta = float(k.get("rope.freq_base_swa", 10000.0 if arch == "gemma3" else theta))
    return ModelConfig(
        vocab_size=int(tensors["token_embd.weight"][1]),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=num_heads,
        num_kv_heads=int(k.get("attention.head_count_kv", num_heads)),
        intermediate_size=int(k.require("feed_forward_length")),
        rope_theta=theta,
        rms_norm_eps=float(k.get("attention.layer_norm_rms_epsilon", 1e-6)),
        qkv_bias="blk.0.attn_q.bias" in tensors,  # gpt-oss: on q, k and v (its output's: _gpt_oss)
        tie_word_embeddings="output.weight" not in tensors,
        max_position_embeddings=context,
        head_dim=head_dim,
        rope_scaling=_scaling(k, tensors, floats=floats, context=context, theta=theta, dim=head_dim),
        rope_local_theta=local_theta if any(windows) and local_theta != theta else 0.0,
        no_rope_layers=tuple(i for i in range(layers) if (i + 1) % 4 == 0) if arch == "smollm3" else (),
        layer_windows=windows if any(windows) else (),
        qk_norm=any(name.endswith(".attn_q_norm.weight") for name in tensors),  # qwen35's block 0 is recurrent
        post_norms=gemma,
        activation="gelu_tanh" if gemma else "swiglu_oai" if arch == "gpt-oss" else "silu",
        embed_scale=gemma,
        query_scale=(hidden / num_heads if big_gemma else head_dim) ** -0.5 if gemma else 0.0,
        attn_softcap=float(k.get("attn_logit_softcapping", 50.0)) if arch == "gemma2" else 0.0,
        final_softcap=float(k.get("final_logit_softcapping", 30.0 if arch == "gemma2" else 0.0)) if gemma else 0.0,
        **_experts(k, arch, layers, tensors),
        **(_hybrid(k, layers, rotary if rotary != head_dim else 0, mtp) if arch in HYBRID else {}),
        **(_gpt_oss(tensors) if arch == "gpt-oss" else {}),
    )


def _gemma4(k: _Keys, tensors: dict, floats) -> ModelConfig:
    """Gemma 4 as llama.cpp's converter writes it: the full-attention layers' head size in key_length, the sliding
    ones' in key_length_swa (each layer's kv heads one value or one per layer), the proportional rotary of the full
    layers as rope_freqs (1e30 for the dimensions it does not turn; all of a head: dimension_count), the last
    shared_kv_layers layers reading earlier ones' keys and values, values that are keys where a full layer has no
    attn_v, per-layer inputs, a scalar per layer (layer_output_scale), the wider MLPs in feed_forward_length's list.
    Its norms multiply by w, as stored."""
    heads, hidden, layers = int(k.require("attention.head_count")), int(k.require("embedding_length")), int(
        k.require("block_count"))  # fmt: skip
    windows = _windows(k, "gemma4", layers)
    dims = {0: int(k.require("attention.key_length")), 1: int(k.get("attention.key_length_swa", 0))}
    for key, size in (("attention.value_length", dims[0]), ("attention.value_length_swa", dims[1])):
        if int(k.get(key, size)) != size:
            raise k.refuse(f"gemma4.{key}", k.get(key), "values of another size than keys")
    for key, size in (("rope.dimension_count", dims[0]), ("rope.dimension_count_swa", dims[1])):
        if int(k.get(key, size)) != size:
            raise k.refuse(f"gemma4.{key}", k.get(key), "a rotary on part of the head (llama.cpp's partial rope)")
    kv = k.require("attention.head_count_kv")
    kv = [int(v) for v in kv] if isinstance(kv, list) else [int(kv)] * layers
    sources = _shared_sources(k, windows)
    ff = k.require("feed_forward_length")
    ff = [int(v) for v in ff] if isinstance(ff, list) else [int(ff)] * layers
    if len(kv) != layers or len(ff) != layers or set(ff) - {ff[0], 2 * ff[0]}:
        raise k.refuse("gemma4.feed_forward_length", ff, "not one size per layer, twice it where widened")
    own_full = [i for i in range(layers) if not windows[i] and sources[i] == i]
    without_v = {i for i in own_full if f"blk.{i}.attn_v.weight" not in tensors}
    if without_v not in (set(), set(own_full)):
        raise k.refuse("gemma4 tensors", sorted(without_v), "some full-attention layers with attn_v, some without")
    theta = float(k.get("rope.freq_base", 10000.0))
    factors = tuple(floats("rope_freqs.weight")) if "rope_freqs.weight" in tensors else ()
    size = int(k.get("embedding_length_per_layer_input", 0))
    if size and int(tensors["per_layer_token_embd.weight"][1]) < int(tensors["token_embd.weight"][1]):
        raise k.refuse("gemma4.embedding_length_per_layer_input", size, "a per-layer table smaller than the vocabulary")
    return ModelConfig(
        vocab_size=int(tensors["token_embd.weight"][1]), hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv[0], intermediate_size=ff[0], rope_theta=theta,
        rms_norm_eps=float(k.get("attention.layer_norm_rms_epsilon", 1e-6)), tie_word_embeddings="output.weight" not in
        tensors, max_position_embeddings=int(k.get("context_length", 4096)), head_dim=dims[1] or dims[0],
        rope_scaling=RopeScaling("factors", factors=factors) if factors else None,
        rope_local_theta=float(k.get("rope.freq_base_swa", 10000.0)), layer_windows=windows, qk_norm=True,
        post_norms=True, activation="gelu_tanh", embed_scale=True, query_scale=1.0,
        final_softcap=float(k.get("final_logit_softcapping", 0.0)),
        layer_head_dims=tuple(dims[bool(w)] for w in windows), layer_kv_heads=tuple(kv), kv_sources=sources,
        k_eq_v=bool(without_v), v_norm=True, per_layer_input_size=size,
        per_layer_vocab=int(tensors["per_layer_token_embd.weight"][1]) if size else 0,
        layer_scalar="blk.0.layer_output_scale.weight" in tensors,
        wide_mlp_layers=tuple(i for i in range(layers) if ff[i] != ff[0]), **_gemma4_mixture(k),
    )  # fmt: skip


def _gemma4_mixture(k: _Keys) -> dict:
    """The 26B-A4B's mixture beside every layer's MLP (expert_count), or none."""
    experts = int(k.get("expert_count", 0))
    if not experts:
        return {}
    return dict(num_experts=experts, experts_per_token=int(k.require("expert_used_count")),
                expert_intermediate_size=int(k.require("expert_feed_forward_length")), moe_beside_mlp=True)  # fmt: skip


def _shared_sources(k: _Keys, windows: tuple[int, ...]) -> tuple[int, ...]:
    """Per layer, whose keys and values it reads: the last shared_kv_layers read the last earlier layer's of their
    kind (llama.cpp's rule, transformers' too)."""
    layers, shared = len(windows), int(k.get("attention.shared_kv_layers", 0))
    first = layers - shared
    kinds = {bool(w) for w in windows[:first]}
    if shared and (first <= 0 or {bool(w) for w in windows[first:]} - kinds):
        raise k.refuse("gemma4.attention.shared_kv_layers", shared, "its layers need an earlier layer of their kind")
    return tuple(
        i if i < first else max(j for j in range(first) if bool(windows[j]) == bool(windows[i])) for i in range(layers)
    )


def _gpt_oss(tensors: dict) -> dict:
    """gpt-oss as llama.cpp computes it: sinks, an output bias, the clamped SwiGLU with its fixed constants (llama.cpp's
    alpha 1.702 and limit 7, stored in no key), its sliding layers every other one from the first (below)."""
    return dict(attn_sinks=True, o_bias="blk.0.attn_output.bias" in tensors, swiglu_alpha=1.702, swiglu_limit=7.0)


def _hybrid(k: _Keys, layers: int, rotary: int, mtp: int) -> dict:
    """Qwen3.5 as llama.cpp's converter writes it: the recurrent (Gated DeltaNet) blocks flagged one per block (the
    MTP blocks last), their heads in ssm.* keys (group_count key heads of state_size, time_step_rank value heads of
    inner_size / time_step_rank, in its tiled order); the attention gated and partly rotated. Its norms hold 1 + w
    already."""
    flags = k.get("attention.recurrent_layers")
    if flags is None:
        interval = int(k.get("full_attention_interval", 4))
        flags = [(i + 1) % interval != 0 for i in range(layers)]
    if len(flags) < layers or any(flags[layers:]):
        raise k.refuse(f"{k.arch}.attention.recurrent_layers", flags, f"not one flag per block ({layers} + {mtp} MTP)")
    k.read.add("full_attention_interval")
    value_heads = int(k.require("ssm.time_step_rank"))
    return dict(
        linear_layers=tuple(i for i in range(layers) if flags[i]), linear_key_heads=int(k.require("ssm.group_count")),
        linear_key_dim=int(k.require("ssm.state_size")), linear_value_heads=value_heads,
        linear_value_dim=int(k.require("ssm.inner_size")) // value_heads,
        linear_conv_kernel=int(k.require("ssm.conv_kernel")), linear_heads_tiled=True, attn_output_gate=True,
        rotary_dim=rotary,
        mtp_layers=mtp,
    )  # fmt: skip


def _experts(k: _Keys, arch: str, layers: int, tensors: dict) -> dict:
    """Qwen3-MoE's mixture; llama.cpp renormalizes the chosen experts' weights for this architecture, always."""
    count = int(k.get("expert_count", 0))
    if arch == "gpt-oss":  # every layer a mixture, the softmax over the chosen logits, biases (models/config.py)
        return dict(num_experts=count, experts_per_token=int(k.require("expert_used_count")),
                    expert_intermediate_size=int(k.require("expert_feed_forward_length")), moe_biases=True,
                    router_softmax_topk=True)  # fmt: skip
    if arch == "qwen35moe":  # every layer a mixture, renormalized, with a shared expert
        return dict(num_experts=count, experts_per_token=int(k.require("expert_used_count")),
                    expert_intermediate_size=int(k.require("expert_feed_forward_length")), norm_topk_prob=True,
                    shared_expert_intermediate_size=int(k.require("expert_shared_feed_forward_length")))  # fmt: skip
    if arch != "qwen3moe" or not count:
        if count:
            raise k.refuse(f"{arch}.expert_count", count, "verispec computes a mixture of experts for qwen3moe only")
        return {}
    dense = tuple(i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensors)
    return dict(num_experts=count, experts_per_token=int(k.require("expert_used_count")),
                expert_intermediate_size=int(k.require("expert_feed_forward_length")), norm_topk_prob=True,
                dense_layers=dense)  # fmt: skip


def _windows(k: _Keys, arch: str, layers: int) -> tuple[int, ...]:
    """Per layer, the sliding window or 0, as llama.cpp sets it (and transformers, for Phi-3)."""
    window = int(k.get("attention.sliding_window", 4096 if arch == "gemma2" else 0))
    pattern = k.get("attention.sliding_window_pattern")
    if not window:
        return (0,) * layers
    if arch == "phi3":
        return (window,) * layers
    if arch not in GEMMA | {"gpt-oss", "gemma4"}:
        raise k.refuse(f"{arch}.attention.sliding_window", window, f"llama.cpp's {arch} takes no sliding window")
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise k.refuse(f"{arch}.attention.sliding_window_pattern", pattern, "not one flag per layer")
        return tuple(window if flag else 0 for flag in pattern)
    n = int(pattern) if pattern is not None else (6 if arch == "gemma3" else 2)  # gemma2, gpt-oss: every other
    return tuple(window if n == 0 or i % n < n - 1 else 0 for i in range(layers))


def _scaling(k: _Keys, tensors: dict, floats, context: int, theta: float, dim: int) -> RopeScaling | None:
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
