"""Assemble the native model's state dict from any checkpoint format, one part at a time.

A source (GGUF file, Hugging Face folder) only has to answer `fetch(name, rows)` for the canonical names
below; fusing q/k/v and gate/up into single matrices happens here, once, for every format.

Conversion streams: `state_dict_parts` yields the embedding, the head, the final norm and each layer as
separate parts, and matrices with more than CHUNK_ROWS rows (embeddings and heads of 150k-token
vocabularies) are dequantized and re-packed CHUNK_ROWS rows at a time, so converting a model never holds
more than one part plus one chunk in float32. Every fetched tensor is checked to be finite: a damaged file
is refused with the tensor's name before anything is cached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import ModelLoadError
from .config import ModelConfig
from .model import Transformer
from .quantize import ACTIVATION_DTYPE, Int4Weight, quantized_linear, use_quantized_linears

# canonical names: "embed", "norm", "lm_head", and per layer "{i}.attn_norm", "{i}.q", "{i}.k", "{i}.v",
# "{i}.q_bias", "{i}.k_bias", "{i}.v_bias", "{i}.o", "{i}.mlp_norm", "{i}.gate", "{i}.up", "{i}.down", and where
# the config has them "{i}.q_norm", "{i}.k_norm" (qk_norm), "{i}.post_attn_norm", "{i}.post_mlp_norm" (post_norms)
# (with an output gate "{i}.q" holds, per head, the query's rows then the gate's); a linear-attention layer's
# "{i}.ssm_qkv", "ssm_z", "ssm_b", "ssm_a" (its input projections), "ssm_conv" [channels, width], "ssm_dt_bias",
# "ssm_a_log", "ssm_norm", "ssm_out" in place of the attention's; a shared expert's "{i}.shared.gate", ".up", ".down"
# and "{i}.shared_gate"; an MTP layer's "mtp.fc", "mtp.enorm", "mtp.hnorm", "mtp.norm" and its layer's "mtp.0.*";
# Gemma 4's per-layer inputs "ple_embed", "ple_project", "ple_norm" and per layer "{i}.ple_gate", "{i}.ple_up",
# "{i}.ple_norm", its "{i}.scalar"; a layer sharing another's keys and values has no "k", "v", "k_norm", one whose
# values are its keys no "v"
Rows = tuple[int, int] | None  # a [start, stop) range of a matrix's rows, or all of them
Fetch = Callable[[str, Rows], "torch.Tensor | None"]
FetchInt4 = Callable[[str, Rows], "Int4Weight | None"]
RowCount = Callable[[str], int]
CHUNK_ROWS = 16384  # a multiple of every int4 packing block (16, 32, 64 rows)


def canonical_names(config: ModelConfig) -> list[str]:
    """Every canonical name a model of `config` reads (a source checks that it holds nothing else)."""
    names = ["embed", "norm"] + ([] if config.tie_word_embeddings else ["lm_head"])
    names += ["ple_embed", "ple_project", "ple_norm"] if config.per_layer_input_size else []
    for i in range(config.num_layers):
        names += [f"{i}.{name}" for name in _layer_names(config, i)]
    if config.mtp_layers:
        from .mtp import mtp_config

        names += ["mtp.fc", "mtp.enorm", "mtp.hnorm", "mtp.norm"]
        names += [f"mtp.0.{name}" for name in _layer_names(mtp_config(config), 0)]
    return names


_LINEAR_NAMES = ["ssm_qkv", "ssm_z", "ssm_b", "ssm_a", "ssm_conv", "ssm_dt_bias", "ssm_a_log", "ssm_norm", "ssm_out"]


def _layer_names(config: ModelConfig, i: int) -> list[str]:
    if config.linear(i):
        mixer = list(_LINEAR_NAMES)
    else:
        mixer = [*_qkv(config, i), "o"]
        mixer += ["q_bias", "k_bias", "v_bias"] if config.qkv_bias else []
        mixer += (["q_norm", "k_norm"] if len(_qkv(config, i)) > 1 else ["q_norm"]) if config.qk_norm else []
        mixer += ["o_bias"] if config.o_bias else []
        mixer += ["sinks"] if config.attn_sinks else []
    norms = ["attn_norm", "mlp_norm"] + (["post_attn_norm", "post_mlp_norm"] if config.post_norms else [])
    extras = ["ple_gate", "ple_up", "ple_norm"] if config.per_layer_input_size else []
    return norms + mixer + _mlp_names(config, i) + extras + (["scalar"] if config.layer_scalar else [])


_BESIDE_NORMS = ["moe_pre_norm", "moe_mlp_post_norm", "moe_post_norm"]


def _qkv(config: ModelConfig, i: int) -> list[str]:
    """The projections an attention layer has: q, k, v; q alone where it shares another layer's keys and values;
    q, k where its values are its keys (Gemma 4)."""
    if config.kv_source(i) != i:
        return ["q"]
    return ["q", "k"] if config.k_eq_v and not config.window(i) else ["q", "k", "v"]


def _mlp_names(config: ModelConfig, layer: int) -> list[str]:
    """A layer's MLP: gate, up, down; or a mixture's router and each expert's (expert{e}.gate, ...)."""
    if not config.moe(layer):
        return ["gate", "up", "down"]
    if config.moe_beside_mlp:  # Gemma 4: the MLP, and beside it the mixture with its norms and scales
        experts = [f"expert{e}.{n}" for e in range(config.num_experts) for n in ("gate", "up", "down")]
        return ["gate", "up", "down", "router", "router_scale", "expert_scale", *experts, *_BESIDE_NORMS]
    kinds = ("gate", "up", "down") + (("gate_bias", "up_bias", "down_bias") if config.moe_biases else ())
    names = ["router"] + [f"expert{e}.{n}" for e in range(config.num_experts) for n in kinds]
    names += ["router_bias"] if config.moe_biases else []
    if config.shared_expert_intermediate_size:
        names += ["shared.gate", "shared.up", "shared.down", "shared_gate"]
    return names


