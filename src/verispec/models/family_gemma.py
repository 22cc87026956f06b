"""The Gemma families (Gemma 2, 3, 4, and Gemma 4's assistant): what their files hold beyond a Llama's (their entries in
families.py).

Gemma 2 and 3: llama.cpp's constants for their GGUF files (attention scale, soft-capping). Gemma 4: per-layer head
sizes, layers sharing keys and values, per-layer inputs, the 26B-A4B's mixture beside the MLP; its GGUF files run
their matrices on the native kernels and the blocks on PyTorch. Gemma 4's assistant (assistant.py): a drafter's own
checkpoint, read on PyTorch as stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from ..errors import ModelLoadError
from ..kernels import native
from ..kernels.linear import GGUFEmbedding, NativeLinear
from .assistant import AssistantModel
from .config import ModelConfig
from .family import Family, Shape
from .gguf_config import GGUFKeys
from .hf_config import JsonFields, read_hf_config
from .hf_source import HFSource
from .model import Transformer
from .native_blocks import FileTensors, matrices_on_the_kernels
from .rope import RopeScaling
from .tokenizer import Tokenizer
from .weights import assemble_state_dict

# Gemma's post_attention_layernorm follows the attention; its MLP's input norm is pre_feedforward_layernorm
HF_NORMS = {
    "attn_norm": "input_layernorm.weight", "post_attn_norm": "post_attention_layernorm.weight",
    "mlp_norm": "pre_feedforward_layernorm.weight", "post_mlp_norm": "post_feedforward_layernorm.weight",
}  # fmt: skip
# Gemma 4's per-layer inputs and layer scalars
GEMMA4_HF_NAMES = {"ple_gate": "per_layer_input_gate.weight", "ple_up": "per_layer_projection.weight",
                 "ple_norm": "post_per_layer_input_norm.weight", "scalar": "layer_scalar"}  # fmt: skip
GEMMA4_HF_GLOBALS = {"ple_embed": "embed_tokens_per_layer.weight", "ple_project": "per_layer_model_projection.weight",
                  "ple_norm": "per_layer_projection_norm.weight"}  # fmt: skip
# Gemma 4's mixture beside its MLP (26B-A4B)
_HF_MIXTURE = {"router": "router.proj.weight", "router_scale": "router.scale",
               "expert_scale": "router.per_expert_scale",
               "moe_pre_norm": "pre_feedforward_layernorm_2.weight",
               "moe_mlp_post_norm": "post_feedforward_layernorm_1.weight",
               "moe_post_norm": "post_feedforward_layernorm_2.weight"}  # fmt: skip
# Gemma 4's per-layer inputs and layer scalars
GEMMA4_GGUF_NAMES = {"ple_gate": "inp_gate.weight", "ple_up": "proj.weight", "ple_norm": "post_norm.weight",
                 "scalar": "layer_output_scale.weight", "router": "ffn_gate_inp.weight",
                 "router_scale": "ffn_gate_inp.scale", "expert_scale": "ffn_down_exps.scale",
                 "moe_pre_norm": "pre_ffw_norm_2.weight", "moe_mlp_post_norm": "post_ffw_norm_1.weight",
                 "moe_post_norm": "post_ffw_norm_2.weight"}  # fmt: skip
GEMMA4_GGUF_GLOBALS = {"ple_embed": "per_layer_token_embd.weight", "ple_project": "per_layer_model_proj.weight",
                  "ple_norm": "per_layer_proj_norm.weight"}  # fmt: skip


def gemma_gguf_fields(big_layers: int, attn_softcap: float | None, final_softcap: float) -> Callable[..., dict]:
    """Gemma 2's and 3's GGUF keys as llama.cpp reads them: the attention scale 1/sqrt(hidden / heads) for the 27B
    models (`big_layers` layers, llama.cpp's test), else 1/sqrt(head dim) (a file stores no query_pre_attn_scalar);
    the soft-capping keys with llama.cpp's defaults (`attn_softcap` None: the family applies none)."""

    def fields(k: GGUFKeys, shape: Shape) -> dict:
        hidden, heads = int(k.require("embedding_length")), int(k.require("attention.head_count"))
        scale = (hidden / heads if shape.layers == big_layers else shape.head_dim) ** -0.5
        attn = float(k.get("attn_logit_softcapping", attn_softcap)) if attn_softcap is not None else 0.0
        return dict(query_scale=scale, attn_softcap=attn,
                    final_softcap=float(k.get("final_logit_softcapping", final_softcap)))  # fmt: skip

    return fields


def gemma4_hf_fields(f: JsonFields, shape: Shape) -> dict:
    """Gemma 4: the full-attention layers' own head size and kv heads (per_layer_config, or global_head_dim and
    num_global_key_value_heads in files that predate it), the last num_kv_shared_layers layers attending to the keys
    and values of the last earlier layer of their kind, values that are keys (attention_k_eq_v) and normed, per-layer
    inputs, a scalar per layer, the shared layers' double-wide MLP."""
    layers, windows = shape.layers, shape.windows
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
    if size and int(f.get("vocab_size_per_layer_input", 0)) < int(f.require("vocab_size")):
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


def _kv_sources(f: JsonFields, layers: int, windows: tuple[int, ...]) -> tuple[int, ...]:
    """Per layer, whose keys and values it attends to: the last num_kv_shared_layers layers share those of the last
    layer before them of the same kind (sliding or full), as transformers' Gemma 4 does."""
    shared = int(f.get("num_kv_shared_layers", 0))
    first = layers - shared
    if shared and (first <= 0 or {bool(w) for w in windows[first:]} - {bool(w) for w in windows[:first]}):
        raise f.refuse("num_kv_shared_layers", shared, "its shared layers need an earlier layer of their kind")
    return tuple(
        i if i < first else max(j for j in range(first) if bool(windows[j]) == bool(windows[i])) for i in range(layers)
    )


def gemma4_hf_rope(f: JsonFields, params: dict) -> tuple[float, RopeScaling | None, float]:
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


def gemma4_hf_where(source: HFSource, base: str, short: str) -> tuple[str, None] | None:
    """The 26B-A4B's mixture: its router, scales and norms, and its experts' fused tensors (gate_up_proj [experts,
    2 x inter, hidden], down_proj [experts, hidden, inter])."""
    if short in _HF_MIXTURE:
        return base + _HF_MIXTURE[short], None
    if short.startswith("expert"):
        kind = short.partition(".")[2]
        return base + ("experts.down_proj" if kind == "down" else "experts.gate_up_proj"), None
    return None


def gemma4_hf_fetch(tensor, name: str) -> torch.Tensor | None:
    """One Gemma 4 expert's matrix (a Linear's weight [out, in]) out of its fused tensors: gate_up_proj [experts,
    2 x inter, hidden] (gate rows first), down_proj [experts, hidden, inter]."""
    if ".expert" not in f".{name}" or "scale" in name:
        return None
    index, _, kind = name.rpartition("expert")[2].partition(".")
    tensor = tensor()[int(index)]
    if kind == "down":
        return tensor
    half = tensor.shape[0] // 2
    return tensor[:half] if kind == "gate" else tensor[half:]


def gemma4_gguf_config(k: GGUFKeys, tensors: dict, floats, windows: Callable[[int], tuple[int, ...]]) -> ModelConfig:
    """Gemma 4 as llama.cpp's converter writes it: the full-attention layers' head size in key_length, the sliding
    ones' in key_length_swa (each layer's kv heads one value or one per layer), the proportional rotary of the full
    layers as rope_freqs (1e30 for the dimensions it does not turn; all of a head: dimension_count), the last
    shared_kv_layers layers reading earlier ones' keys and values, values that are keys where a full layer has no
    attn_v, per-layer inputs, a scalar per layer (layer_output_scale), the wider MLPs in feed_forward_length's list.
    Its norms multiply by w, as stored."""
    heads, hidden, layers = int(k.require("attention.head_count")), int(k.require("embedding_length")), int(
        k.require("block_count"))  # fmt: skip
    windows = windows(layers)
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
        wide_mlp_layers=tuple(i for i in range(layers) if ff[i] != ff[0]), **_gguf_mixture(k),
    )  # fmt: skip


