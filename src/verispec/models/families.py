"""The model families verispec loads, one entry each (family.py says what each field means), and which family a file
is of: a config.json's `model_type` (config_from_hf, open_folder), a GGUF file's `general.architecture` (of_gguf).

A new family is one entry here, listing what it does otherwise than a Llama; its own code (its readers' extra fields,
tensors stored its own way, its blocks on the native kernels, a checkpoint loaded its own way) goes in a module of its
own (family_gemma.py, family_qwen35.py, family_gpt_oss.py) that the entry names. The shared readers (hf_config.py,
hf_source.py, gguf_config.py, gguf_source.py, gguf_native.py) and loading.py read the entries and test no family.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ..errors import ModelLoadError
from . import family_gemma as gemma
from . import family_gpt_oss as gpt_oss
from . import family_qwen35 as qwen35
from .config import ModelConfig
from .family import Family, Shape
from .gguf_config import GGUFKeys
from .hf_config import JsonFields, read_hf_config
from .hf_source import HFSource, read_config


def _from_max_window_layers(f: JsonFields, layer: int) -> bool:
    """Qwen2's and Qwen3's sliding layers: those from max_window_layers (28) on."""
    return layer >= f.raw.get("max_window_layers", 28)


def _every_other_from_the_first(f: JsonFields, layer: int) -> bool:
    return bool((layer + 1) % 2)


def _no_rope_layers(f: JsonFields, layers: int) -> tuple[int, ...]:
    """SmolLM3: the layers whose no_rope_layers entry is 0 (every no_rope_layer_interval-th by default)."""
    flags = f.get("no_rope_layers")
    if flags is None:
        interval = f.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    f.read.add("no_rope_layer_interval")
    if len(flags) != layers:
        raise f.refuse("no_rope_layers", flags, f"not one entry per layer ({layers})")
    return tuple(i for i, use in enumerate(flags) if not use)


def _smollm3_sliding(f: JsonFields, layer: int) -> bool:
    """SmolLM3's sliding layers: its layers without rotary."""
    return layer in _no_rope_layers(f, f.raw["num_hidden_layers"])


def _smollm3_hf(f: JsonFields, shape: Shape) -> dict:
    return dict(no_rope_layers=_no_rope_layers(f, shape.layers))


def _smollm3_gguf(k: GGUFKeys, shape: Shape) -> dict:
    """SmolLM3's GGUF files: no rotary on every fourth layer (llama.cpp's rule; a file stores none)."""
    return dict(no_rope_layers=tuple(i for i in range(shape.layers) if (i + 1) % 4 == 0))


def _qwen3moe_hf(f: JsonFields, shape: Shape) -> dict:
    """Qwen3-MoE's mixture: its size, and the layers left dense (mlp_only_layers, or off decoder_sparse_step)."""
    count = f.get("num_experts") or f.require("num_local_experts")  # transformers 5 saves the second name
    f.read.add("num_local_experts")
    only, step = f.get("mlp_only_layers", []), f.get("decoder_sparse_step", 1)
    return dict(num_experts=int(count), experts_per_token=int(f.require("num_experts_per_tok")),
                expert_intermediate_size=int(f.require("moe_intermediate_size")),
                norm_topk_prob=bool(f.get("norm_topk_prob", False)),
                dense_layers=tuple(i for i in range(shape.layers) if i in only or (i + 1) % step))  # fmt: skip


def _qwen3moe_gguf(k: GGUFKeys, shape: Shape) -> dict:
    """Qwen3-MoE's mixture; llama.cpp renormalizes the chosen experts' weights for this architecture, always; the
    layers without a router are dense."""
    count = int(k.get("expert_count", 0))
    if not count:
        return {}
    dense = tuple(i for i in range(shape.layers) if f"blk.{i}.ffn_gate_inp.weight" not in shape.tensors)
    return dict(num_experts=count, experts_per_token=int(k.require("expert_used_count")),
                expert_intermediate_size=int(k.require("expert_feed_forward_length")), norm_topk_prob=True,
                dense_layers=dense)  # fmt: skip


QWEN_WINDOWS = dict(window_flag=True, sliding_layers=_from_max_window_layers)
# Gemma's block and its config.json: GeGLU (tanh gelu), norms after the attention and the MLP, embeddings x
# sqrt(hidden), the activation in hidden_activation, tied heads, causal attention only; its norms' names
GEMMA = dict(block=dict(post_norms=True, embed_scale=True, activation="gelu_tanh"),
             activation_fields=("hidden_activation", "hidden_act"), activation_name="gelu_pytorch_tanh",
             tie_default=True, bidirectional=frozenset(), hf_names=gemma.HF_NORMS, gguf_slides="pattern")  # fmt: skip
