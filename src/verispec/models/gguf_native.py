"""Load a GGUF model onto the native kernels: the weights are the file's own blocks, memory-mapped.

Nothing is converted. The first load reads the file's metadata once (the `gguf` package takes seconds over
a 150k-token vocabulary) and caches what later loads need in a small folder: the model's shape, its
tokenizer, and an index of its tensors (type, shape, offset). That first load also checks every block's
float16 scales (the only fields of a quantized block that can hold NaN or infinity) and refuses a damaged
file naming the tensor. Later loads map the file and build the model in a fraction of a second.

Every architecture of gguf_config.py builds the same way: fused tensors (Phi-3's attn_qkv, its ffn_up holding
gates then ups) become one part of their product, the norms an architecture adds go to the stack as float32
vectors. `native_from_dense` puts a model loaded with dense weights (a Hugging Face folder) on the same stack.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..errors import ModelLoadError
from ..kernels import native
from ..kernels.linear import GGUFEmbedding, NativeLinear, NativeRMSNorm
from ..kernels.stack import BlockWeights, NativeStack, StackOptions
from .config import ModelConfig
from .converted import writing
from .gguf_config import PERMUTED
from .gguf_source import undo_rope_permutation
from .model import Transformer
from .tokenizer import Tokenizer

# the cache form (converted.converted_folder); change when the tile formats change (5: T4_1; 6: T2_K, T3_K, T5_K,
# TIQ4_NL, TIQ4_XS)
FORM = "gguf-tiles6"
_FLOAT_TYPES = {0: np.float32, 1: np.float16, 30: np.uint16}  # F32, F16, BF16 (bits): their element types
# per quantized type: (block bytes, offsets of its float16 fields)
_HALF_FIELDS = {
    2: (18, (0,)), 3: (20, (0, 2)), 6: (22, (0,)), 8: (34, (0,)), 20: (18, (0,)),
    10: (84, (80, 82)), 11: (110, (108,)), 12: (144, (0, 2)), 13: (176, (0, 2)), 14: (210, (208,)), 23: (136, (0,)),
}  # fmt: skip


def load_native(
    path: Path, folder: Path, progress: bool = True, coarsen: bool = False
) -> tuple[Transformer, Tokenizer] | None:
    """The model on the native kernels, or None when a matrix has a block type without a kernel.
    `folder`: where the index of this file is cached (see converted.converted_folder). `coarsen`: the layers'
    matrices stored in more bytes per weight than Q4_0 are requantized to Q4_0 once, into the cache (a draft's
    form: `--speculative-quantization q4_0`; the embeddings and the output head stay as stored)."""
    if not (folder / "config.json").is_file():
        _write_index(path, folder, progress, coarsen)
    config = ModelConfig.from_json((folder / "config.json").read_text())
    if _beyond_the_kernels(config) and not (_gemma4(config) or config.attn_sinks):
        return None
    index = json.loads((folder / "tensors.json").read_text())
    matrices = [entry["type"] for entry in index["tensors"].values() if len(entry["shape"]) > 1]
    if any(qtype not in native.QUANT_TYPES for qtype in matrices):
        return None
    data = {"": np.memmap(path, mode="c")}  # copy-on-write: writable views for torch; the file is never written
    for extra in ("tiles", COARSE):
        if (folder / f"{extra}.bin").is_file() and (folder / f"{extra}.bin").stat().st_size:
            data[extra] = np.memmap(folder / f"{extra}.bin", mode="c")
    native.claim_threads()
    build = _build_hybrid if config.hybrid else _build_gemma4 if _gemma4(config) else _build
    build = _build_gpt_oss if config.attn_sinks else build
    model = build(config, index, data)
    return model, Tokenizer.load_for_gguf(folder, path)


class _Tensors:
    """The GGUF file's tensors by name, as the native stack takes them: quantized rows (with their cached tile form),
    an expert's rows of a 3-D expert tensor, or float32 values."""

    def __init__(self, index: dict, data: dict[str, np.memmap]):
        """`data`: the GGUF file (key ""), the cached tile forms ("tiles") and requantized rows (COARSE)."""
        self.entries, self.files = index["tensors"], data
        self.tiles = data.get("tiles")

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def raw_rows(self, name: str, permute_heads: int | None = None) -> tuple[int, torch.Tensor]:
        entry = self.entries[name]
        qtype, rows = entry["type"], entry["shape"][-1] if len(entry["shape"]) > 1 else 1
        data = self.files[entry.get("file", "")]
        weight = torch.from_numpy(data[entry["offset"] : entry["offset"] + entry["bytes"]].reshape(rows, -1))
        if permute_heads is not None:
            weight = undo_rope_permutation(weight, permute_heads).contiguous()
        return qtype, weight

    def part(self, name: str, permute_heads: int | None = None) -> tuple[tuple[int, torch.Tensor], tuple | None]:
        """(the GGUF rows, their cached tile form or None)"""
        tile = self.entries[name].get("tile")
        cached = None
        if tile is not None and self.tiles is not None:
            cached = (tile["type"], torch.from_numpy(self.tiles[tile["offset"] : tile["offset"] + tile["bytes"]]))
        return self.raw_rows(name, permute_heads), cached

    def expert_rows(self, name: str, expert: int) -> tuple[int, torch.Tensor]:
        """Expert `expert`'s matrix of a 3-D expert tensor [experts, rows, row bytes] (tile forms made at load)."""
        entry = self.entries[name]
        count, rows = entry["shape"][2], entry["shape"][1]
        size = entry["bytes"] // count
        start = entry["offset"] + expert * size
        return entry["type"], torch.from_numpy(self.files[""][start : start + size].reshape(rows, -1))

    def linear(self, names: list[str], in_features: int, bias=None, heads=None) -> NativeLinear:
        made = [self.part(name, heads[i] if heads else None) for i, name in enumerate(names)]
        return NativeLinear(in_features, [m[0] for m in made], bias, [m[1] for m in made])

    def floats(self, name: str, permute_heads: int | None = None) -> torch.Tensor:
        entry = self.entries[name]
        raw = self.files[""][entry["offset"] : entry["offset"] + entry["bytes"]]
        values = torch.from_numpy(_as_float32(raw, entry["type"]))
        return values if permute_heads is None else undo_rope_permutation(values, permute_heads).contiguous()


