"""Qwen3.5's family (dense and MoE): what its files hold beyond a Llama's (its entry in families.py).

Three of four layers a Gated DeltaNet (linear attention over a recurrent state, delta_net.py) in place of attention,
the others a gated attention with a partial rotary; Qwen3.5-MoE's mixture in every layer with a shared expert; and the
checkpoint's MTP layer (mtp.py), the drafter it was trained with. Its GGUF files run their matrices on the native
kernels and the blocks on PyTorch: the native stack has no Gated DeltaNet.
"""

from __future__ import annotations

import torch

from ..kernels import native
from ..kernels.linear import GGUFEmbedding
from .config import ModelConfig
from .family import Family, Shape
from .gguf_config import GGUFKeys
from .hf_config import JsonFields
from .model import Transformer
from .mtp import transformer
from .native_blocks import FileTensors, mlp_matrices

# a Hugging Face folder's Gated DeltaNet layer, and Qwen3.5-MoE's shared expert and its gate
HF_NAMES = {
    "ssm_qkv": "linear_attn.in_proj_qkv.weight", "ssm_z": "linear_attn.in_proj_z.weight",
    "ssm_b": "linear_attn.in_proj_b.weight", "ssm_a": "linear_attn.in_proj_a.weight",
    "ssm_conv": "linear_attn.conv1d.weight", "ssm_dt_bias": "linear_attn.dt_bias", "ssm_a_log": "linear_attn.A_log",
    "ssm_norm": "linear_attn.norm.weight", "ssm_out": "linear_attn.out_proj.weight",
    "shared.gate": "mlp.shared_expert.gate_proj.weight", "shared.up": "mlp.shared_expert.up_proj.weight",
    "shared.down": "mlp.shared_expert.down_proj.weight", "shared_gate": "mlp.shared_expert_gate.weight",
}  # fmt: skip
# a GGUF file's Gated DeltaNet block; its MLP's input norm is post_attention_norm; q holds the gate
GGUF_NAMES = {
    "ssm_qkv": "attn_qkv.weight", "ssm_z": "attn_gate.weight", "ssm_b": "ssm_beta.weight", "ssm_a": "ssm_alpha.weight",
    "ssm_conv": "ssm_conv1d.weight", "ssm_dt_bias": "ssm_dt.bias", "ssm_a_log": "ssm_a", "ssm_norm": "ssm_norm.weight",
    "ssm_out": "ssm_out.weight", "mlp_norm": "post_attention_norm.weight",
    "shared.gate": "ffn_gate_shexp.weight", "shared.up": "ffn_up_shexp.weight", "shared.down": "ffn_down_shexp.weight",
    "shared_gate": "ffn_gate_inp_shexp.weight",
}  # fmt: skip


def hf_fields(f: JsonFields, shape: Shape) -> dict:
    """Qwen3.5: which layers are Gated DeltaNets (layer_types, else every full_attention_interval-th layer attends),
    their shape, the attention's output gate and partial rotary, and the MTP layers."""
    layers, head_dim = shape.layers, shape.head_dim
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


def hf_moe_fields(f: JsonFields, shape: Shape) -> dict:
    """Qwen3.5-MoE's: every layer a mixture, the chosen experts' weights renormalized, a shared expert beside them;
    and Qwen3.5's."""
    experts = dict(num_experts=int(f.require("num_experts")), experts_per_token=int(f.require("num_experts_per_tok")),
                   expert_intermediate_size=int(f.require("moe_intermediate_size")), norm_topk_prob=True,
                   shared_expert_intermediate_size=int(f.require("shared_expert_intermediate_size")))  # fmt: skip
    return experts | hf_fields(f, shape)


def hf_fetch(tensor, name: str) -> torch.Tensor | None:
    """A DeltaNet's convolution as the model takes it: [channels, 1, width] -> [channels, width]."""
    return tensor().squeeze(1) if name.rpartition(".")[2] == "ssm_conv" else None