QWEN35 = dict(drafter="mtp", hf_block=dict(qk_norm=True, norm_offset=1.0), partial_rotary=True, windows=False,
              hf_names=qwen35.HF_NAMES, hf_fetch=qwen35.hf_fetch, attn_qkv_fused=False,
              trailing_blocks_key="nextn_predict_layers", gguf_names=qwen35.GGUF_NAMES, gguf_fetch=qwen35.gguf_fetch,
              int4_as_stored=False, native_build=qwen35.native_build, dequantized_fallback=True)  # fmt: skip

GEMMA4 = Family(**GEMMA | dict(
    name="gemma4", model_types=("gemma4_text",), wrappers={"gemma4": frozenset({"gemma4_text"})},
    architectures=("gemma4",), block=GEMMA["block"] | dict(query_scale=1.0), hf_block=dict(qk_norm=True),
    softcaps={"attn_logit_softcapping": None, "final_logit_softcapping": None}, window_default=512,
    bidirectional=frozenset({"vision"}), last_layer_full=True, hf_rope=gemma.gemma4_hf_rope,
    hf_fields=gemma.gemma4_hf_fields, hf_names=gemma.HF_NORMS | gemma.GEMMA4_HF_NAMES,
    hf_globals=gemma.GEMMA4_HF_GLOBALS, hf_where=gemma.gemma4_hf_where, hf_fetch=gemma.gemma4_hf_fetch,
    gguf_config=gemma.gemma4_gguf_config, gguf_names=gemma.GEMMA4_GGUF_NAMES, gguf_globals=gemma.GEMMA4_GGUF_GLOBALS,
    gguf_where=gemma.gemma4_gguf_where, native_build=gemma.gemma4_native_build, dequantized_fallback=True,
))  # fmt: skip