def assembled_model(config: ModelConfig, state: dict[str, torch.Tensor], quantization: str = "none") -> Transformer:
    """The model of `config` (with the MTP layer its checkpoint carries, where it has one) holding `state`, its
    linears quantized where `quantization` is not "none" (quantize.py)."""
    from .mtp import transformer

    with torch.device("meta"):
        model = transformer(config)
        if quantization != "none":
            use_quantized_linears(model, state)
    model.load_state_dict(state, assign=True, strict=True)
    return model


def assemble_state_dict(
    config: ModelConfig, fetch: Fetch, dtype: torch.dtype, **reading: Any
) -> dict[str, torch.Tensor]:
    """The whole state dict at once (for sources small enough to hold; conversion streams the parts). `reading`:
    state_dict_parts' keywords (quantization, fetch_int4, row_count)."""
    state: dict[str, torch.Tensor] = {}
    for _, part in state_dict_parts(config, fetch, dtype, **reading):
        state |= part
    return state


def state_dict_parts(
    config: ModelConfig,
    fetch: Fetch,
    dtype: torch.dtype,
    *,
    quantization: str = "none",
    fetch_int4: FetchInt4 = lambda name, rows=None: None,
    row_count: RowCount | None = None,
) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    """(part name, tensors) for "embed", "head", "norm" and "layer-NN"; with a quantization, linears become
    QuantizedLinear buffers (see quantize.py). `row_count(name)` lets big matrices be read in chunks."""
    source = _Source(
        fetch,
        ACTIVATION_DTYPE if quantization != "none" else dtype,
        quantization=quantization,
        fetch_int4=fetch_int4,
        row_count=row_count,
    )
    yield "embed", {"embed.weight": torch.cat([source.get("embed", rows) for rows in source.chunks("embed")])}
    # a tied head is the embedding (a quantized model gets its own quantized copy of it)
    head = "lm_head" if not config.tie_word_embeddings else "embed" if quantization != "none" else None
    if head is not None:
        yield "head", source.linear("lm_head", [head])
    yield "norm", {"norm.weight": source.get("norm")}
    if config.per_layer_input_size:
        yield "per-layer-inputs", {"per_layer_inputs.embed.weight": source.get("ple_embed"),
                                   "per_layer_inputs.norm.weight": source.get("ple_norm")} | source.linear(
            "per_layer_inputs.project", ["ple_project"])  # fmt: skip
    for i in range(config.num_layers):
        yield f"layer-{i:03d}", _layer(source, config, i)
    if config.mtp_layers:
        yield "mtp", _mtp(source, config)