def _build(config: ModelConfig, index: dict, data: dict[str, np.memmap]) -> Transformer:
    arch, tensors = index["architecture"], _Tensors(index, data)
    with torch.device("meta"):
        model = Transformer(config)
    state = {"norm.weight": tensors.floats("output_norm.weight")}
    for i, block in enumerate(model.layers):
        _attention(block, tensors, config=config, layer=i, permuted=arch in PERMUTED)
        _mlp(block, tensors, config=config, layer=i, arch=arch)
        state |= _layer_norms(tensors, config, i)
        if block.attn.wqkv.bias is not None:
            state[f"layers.{i}.attn.wqkv.bias"] = block.attn.wqkv.bias
    embed_type, embed = tensors.raw_rows("token_embd.weight")
    model.embed = GGUFEmbedding(embed_type, embed, config.hidden_size)
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    model.lm_head = tensors.linear([head], config.hidden_size)
    model.load_state_dict(state, assign=True, strict=True)
    return _on_the_stack(model)


def _build_hybrid(config: ModelConfig, index: dict, data: dict[str, np.memmap]) -> Transformer:
    """A Qwen3.5 file (linear attention beside gated attention, an MTP block after the layers) with every matrix on
    the native kernels as the file stores it, and the rest on PyTorch: the native stack has no Gated DeltaNet, so the
    blocks run one by one (no `fused_blocks`). Each product sums in the kernels' fixed order and the attention runs
    per query, so a verify row's result is its own whatever shares the pass, as on the stack."""
    from .mtp import transformer

    tensors = _Tensors(index, data)
    with torch.device("meta"):
        model = transformer(config)
    state = {"norm.weight": tensors.floats("output_norm.weight")}
    for i, block in enumerate(model.layers):
        state |= _hybrid_block(block, tensors, config, layer=i, prefix=f"layers.{i}.")
    embed_type, embed = tensors.raw_rows("token_embd.weight")
    model.embed = GGUFEmbedding(embed_type, embed, config.hidden_size)
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    model.lm_head = tensors.linear([head], config.hidden_size)
    if model.mtp is not None:  # block N (the layers' count): the MTP layer, its input projection and norms
        p, mtp = f"blk.{config.num_layers}.", model.mtp
        mtp.fc = tensors.linear([p + "nextn.eh_proj.weight"], 2 * config.hidden_size)
        names = {"enorm": "nextn.enorm", "hnorm": "nextn.hnorm", "norm": "nextn.shared_head_norm"}
        state |= {f"mtp.{ours}.weight": tensors.floats(p + theirs + ".weight") for ours, theirs in names.items()}
        state |= _hybrid_block(
            mtp.layers[0], tensors, mtp.config, layer=0, prefix="mtp.layers.0.", block_index=config.num_layers
        )
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval()