def gguf_fields(k: GGUFKeys, shape: Shape) -> dict:
    """Qwen3.5 as llama.cpp's converter writes it: the recurrent (Gated DeltaNet) blocks flagged one per block (the
    MTP blocks last), their heads in ssm.* keys (group_count key heads of state_size, time_step_rank value heads of
    inner_size / time_step_rank, in its tiled order); the attention gated and partly rotated. Its norms hold 1 + w
    already."""
    layers, rotary, mtp = shape.layers, shape.rotary, shape.trailing
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


def gguf_moe_fields(k, shape: Shape) -> dict:
    """Qwen3.5-MoE's: every layer a mixture, renormalized, with a shared expert; and Qwen3.5's."""
    experts = dict(num_experts=int(k.get("expert_count", 0)), experts_per_token=int(k.require("expert_used_count")),
                   expert_intermediate_size=int(k.require("expert_feed_forward_length")), norm_topk_prob=True,
                   shared_expert_intermediate_size=int(k.require("expert_shared_feed_forward_length")))  # fmt: skip
    return experts | gguf_fields(k, shape)


def gguf_fetch(name: str, weight: torch.Tensor) -> torch.Tensor:
    """llama.cpp's converter stores A as -exp(A_log): read back as A_log. (Its value heads stay in its tiled order,
    which the config says: `linear_heads_tiled`.)"""
    return torch.log(-weight) if name.endswith(".ssm_a_log") else weight


def native_build(config: ModelConfig, tensors: FileTensors, family: Family) -> Transformer:
    """A Qwen3.5 file (linear attention beside gated attention, an MTP block after the layers) with every matrix on
    the native kernels as the file stores it, and the rest on PyTorch: the native stack has no Gated DeltaNet, so the
    blocks run one by one (no `fused_blocks`). Each product sums in the kernels' fixed order and the attention runs
    per query, so a verify row's result is its own whatever shares the pass, as on the stack."""
    with torch.device("meta"):
        model = transformer(config)
    state = {"norm.weight": tensors.floats("output_norm.weight")}
    for i, block in enumerate(model.layers):
        state |= _block(block, tensors, config, layer=i, prefix=f"layers.{i}.")
    embed_type, embed = tensors.raw_rows("token_embd.weight")
    model.embed = GGUFEmbedding(embed_type, embed, config.hidden_size)
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    model.lm_head = tensors.linear([head], config.hidden_size)
    if model.mtp is not None:  # block N (the layers' count): the MTP layer, its input projection and norms
        p, mtp = f"blk.{config.num_layers}.", model.mtp
        mtp.fc = tensors.linear([p + "nextn.eh_proj.weight"], 2 * config.hidden_size)
        names = {"enorm": "nextn.enorm", "hnorm": "nextn.hnorm", "norm": "nextn.shared_head_norm"}
        state |= {f"mtp.{ours}.weight": tensors.floats(p + theirs + ".weight") for ours, theirs in names.items()}
        state |= _block(
            mtp.layers[0], tensors, mtp.config, layer=0, prefix="mtp.layers.0.", block_index=config.num_layers
        )
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval()


def _block(
    block, tensors: FileTensors, config: ModelConfig, layer: int, prefix: str, block_index: int | None = None
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
    mlp_matrices(block, tensors, config=config, layer=layer, block_index=block_index)
    if config.shared_expert_intermediate_size:
        shared = block.mlp.shared
        shared.w_gate_up = tensors.linear([p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"], hidden)
        shared.w_down = tensors.linear([p + "ffn_down_shexp.weight"], config.shared_expert_intermediate_size)
        block.mlp.shared_gate = tensors.linear([p + "ffn_gate_inp_shexp.weight"], hidden)
    return state | {prefix + "attn_norm.weight": tensors.floats(p + "attn_norm.weight"),
                    prefix + "mlp_norm.weight": tensors.floats(p + "post_attention_norm.weight")}  # fmt: skip