def _gguf_mixture(k: GGUFKeys) -> dict:
    """The 26B-A4B's mixture beside every layer's MLP (expert_count), or none."""
    experts = int(k.get("expert_count", 0))
    if not experts:
        return {}
    return dict(num_experts=experts, experts_per_token=int(k.require("expert_used_count")),
                expert_intermediate_size=int(k.require("expert_feed_forward_length")), moe_beside_mlp=True)  # fmt: skip


def _shared_sources(k: GGUFKeys, windows: tuple[int, ...]) -> tuple[int, ...]:
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


def gemma4_gguf_where(config: ModelConfig, base: str, short: str) -> tuple[str, tuple[int, int]] | None:
    """The 26B-A4B's experts: gate and up fused in ffn_gate_up_exps [experts, 2 x inter, hidden], down in
    ffn_down_exps, an expert's rows of each."""
    if not short.startswith("expert"):
        return None
    expert, _, kind = short.partition(".")
    e, inter = int(expert.removeprefix("expert")), config.expert_intermediate_size
    if kind == "down":
        return base + "ffn_down_exps.weight", (e * config.hidden_size, (e + 1) * config.hidden_size)
    first = 2 * e * inter + (inter if kind == "up" else 0)
    return base + "ffn_gate_up_exps.weight", (first, first + inter)