def _gemma4(config: ModelConfig) -> bool:
    """Whether the model is a Gemma 4 (its values normed: the family's mark): matrices on the kernels, blocks on
    PyTorch."""
    return config.v_norm


def _build_gemma4(config: ModelConfig, index: dict, data: dict[str, np.memmap]) -> Transformer:
    """A Gemma 4 file with every matrix on the native kernels as the file stores it, its per-layer embedding table
    looked up there too, and the rest on PyTorch, block by block (the native stack has no per-layer head sizes, shared
    keys or per-layer inputs). Each product sums in the kernels' fixed order and the attention runs per query, so a
    verify row's result is its own whatever shares the pass, as on the stack."""

    def per_layer_inputs(model: Transformer, tensors: _Tensors) -> dict[str, torch.Tensor]:
        if not config.per_layer_input_size:
            return {}
        inputs, width = model.per_layer_inputs, config.num_layers * config.per_layer_input_size
        inputs.embed = GGUFEmbedding(*tensors.raw_rows("per_layer_token_embd.weight"), width)
        inputs.project = tensors.linear(["per_layer_model_proj.weight"], config.hidden_size)
        return {"per_layer_inputs.norm.weight": tensors.floats("per_layer_proj_norm.weight")}

    return _matrices_on_the_kernels(config, _Tensors(index, data), _gemma4_block, extras=per_layer_inputs)


def _matrices_on_the_kernels(
    config: ModelConfig, tensors: _Tensors, block_state: Callable[..., dict], extras: Callable[..., dict] | None = None
) -> Transformer:
    """A model of a GGUF file whose blocks run on PyTorch with every matrix on the native kernels (Gemma 4, gpt-oss):
    `block_state(block, tensors, config, layer=i)` puts block i's matrices there and returns its other weights,
    `extras(model, tensors)` the same for the model's own parts beyond its embeddings, head and final norm."""
    with torch.device("meta"):
        model = Transformer(config)
    state = {"norm.weight": tensors.floats("output_norm.weight")}
    for i, block in enumerate(model.layers):
        state |= block_state(block, tensors, config, layer=i)
    embed_type, embed = tensors.raw_rows("token_embd.weight")
    model.embed = GGUFEmbedding(embed_type, embed, config.hidden_size)
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    model.lm_head = tensors.linear([head], config.hidden_size)
    state |= extras(model, tensors) if extras is not None else {}
    state |= {name: value for name, value in model.state_dict().items() if value.device.type != "meta"}  # biases
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval()