class _Source:
    """A checkpoint's tensors by canonical name, checked finite, in the weight form asked for."""

    def __init__(self, fetch: Fetch, dtype: torch.dtype, quantization: str, fetch_int4: FetchInt4, row_count):
        self.fetch, self.dtype, self.quantization = fetch, dtype, quantization
        self.fetch_int4, self.row_count = fetch_int4, row_count

    def chunks(self, name: str) -> list[Rows]:
        rows = self.row_count(name) if self.row_count else 0
        if rows <= CHUNK_ROWS:
            return [None]
        return [(start, min(start + CHUNK_ROWS, rows)) for start in range(0, rows, CHUNK_ROWS)]

    def get(self, name: str, rows: Rows = None) -> torch.Tensor:
        tensor = self.fetch(name, rows)
        if tensor is None:
            raise KeyError(name)
        _check_finite(name, tensor)
        return tensor.to(self.dtype)

    def get_int4(self, name: str, rows: Rows = None) -> Int4Weight | None:
        weight = self.fetch_int4(name, rows)
        if weight is not None:
            _check_finite(name, weight.scale, weight.zero)
        return weight

    def linear(self, prefix: str, names: list[str]) -> dict[str, torch.Tensor]:
        """The matrices `names` stacked as one linear's weight (or its quantized buffers), under `prefix`."""
        if self.quantization == "none":
            return {f"{prefix}.weight": torch.cat([self.get(n) for n in names])}
        ranges = self.chunks(names[0]) if len(names) == 1 else [None]
        pieces = ([self.get_int4(n, rows) or self.get(n, rows) for n in names] for rows in ranges)
        return {f"{prefix}.{key}": value for key, value in quantized_linear(pieces, self.quantization).items()}