def gemma4_native_build(config: ModelConfig, tensors: FileTensors, family: Family) -> Transformer:
    """A Gemma 4 file with every matrix on the native kernels as the file stores it, its per-layer embedding table
    looked up there too, and the rest on PyTorch, block by block (the native stack has no per-layer head sizes, shared
    keys or per-layer inputs). Each product sums in the kernels' fixed order and the attention runs per query, so a
    verify row's result is its own whatever shares the pass, as on the stack."""

    def per_layer_inputs(model: Transformer, tensors: FileTensors) -> dict[str, torch.Tensor]:
        if not config.per_layer_input_size:
            return {}
        inputs, width = model.per_layer_inputs, config.num_layers * config.per_layer_input_size
        inputs.embed = GGUFEmbedding(*tensors.raw_rows("per_layer_token_embd.weight"), width)
        inputs.project = tensors.linear(["per_layer_model_proj.weight"], config.hidden_size)
        return {"per_layer_inputs.norm.weight": tensors.floats("per_layer_proj_norm.weight")}

    return matrices_on_the_kernels(config, tensors, _native_block, extras=per_layer_inputs)


def _native_block(
    block: torch.nn.Module, tensors: FileTensors, config: ModelConfig, layer: int
) -> dict[str, torch.Tensor]:
    """A Gemma 4 block's matrices onto the native kernels; returns its norms and scalar (under layers.{layer}.)."""
    p, s, hidden = f"blk.{layer}.", f"layers.{layer}.", config.hidden_size
    projections = [name for name in ("attn_q", "attn_k", "attn_v") if f"{p}{name}.weight" in tensors]
    block.attn.wqkv = tensors.linear([f"{p}{name}.weight" for name in projections], hidden)
    block.attn.wo = tensors.linear([p + "attn_output.weight"], config.num_heads * config.head_size_of(layer))
    block.attn.batch_invariant = True  # each query over its own prefix: a row's result is its own in any pass
    block.attn.attend_per_query = native.attention
    block.mlp.w_gate_up = tensors.linear([p + "ffn_gate.weight", p + "ffn_up.weight"], hidden)
    block.mlp.w_down = tensors.linear([p + "ffn_down.weight"], block.mlp.w_down.in_features)
    norms = {"attn_norm.weight": "attn_norm", "mlp_norm.weight": "ffn_norm", "attn.q_norm.weight": "attn_q_norm",
             "post_attn_norm.weight": "post_attention_norm", "post_mlp_norm.weight": "post_ffw_norm"}  # fmt: skip
    if "attn_k" in projections:
        norms["attn.k_norm.weight"] = "attn_k_norm"
    if config.per_layer_input_size:
        block.per_layer.gate = tensors.linear([p + "inp_gate.weight"], hidden)
        block.per_layer.up = tensors.linear([p + "proj.weight"], config.per_layer_input_size)
        norms["per_layer.norm.weight"] = "post_norm"
    if config.layer_scalar:
        norms["scalar"] = "layer_output_scale"
    state = {s + ours: tensors.floats(f"{p}{theirs}.weight") for ours, theirs in norms.items()}
    return state | (_native_mixture(block.beside, tensors, config, layer) if block.beside is not None else {})