def _gemma4_block(
    block: torch.nn.Module, tensors: _Tensors, config: ModelConfig, layer: int
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
    return state | (_gemma4_mixture(block.beside, tensors, config, layer) if block.beside is not None else {})


def _gemma4_mixture(beside: torch.nn.Module, tensors: _Tensors, config: ModelConfig, layer: int) -> dict:
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


def _build_gpt_oss(config: ModelConfig, index: dict, data: dict[str, np.memmap]) -> Transformer:
    """A gpt-oss file with every matrix on the native kernels as the file stores it (its MXFP4 experts too, each
    expert's rows of the 3-D tensors), and the rest on PyTorch, block by block: its attention with sinks (PyTorch's),
    the biases added to the products, the router's softmax over the chosen experts, the clamped SwiGLU."""
    return _matrices_on_the_kernels(config, _Tensors(index, data), _gpt_oss_block)


def _gpt_oss_block(block: torch.nn.Module, tensors: _Tensors, config: ModelConfig, layer: int) -> dict:
    """A gpt-oss block's matrices onto the native kernels with their biases; returns its norms and sinks."""
    p, hidden = f"blk.{layer}.", config.hidden_size
    bias = torch.cat([tensors.floats(f"{p}attn_{x}.bias") for x in "qkv"]) if config.qkv_bias else None
    block.attn.wqkv = tensors.linear([f"{p}attn_{x}.weight" for x in "qkv"], hidden, bias)
    o_bias = tensors.floats(p + "attn_output.bias") if config.o_bias else None
    block.attn.wo = tensors.linear([p + "attn_output.weight"], config.num_heads * config.head_size, o_bias)
    mlp, inter, count = block.mlp, config.expert_intermediate_size, config.num_experts
    mlp.router = tensors.linear([p + "ffn_gate_inp.weight"], hidden, tensors.floats(p + "ffn_gate_inp.bias"))
    biases = {kind: tensors.floats(f"{p}ffn_{kind}_exps.bias").view(count, -1) for kind in ("gate", "up", "down")}
    for e, expert in enumerate(mlp.experts):
        gate_up = [tensors.expert_rows(p + "ffn_gate_exps.weight", e), tensors.expert_rows(p + "ffn_up_exps.weight", e)]
        expert.w_gate_up = NativeLinear(hidden, gate_up, torch.cat([biases["gate"][e], biases["up"][e]]))
        expert.w_down = NativeLinear(inter, [tensors.expert_rows(p + "ffn_down_exps.weight", e)], biases["down"][e])
    s = f"layers.{layer}."
    return {s + "attn_norm.weight": tensors.floats(p + "attn_norm.weight"),
            s + "mlp_norm.weight": tensors.floats(p + "post_attention_norm.weight"),
            s + "attn.sinks": tensors.floats(p + "attn_sinks.weight")}  # fmt: skip


def _hybrid_block(
    block, tensors: _Tensors, config: ModelConfig, layer: int, prefix: str, block_index: int | None = None
) -> dict[str, torch.Tensor]:
    """A Qwen3.5 block's matrices onto the native kernels; returns its other weights (norms, the DeltaNet's vectors)
    under `prefix`. `block_index`: the file's block number where it is not `layer` (the MTP block)."""
    p = f"blk.{layer if block_index is None else block_index}."
    hidden, state = config.hidden_size, {}
    if config.linear(layer):
        mixer = block.attn
        qkvzba = [p + "attn_qkv.weight", p + "attn_gate.weight", p + "ssm_beta.weight", p + "ssm_alpha.weight"]
        mixer.w_qkvzba = tensors.linear(qkvzba, hidden)
        mixer.out = tensors.linear([p + "ssm_out.weight"], config.linear_value_heads * config.linear_value_dim)
        state |= {prefix + "attn.conv": tensors.floats(p + "ssm_conv1d.weight").view(config.linear_conv_dim, -1),
                  prefix + "attn.dt_bias": tensors.floats(p + "ssm_dt.bias"),
                  prefix + "attn.a_log": torch.log(-tensors.floats(p + "ssm_a")),  # the file holds -exp(A_log)
                  prefix + "attn.norm": tensors.floats(p + "ssm_norm.weight")}  # fmt: skip
    else:
        block.attn.wqkv = tensors.linear([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], hidden)
        block.attn.wo = tensors.linear([p + "attn_output.weight"], config.num_heads * config.head_size)
        block.attn.batch_invariant = True
        block.attn.attend_per_query = native.attention
        state |= {prefix + "attn.q_norm.weight": tensors.floats(p + "attn_q_norm.weight"),
                  prefix + "attn.k_norm.weight": tensors.floats(p + "attn_k_norm.weight")}  # fmt: skip
    _mlp(block, tensors, config=config, layer=layer, arch="qwen35", block_index=block_index)
    if config.shared_expert_intermediate_size:
        shared = block.mlp.shared
        shared.w_gate_up = tensors.linear([p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"], hidden)
        shared.w_down = tensors.linear([p + "ffn_down_shexp.weight"], config.shared_expert_intermediate_size)
        block.mlp.shared_gate = tensors.linear([p + "ffn_gate_inp_shexp.weight"], hidden)
    return state | {prefix + "attn_norm.weight": tensors.floats(p + "attn_norm.weight"),
                    prefix + "mlp_norm.weight": tensors.floats(p + "post_attention_norm.weight")}  # fmt: skip


def _attention(block, tensors: _Tensors, config: ModelConfig, layer: int, permuted: bool) -> None:
    """Layer `layer`'s q/k/v and output matrices on the native kernels (llama.cpp permuted some architectures' q and
    k rows: `permuted` undoes it); its attention per query, so decode and verify passes stay identical."""
    p, hidden = f"blk.{layer}.", config.hidden_size
    q_heads, k_heads = (config.num_heads, config.num_kv_heads) if permuted else (None, None)
    bias = None
    if config.qkv_bias:
        parts = [tensors.floats(p + "attn_q.bias", q_heads), tensors.floats(p + "attn_k.bias", k_heads)]
        bias = torch.cat([*parts, tensors.floats(p + "attn_v.bias")])
    if p + "attn_qkv.weight" in tensors:  # Phi-3: q, k and v in one matrix
        block.attn.wqkv = tensors.linear([p + "attn_qkv.weight"], hidden, bias)
    else:
        qkv = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
        block.attn.wqkv = tensors.linear(qkv, hidden, bias, [q_heads, k_heads, None])
    block.attn.wo = tensors.linear([p + "attn_output.weight"], config.num_heads * config.head_size)
    block.attn.batch_invariant = True  # decode and verify passes attend per query: greedy stays identical
    block.attn.attend_per_query = native.attention


def _mlp(block, tensors: _Tensors, config: ModelConfig, layer: int, arch: str, block_index: int | None = None) -> None:
    """Layer `layer`'s MLP (or its router and each expert's rows of the 3-D expert tensors) on the native kernels
    (`block_index`: the file's block where it is not `layer`)."""
    p, hidden = f"blk.{layer if block_index is None else block_index}.", config.hidden_size
    if config.moe(layer):
        block.mlp.router = tensors.linear([p + "ffn_gate_inp.weight"], hidden)
        for e, expert in enumerate(block.mlp.experts):
            gate_up = [
                tensors.expert_rows(p + "ffn_gate_exps.weight", e),
                tensors.expert_rows(p + "ffn_up_exps.weight", e),
            ]
            expert.w_gate_up = NativeLinear(hidden, gate_up)
            expert.w_down = NativeLinear(
                config.expert_intermediate_size, [tensors.expert_rows(p + "ffn_down_exps.weight", e)]
            )
        return
    gate_up = [p + "ffn_up.weight"] if arch == "phi3" else [p + "ffn_gate.weight", p + "ffn_up.weight"]
    block.mlp.w_gate_up = tensors.linear(gate_up, hidden)  # Phi-3's ffn_up holds the gates, then the ups
    block.mlp.w_down = tensors.linear([p + "ffn_down.weight"], config.intermediate_size)


def _layer_norms(tensors: _Tensors, config: ModelConfig, layer: int) -> dict[str, torch.Tensor]:
    p, s = f"blk.{layer}.", f"layers.{layer}."
    norms = {"attn_norm.weight": "attn_norm.weight", "mlp_norm.weight": "ffn_norm.weight"}
    if config.qk_norm:
        norms |= {"attn.q_norm.weight": "attn_q_norm.weight", "attn.k_norm.weight": "attn_k_norm.weight"}
    if config.post_norms:
        norms |= {"post_attn_norm.weight": "post_attention_norm.weight", "post_mlp_norm.weight": "post_ffw_norm.weight"}
    return {s + ours: tensors.floats(p + theirs) for ours, theirs in norms.items()}


def _on_the_stack(model: Transformer) -> Transformer:
    """The model's final norm on the library, and its blocks on the native stack where it takes them."""
    config = model.config
    model.norm = NativeRMSNorm(_folded(model.norm.weight.data, config), config.rms_norm_eps)
    model.fused_blocks = native_stack(config, model)
    if model.fused_blocks is not None:  # its attention reads halves: half the bytes at a long context
        model.kv_dtype = torch.float16
    return model.eval()


def _folded(weight: torch.Tensor | None, config: ModelConfig) -> torch.Tensor | None:
    """A norm's weight as the library takes it: float32, with the config's offset added (Gemma's 1 + w, computed
    in float32 as transformers computes it: the same values)."""
    if weight is None:
        return None
    weight = weight.detach().float()
    return (weight + config.norm_offset if config.norm_offset else weight).contiguous()


def native_stack(config: ModelConfig, model: Transformer) -> NativeStack | None:
    """The native stack over the model's blocks (whose linears are NativeLinear), or None when the head size is
    not a multiple of 8 (the attention's lanes). Each product's activations are quantized in the format its
    parts take (blocks of 32 values, or 256 for the K-quants)."""
    if config.head_size % 8:
        return None

    def norm(module) -> torch.Tensor | None:
        return None if module is None else _folded(module.weight, config)

    def mixture(mlp) -> dict:
        """A block's MLP as the stack takes it: its gate/up and down, or its router and experts."""
        if not hasattr(mlp, "experts"):
            return dict(gate_up=mlp.w_gate_up.parts(), down=mlp.w_down.parts())
        experts = [(x.w_gate_up.parts(), x.w_down.parts()[0]) for x in mlp.experts]
        return dict(gate_up=[], down=[], router=mlp.router.parts()[0], experts=experts)

    blocks = [
        BlockWeights(
            attn_norm=norm(b.attn_norm),
            mlp_norm=norm(b.mlp_norm),
            qkv_bias=None if b.attn.wqkv.bias is None else b.attn.wqkv.bias.data,
            qkv=b.attn.wqkv.parts(),
            o=b.attn.wo.parts(),
            **mixture(b.mlp),
            q_norm=norm(b.attn.q_norm),
            k_norm=norm(b.attn.k_norm),
            post_attn_norm=norm(b.post_attn_norm),
            post_mlp_norm=norm(b.post_mlp_norm),
            rope=config.rope_table(i),
            window=config.window(i),
        )
        for i, b in enumerate(model.layers)
    ]
    embed_scale = model.embedding_scale(torch.float32)
    options = StackOptions(scale=config.query_scale, softcap=config.attn_softcap, gelu=config.activation == "gelu_tanh",
                           embed_scale=0.0 if embed_scale is None else float(embed_scale),
                           experts=config.num_experts, experts_per_token=config.experts_per_token,
                           expert_inter=config.expert_intermediate_size, norm_topk=config.norm_topk_prob)  # fmt: skip
    return NativeStack(hidden=config.hidden_size, heads=config.num_heads, kv_heads=config.num_kv_heads,
                       head_dim=config.head_size, inter=config.intermediate_size, eps=config.rms_norm_eps,
                       blocks=blocks, options=options)  # fmt: skip


DENSE_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30}  # GGML type ids


def refuse_unnative(config: ModelConfig, where: str) -> None:
    """ModelLoadError where the native stack lacks a layer the model has (Qwen3.5's linear attention, its gated
    attention and partial rotary)."""
    if config.hybrid or config.attn_output_gate or config.rotary_dim:
        raise ModelLoadError(
            f"{where} has linear-attention layers and a gated, partly rotated attention (Qwen3.5): it runs on PyTorch "
            "(--quantization none), not on the native kernels"
        )
    if _beyond_the_kernels(config):
        parts = ("per-layer head sizes, layers sharing keys and values, per-layer inputs (Gemma 4)" if config.v_norm
                 else "attention sinks, biased experts and a clamped SwiGLU (gpt-oss)")  # fmt: skip
        raise ModelLoadError(
            f"{where} has {parts}: it runs on PyTorch (--quantization none), not on the native kernels"
        )


def _beyond_the_kernels(config: ModelConfig) -> bool:
    """Whether the model has parts no native path computes (gpt-oss's sinks, biased experts, clamped SwiGLU; Gemma 4's
    per-layer head sizes, shared keys and values, per-layer inputs)."""
    gpt_oss = config.attn_sinks or config.o_bias or config.moe_biases or config.activation == "swiglu_oai"
    return gpt_oss or bool(config.layer_head_dims or config.kv_sources or config.per_layer_input_size or config.v_norm)


def linears_on_the_kernels(module: torch.nn.Module, dtype: torch.dtype = torch.float16) -> None:
    """Every nn.Linear inside `module` replaced by a NativeLinear of its weights in `dtype` (a drafter that runs beside
    a target on the native kernels: Gemma 4's assistant), in place."""
    qtype = DENSE_TYPES[dtype]
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            weight = child.weight.detach().to(dtype).contiguous()
            rows = weight.view(torch.uint8).reshape(weight.shape[0], -1)
            bias = None if child.bias is None else child.bias.detach().float()
            setattr(module, name, NativeLinear(child.in_features, [(qtype, rows)], bias))
        else:
            linears_on_the_kernels(child, dtype)


def native_from_dense(model: Transformer, dtype: torch.dtype = torch.float32, coarsen: bool = False) -> Transformer:
    """A PyTorch model with dense weights (a Hugging Face folder loaded unquantized) moved onto the native kernels:
    each matrix as a dense part in `dtype` (float32, float16 or bfloat16: the library's F32, F16, BF16 products
    against float32 activations), the embeddings looked up by the library, the blocks on the native stack. In
    float32 the weights are the checkpoint's own values (tests compare this path with transformers). `coarsen`: the
    layers' matrices whose rows split into 32-weight blocks requantized to Q4_0 instead (a draft's form; the head
    and the embeddings stay dense)."""
    refuse_unnative(model.config, "this model")
    qtype = DENSE_TYPES[dtype]

    def rows_of(weight: torch.Tensor) -> torch.Tensor:
        weight = weight.detach().to(dtype).contiguous()
        return weight.view(torch.uint8).reshape(weight.shape[0], -1)

    def dense(module: torch.nn.Linear, layer: bool = True) -> NativeLinear:
        bias = None if module.bias is None else module.bias.detach().float()
        rows = rows_of(module.weight)
        if coarsen and layer and module.in_features % 32 == 0:
            coarse = native.requantize_q4_0(qtype, rows, torch.arange(rows.shape[0]), module.in_features)
            return NativeLinear(module.in_features, [(native.Q4_0, coarse)], bias)
        return NativeLinear(module.in_features, [(qtype, rows)], bias)

    native.claim_threads()
    for block in model.layers:
        block.attn.wqkv, block.attn.wo = dense(block.attn.wqkv), dense(block.attn.wo)
        for mlp in getattr(block.mlp, "experts", [block.mlp]):
            mlp.w_gate_up, mlp.w_down = dense(mlp.w_gate_up), dense(mlp.w_down)
        if hasattr(block.mlp, "router"):
            block.mlp.router = dense(block.mlp.router)
        block.attn.batch_invariant = True
        block.attn.attend_per_query = native.attention
    embed = rows_of(model.embed.weight)
    hidden = model.config.hidden_size
    model.lm_head = NativeLinear(hidden, [(qtype, embed)]) if model.lm_head is None else dense(model.lm_head, False)
    model.embed = GGUFEmbedding(qtype, embed, hidden)
    return _on_the_stack(model)


def _write_index(path: Path, folder: Path, progress: bool, coarsen: bool = False) -> None:
    from .gguf_source import GGUFSource

    source = GGUFSource(path)
    with writing(folder, path) as tmp, ExitStack() as files:
        coarse = files.enter_context(open(tmp / f"{COARSE}.bin", "wb")) if coarsen else None
        tensors = _write_tiles(path, source, tmp / "tiles.bin", progress, coarse=coarse)
        (tmp / "tensors.json").write_text(json.dumps({"architecture": source.arch, "tensors": tensors}))
        source.write_tokenizer_and_config(tmp)


def _write_tiles(path: Path, source, out: Path, progress: bool, *, coarse=None) -> dict:
    """The index of every tensor, checking each; matrices with a tile form are repacked into `out` (not the
    token embeddings when the file has its own output head: only the lookup reads them, from the GGUF rows).
    `coarse`: an open file the layers' matrices stored wider than Q4_0 are requantized into (_coarsened)."""
    tensors = {}
    untied = any(tensor.name == "output.weight" for tensor in source.reader.tensors)
    bar = tqdm(source.reader.tensors, desc=f"indexing {path.name}", unit="tensor", disable=not progress)
    with open(out, "wb") as tiles, bar:
        for tensor in bar:
            entry = {"type": int(tensor.tensor_type), "shape": [int(d) for d in tensor.shape],
                     "offset": int(tensor.data_offset), "bytes": int(tensor.n_bytes)}  # fmt: skip
            _check_finite(path, tensor.name, entry)
            lookup_only = untied and tensor.name == "token_embd.weight"
            rows = None
            if coarse is not None and _coarsened(entry, tensor.name):
                rows = _requantized(entry, np.array(tensor.data), coarse)
            if len(entry["shape"]) == 2 and not lookup_only and not _rope_permuted(source.arch, tensor.name):
                if rows is None:
                    rows = torch.from_numpy(np.array(tensor.data).reshape(entry["shape"][1], -1))  # a writable copy
                tiled = native.repack(entry["type"], rows, entry["shape"][0])
                if tiled is not None:
                    tiles.write(b"\0" * (-tiles.tell() % 64))  # 64-byte aligned
                    entry["tile"] = {"type": tiled[0], "offset": tiles.tell(), "bytes": tiled[1].numel()}
                    tiles.write(tiled[1].numpy().tobytes())
            tensors[tensor.name] = entry
            source.release_pages()
    return tensors


COARSE = "coarse"  # the cached file of requantized rows


def _coarsened(entry: dict, name: str) -> bool:
    """Whether a tensor is requantized to Q4_0 for a coarse draft: a layer's 2-D matrix whose rows split into
    32-weight blocks, stored in more bytes per weight than Q4_0 (Q5_0, Q8_0, Q6_K, F16...). The embeddings stay as
    stored (a lookup reads only one row per token), and so does the output head (the draft's restricted head is
    requantized on its own, draft_head.py)."""
    if not name.startswith("blk.") or len(entry["shape"]) != 2 or entry["type"] not in native.QUANT_TYPES:
        return False
    values, size = native.QUANT_TYPES[entry["type"]]
    q4_values, q4_size = native.QUANT_TYPES[native.Q4_0]
    return size * q4_values > q4_size * values and entry["shape"][0] % q4_values == 0


def _requantized(entry: dict, raw: np.ndarray, coarse) -> torch.Tensor:
    """The tensor's rows requantized to Q4_0, appended to `coarse`; `entry` then points there."""
    k, n = entry["shape"]
    rows = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1))  # F16, F32: their bytes
    q4 = native.requantize_q4_0(entry["type"], rows, torch.arange(n), k)
    coarse.write(b"\0" * (-coarse.tell() % 64))
    entry.update(type=native.Q4_0, file=COARSE, offset=coarse.tell(), bytes=q4.numel(), stored=entry["type"])
    coarse.write(q4.numpy().tobytes())
    return q4