def _mtp(source: _Source, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The MTP layer's state (mtp.py), under "mtp.": its input norms and projection, its decoder layer, its norm."""
    from .mtp import mtp_config

    state = {"mtp.enorm.weight": source.get("mtp.enorm"), "mtp.hnorm.weight": source.get("mtp.hnorm"),
             "mtp.norm.weight": source.get("mtp.norm")}  # fmt: skip
    state |= source.linear("mtp.fc", ["mtp.fc"])
    return state | _layer(source, mtp_config(config), 0, names="mtp.0.", prefix="mtp.layers.0")


def _layer(source: _Source, config: ModelConfig, i: int, names: str = "", prefix: str = "") -> dict[str, torch.Tensor]:
    """Layer i's state under `prefix` (layers.{i}), read from the canonical names that start with `names` ({i}.)."""
    prefix, get, n = prefix or f"layers.{i}", source.get, names or f"{i}."
    state = {f"{prefix}.attn_norm.weight": get(f"{n}attn_norm")}
    if config.linear(i):
        state |= _linear_attention(source, prefix, n)
    else:
        state |= _attention(source, config, prefix, n, layer=i)
    if config.post_norms:
        state[f"{prefix}.post_attn_norm.weight"] = get(f"{n}post_attn_norm")
        state[f"{prefix}.post_mlp_norm.weight"] = get(f"{n}post_mlp_norm")
    state[f"{prefix}.mlp_norm.weight"] = get(f"{n}mlp_norm")
    if config.per_layer_input_size:
        state |= source.linear(f"{prefix}.per_layer.gate", [f"{n}ple_gate"])
        state |= source.linear(f"{prefix}.per_layer.up", [f"{n}ple_up"])
        state[f"{prefix}.per_layer.norm.weight"] = get(f"{n}ple_norm")
    if config.layer_scalar:
        state[f"{prefix}.scalar"] = get(f"{n}scalar")
    if not config.moe(i) or config.moe_beside_mlp:
        state |= source.linear(f"{prefix}.mlp.w_gate_up", [f"{n}gate", f"{n}up"])
        state |= source.linear(f"{prefix}.mlp.w_down", [f"{n}down"])
        return state | (_beside(source, config, prefix, n) if config.moe(i) else {})
    state[f"{prefix}.mlp.router.weight"] = get(f"{n}router")  # never quantized: it picks the experts
    if config.moe_biases:
        state[f"{prefix}.mlp.router.bias"] = get(f"{n}router_bias")
    for e in range(config.num_experts):
        expert = f"{prefix}.mlp.experts.{e}"
        state |= source.linear(f"{expert}.w_gate_up", [f"{n}expert{e}.gate", f"{n}expert{e}.up"])
        state |= source.linear(f"{expert}.w_down", [f"{n}expert{e}.down"])
        if config.moe_biases:
            gate_up = [get(f"{n}expert{e}.gate_bias"), get(f"{n}expert{e}.up_bias")]
            state[f"{expert}.w_gate_up.bias"] = torch.cat(gate_up)
            state[f"{expert}.w_down.bias"] = get(f"{n}expert{e}.down_bias")
    if config.shared_expert_intermediate_size:
        state |= source.linear(f"{prefix}.mlp.shared.w_gate_up", [f"{n}shared.gate", f"{n}shared.up"])
        state |= source.linear(f"{prefix}.mlp.shared.w_down", [f"{n}shared.down"])
        state[f"{prefix}.mlp.shared_gate.weight"] = get(f"{n}shared_gate")  # never quantized: one row
    return state


def _beside(source: _Source, config: ModelConfig, prefix: str, n: str) -> dict[str, torch.Tensor]:
    """Gemma 4's mixture beside the MLP (model.GemmaMixture): router, its scales, the experts, three norms."""
    get, mixture = source.get, f"{prefix}.beside"
    state = {f"{mixture}.router.weight": get(f"{n}router"), f"{mixture}.router_scale": get(f"{n}router_scale"),
             f"{mixture}.expert_scale": get(f"{n}expert_scale")}  # fmt: skip
    for ours, theirs in zip(("pre_norm", "mlp_post_norm", "post_norm"), _BESIDE_NORMS, strict=True):
        state[f"{mixture}.{ours}.weight"] = get(f"{n}{theirs}")
    for e in range(config.num_experts):
        expert = f"{mixture}.experts.{e}"
        state |= source.linear(f"{expert}.w_gate_up", [f"{n}expert{e}.gate", f"{n}expert{e}.up"])
        state |= source.linear(f"{expert}.w_down", [f"{n}expert{e}.down"])
    return state


def _attention(source: _Source, config: ModelConfig, prefix: str, n: str, *, layer: int) -> dict[str, torch.Tensor]:
    get, projections = source.get, _qkv(config, layer)
    state = source.linear(f"{prefix}.attn.wqkv", [f"{n}{p}" for p in projections])
    if config.qkv_bias:
        state[f"{prefix}.attn.wqkv.bias"] = torch.cat([get(f"{n}{b}_bias") for b in "qkv"])
    state |= source.linear(f"{prefix}.attn.wo", [f"{n}o"])
    if config.o_bias:
        state[f"{prefix}.attn.wo.bias"] = get(f"{n}o_bias")
    if config.attn_sinks:
        state[f"{prefix}.attn.sinks"] = get(f"{n}sinks")
    if config.qk_norm:
        state[f"{prefix}.attn.q_norm.weight"] = get(f"{n}q_norm")
        if len(projections) > 1:
            state[f"{prefix}.attn.k_norm.weight"] = get(f"{n}k_norm")
    return state


def _linear_attention(source: _Source, prefix: str, n: str) -> dict[str, torch.Tensor]:
    """A Gated DeltaNet's state (delta_net.py): its input projections as one matrix, the rest as they are."""
    get, mixer = source.get, f"{prefix}.attn"
    state = source.linear(f"{mixer}.w_qkvzba", [f"{n}ssm_qkv", f"{n}ssm_z", f"{n}ssm_b", f"{n}ssm_a"])
    state |= source.linear(f"{mixer}.out", [f"{n}ssm_out"])
    return state | {f"{mixer}.conv": get(f"{n}ssm_conv"), f"{mixer}.dt_bias": get(f"{n}ssm_dt_bias"),
                    f"{mixer}.a_log": get(f"{n}ssm_a_log"), f"{mixer}.norm": get(f"{n}ssm_norm")}  # fmt: skip


def _check_finite(name: str, *tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(
                f"weight '{name}' holds NaN or infinite values: the model file is damaged (nothing was cached)"
            )


def undo_rope_permutation(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves each head's rotary halves for Llama; restore HF's layout."""
    rest = weight.shape[1:]
    return weight.reshape(heads, weight.shape[0] // heads // 2, 2, *rest).transpose(1, 2).reshape(weight.shape)