def _native_mixture(beside: torch.nn.Module, tensors: FileTensors, config: ModelConfig, layer: int) -> dict:
    """The 26B-A4B's mixture beside the MLP (model.GemmaMixture): router and experts on the native kernels (each
    expert's rows of the 3-D tensors, gate and up fused as the file holds them); returns its scales and norms."""
    p, s, hidden = f"blk.{layer}.", f"layers.{layer}.beside.", config.hidden_size
    beside.router = tensors.linear([p + "ffn_gate_inp.weight"], hidden)
    for e, expert in enumerate(beside.experts):
        expert.w_gate_up = NativeLinear(hidden, [tensors.expert_rows(p + "ffn_gate_up_exps.weight", e)])
        expert.w_down = NativeLinear(
            config.expert_intermediate_size, [tensors.expert_rows(p + "ffn_down_exps.weight", e)]
        )
    names = {"router_scale": "ffn_gate_inp.scale", "expert_scale": "ffn_down_exps.scale",
             "pre_norm.weight": "pre_ffw_norm_2.weight", "mlp_post_norm.weight": "post_ffw_norm_1.weight",
             "post_norm.weight": "post_ffw_norm_2.weight"}  # fmt: skip
    return {s + ours: tensors.floats(p + theirs) for ours, theirs in names.items()}


# an assistant's tensors beside its decoder (models/assistant.py)
_ASSISTANT_NAMES = {"pre.weight": "pre_projection.weight", "post.weight": "post_projection.weight",
                    "centroids.weight": "masked_embedding.centroids.weight",
                    "token_ordering": "masked_embedding.token_ordering"}  # fmt: skip


def assistant_config(raw: dict, where: str, family: Family) -> tuple[ModelConfig, int, tuple[int, int]]:
    """(its layers' config, the target's hidden size, (centroids, chosen per step) or (0, 0)) of a gemma4_assistant
    config.json: a Gemma 4 text model whose every layer reads its target's keys and values (kv_sources -1)."""
    outer = JsonFields(raw, where, raw.get("model_type"))
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
    config = read_hf_config({**text, "num_kv_shared_layers": 0}, where, family)
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


def load_assistant(path: Path, raw: dict, dtype: torch.dtype, family: Family):
    """(the AssistantModel, its tokenizer or None) of a gemma4_assistant checkpoint folder, on PyTorch in `dtype`
    (`family`: its entry, Gemma 4's rules for its layers)."""
    config, backbone, centroids = assistant_config(raw, str(path), family)
    extra = frozenset(_ASSISTANT_NAMES.values()) | {"lm_head.weight"}
    source = HFSource(path, family, config, extra=extra)
    try:
        state = assemble_state_dict(config, source.fetch, dtype)
        for name, key in _ASSISTANT_NAMES.items():
            if centroids[0] or name in ("pre.weight", "post.weight"):
                if key not in source.index:
                    raise KeyError(key)
                state[name] = source.index[key].get_tensor(key)
    except KeyError as missing:
        raise ModelLoadError(f"{path}: checkpoint lacks the tensor for {missing}") from None
    state = {name: t.to(dtype) if t.is_floating_point() else t.long() for name, t in state.items()}
    with torch.device("meta"):
        model = AssistantModel(config, backbone, centroids)
    if not centroids[0]:
        state["token_ordering"] = torch.zeros(0, dtype=torch.long)
    model.load_state_dict(state, assign=True, strict=True)
    tokenizer = Tokenizer.from_transformers(path) if (path / "tokenizer.json").is_file() else None
    return model.eval(), tokenizer