def _rope_permuted(arch: str, name: str) -> bool:
    """Tensors whose rows the loader permutes (their tile form is made after the permutation, at load)."""
    return arch in PERMUTED and name.endswith(("attn_q.weight", "attn_k.weight"))


def _check_finite(path: Path, name: str, entry: dict) -> None:
    """A quantized block's integers are always finite: only its float16 scales can be NaN or infinite."""
    data = np.memmap(path, mode="r", offset=entry["offset"], shape=(entry["bytes"],))
    if entry["type"] == 30:  # BF16: NaN or infinite where all 8 exponent bits are set
        finite = not ((data.view(np.uint16) & 0x7F80) == 0x7F80).any()
    elif entry["type"] in _FLOAT_TYPES:  # F32, F16: checked in place, no float32 copy
        finite = np.isfinite(data.view(_FLOAT_TYPES[entry["type"]])).all()
    elif entry["type"] in _HALF_FIELDS:
        size, offsets = _HALF_FIELDS[entry["type"]]
        blocks = data.reshape(-1, size)
        scales = [blocks[:, o : o + 2].copy().view(np.float16) for o in offsets]
        finite = all(np.isfinite(half).all() for half in scales)
    else:
        return
    if not finite:
        raise ModelLoadError(f"{path}: weight '{name}' holds NaN or infinite values: the model file is damaged")


def _as_float32(raw: np.ndarray, qtype: int) -> np.ndarray:
    """The values of a float tensor's bytes (F32, F16, or BF16: the upper half of a float32)."""
    values = raw.view(_FLOAT_TYPES[qtype])
    if qtype == 30:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)