FAMILIES = (
    Family(name="llama", model_types=("llama",), architectures=("llama",), rope_permuted=True, window_default=None,
           window_refused="Llama's modules take no sliding window"),
    Family(name="mistral", model_types=("mistral",), wrappers={"mistral3": frozenset({"mistral", "llama"})},
           architectures=("mistral", "mistral3"), rope_permuted=True, attention_bias=True, slides_every_layer=True),
    Family(name="qwen2", model_types=("qwen2",), architectures=("qwen2",), attention_bias=True,
           hf_block=dict(qkv_bias=True), **QWEN_WINDOWS),
    Family(name="qwen3", model_types=("qwen3",), architectures=("qwen3",), hf_block=dict(qk_norm=True), **QWEN_WINDOWS),
    Family(name="qwen3moe", model_types=("qwen3_moe",), architectures=("qwen3moe",), hf_block=dict(qk_norm=True),
           hf_fields=_qwen3moe_hf, gguf_fields=_qwen3moe_gguf, **QWEN_WINDOWS),
    Family(name="phi3", model_types=("phi3",), architectures=("phi3",), window_default=None, slides_every_layer=True,
           fused_qkv=True, fused_gate_up=True, gguf_slides="every"),
    Family(name="smollm3", model_types=("smollm3",), architectures=("smollm3",), rope_permuted=True, tie_default=True,
           window_default=None, window_flag=True, sliding_layers=_smollm3_sliding,
           hf_fields=_smollm3_hf, gguf_fields=_smollm3_gguf),
    Family(name="gemma2", model_types=("gemma2",), architectures=("gemma2",), **GEMMA, hf_block=dict(norm_offset=1.0),
           query_pre_attn_scalar=256, softcaps={"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
           sliding_layers=_every_other_from_the_first, gguf_window_default=4096,
           gguf_fields=gemma.gemma_gguf_fields(big_layers=46, attn_softcap=50.0, final_softcap=30.0)),
    Family(name="gemma3", model_types=("gemma3_text",), wrappers={"gemma3": frozenset({"gemma3_text"})},
           architectures=("gemma3",), **GEMMA, hf_block=dict(qk_norm=True, norm_offset=1.0), query_pre_attn_scalar=256,
           softcaps={"final_logit_softcapping": None}, hf_harmless=frozenset({"attn_logit_softcapping"}),
           rope_theta_default=1_000_000.0, local_rope=True, window_needed="Gemma 3's sliding layers need their window",
           gguf_pattern_default=6, gguf_fields=gemma.gemma_gguf_fields(big_layers=62, attn_softcap=None,
                                                                       final_softcap=0.0)),
    Family(name="qwen35", model_types=("qwen3_5_text",), wrappers={"qwen3_5": frozenset({"qwen3_5_text"})},
           architectures=("qwen35",), hf_fields=qwen35.hf_fields, gguf_fields=qwen35.gguf_fields, **QWEN35),
    Family(name="qwen35moe", model_types=("qwen3_5_moe_text",),
           wrappers={"qwen3_5_moe": frozenset({"qwen3_5_moe_text"})}, architectures=("qwen35moe",),
           hf_fields=qwen35.hf_moe_fields, gguf_fields=qwen35.gguf_moe_fields, **QWEN35),
    Family(name="gptoss", model_types=("gpt_oss",), architectures=("gpt-oss",), block=dict(activation="swiglu_oai"),
           attention_bias=True, sliding_layers=_every_other_from_the_first, hf_fields=gpt_oss.hf_fields,
           hf_where=gpt_oss.hf_where, hf_fetch=gpt_oss.hf_fetch, gguf_slides="pattern", gguf_fields=gpt_oss.gguf_fields,
           gguf_names=gpt_oss.GGUF_NAMES, gguf_where=gpt_oss.gguf_where, gguf_fetch=gpt_oss.gguf_fetch,
           native_build=gpt_oss.native_build, dequantized_fallback=True),
    GEMMA4,
    # Gemma 4's assistant: a drafter's own checkpoint, its layers Gemma 4's, read on PyTorch as stored
    replace(GEMMA4, model_types=("gemma4_assistant",), wrappers={}, architectures=(), drafter="assistant",
            load_folder=gemma.load_assistant,
            not_a_target="is a Gemma 4 assistant, a drafter: give it as the speculative model of its Gemma 4 target "
            "with --speculative-method assistant"),
)  # fmt: skip

_READ = {kind: family for family in FAMILIES if family.load_folder is None for kind in (*family.model_types,
                                                                                       *family.wrappers)}  # fmt: skip
_OWN_WAY = {kind: family for family in FAMILIES if family.load_folder is not None for kind in family.model_types}
_ARCHITECTURES = {arch: family for family in FAMILIES for arch in family.architectures}


def config_from_hf(raw: dict, where: str) -> tuple[Family, ModelConfig]:
    """(the family, the config) of a config.json; ModelLoadError for what verispec does not compute."""
    model_type = raw.get("model_type")
    family = _READ.get(model_type)
    if family is None:
        raise ModelLoadError(
            f"{where}: model_type '{model_type}' is not supported (supported: {', '.join(sorted(_READ))})"
        )
    return family, read_hf_config(raw, where, family)


def open_folder(folder: Path) -> HFSource:
    """A Hugging Face checkpoint folder's tensors, read by its family's rules."""
    family, config = config_from_hf(read_config(folder), str(folder))
    return HFSource(folder, family, config)


def loaded_its_own_way(source: str | os.PathLike) -> Family | None:
    """The family of a checkpoint folder that its family loads its own way (a drafter's own checkpoint, read on
    PyTorch as stored: no weight form to choose), or None."""
    path = Path(source).expanduser()
    if not (path.is_dir() and (path / "config.json").is_file()):
        return None
    return _OWN_WAY.get(read_config(path).get("model_type"))


def of_model_type(model_type: str | None) -> Family | None:
    """The family of a config.json's model_type (a drafter's own checkpoint's too), None where verispec has none."""
    return _READ.get(model_type) or _OWN_WAY.get(model_type)


def of_architecture(arch: str | None) -> Family | None:
    """The family of a GGUF file's general.architecture, None where verispec has none."""
    return _ARCHITECTURES.get(arch)


def of_gguf(fields, where: str) -> tuple[str, Family]:
    """(general.architecture, its family) of a GGUF file's metadata (GGUFReader.fields); ModelLoadError where
    verispec has no family for it."""
    arch_field = fields.get("general.architecture")
    arch = str(arch_field.contents()) if arch_field is not None else None
    family = of_architecture(arch)
    if family is None:
        supported = ", ".join(sorted(_ARCHITECTURES))
        raise ModelLoadError(f"{where}: architecture '{arch}' is not supported (supported: {supported})")
    return arch, family
