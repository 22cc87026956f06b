"""gpt-oss's family: what its files hold beyond a Llama's (its entry in families.py).

Sinks in every attention, biases on q/k/v and on its output, every layer a mixture (biases on the router and the
experts, the softmax over the chosen experts' logits), the clamped SwiGLU. Its GGUF files (MXFP4 experts) run every
matrix on the native kernels and the blocks on PyTorch: the native stack has no sinks or biased experts.
"""

from __future__ import annotations

import torch

from ..kernels.linear import NativeLinear
from .config import ModelConfig
from .family import Family, Shape
from .gguf_config import GGUFKeys
from .hf_config import JsonFields
from .model import Transformer
from .native_blocks import FileTensors, matrices_on_the_kernels

# a GGUF file's sinks and biases; its MLP's input norm is post_attention_norm
GGUF_NAMES = {"sinks": "attn_sinks.weight", "o_bias": "attn_output.bias", "router_bias": "ffn_gate_inp.bias",
              "mlp_norm": "post_attention_norm.weight"}  # fmt: skip


def hf_fields(f: JsonFields, shape: Shape) -> dict:
    """gpt-oss: sinks in every attention, biases on its output and on the mixture's router and experts (every layer a
    mixture, the softmax over the chosen experts' logits), the clamped SwiGLU."""
    bias = bool(f.get("attention_bias", False))
    experts = dict(num_experts=int(f.require("num_local_experts")),
                   experts_per_token=int(f.require("num_experts_per_tok")),
                   expert_intermediate_size=int(f.require("intermediate_size")))  # fmt: skip
    alpha, limit = float(f.get("swiglu_alpha", 1.702)), float(f.get("swiglu_limit", 7.0))
    return experts | dict(qkv_bias=bias, attn_sinks=True, o_bias=bias, moe_biases=True, router_softmax_topk=True,
                          swiglu_alpha=alpha, swiglu_limit=limit)  # fmt: skip


def hf_where(source, base: str, short: str) -> tuple[str, None] | None:
    """gpt-oss's router and its experts' fused tensors (all experts in one: gate_up_proj [experts, hidden, 2 x inter],
    gate and up interleaved by column; down_proj [experts, inter, hidden]; their biases)."""
    if not (short.startswith("expert") or short.startswith("router")):
        return None
    if short.startswith("router"):
        return base + ("mlp.router.bias" if short == "router_bias" else "mlp.router.weight"), None
    kind = short.partition(".")[2]
    fused = "down_proj" if kind.startswith("down") else "gate_up_proj"
    return f"{base}mlp.experts.{fused}{'_bias' if kind.endswith('_bias') else ''}", None


def hf_fetch(tensor, name: str) -> torch.Tensor | None:
    """One expert's matrix (as a Linear's weight [out, in]) or bias out of gpt-oss's fused expert tensors."""
    if ".expert" not in f".{name}":
        return None
    short = name.rpartition("expert")[2]  # "3.gate", "3.up_bias"
    index, _, kind = short.partition(".")
    fused = tensor()[int(index)]
    if kind.startswith("down"):
        return fused if kind == "down_bias" else fused.T.contiguous()
    part = fused[..., 0::2] if kind.startswith("gate") else fused[..., 1::2]  # columns interleaved gate, up
    return part if kind.endswith("_bias") else part.T.contiguous()


def gguf_fields(k: GGUFKeys, shape: Shape) -> dict:
    """gpt-oss as llama.cpp computes it: every layer a mixture, the softmax over the chosen logits, biases
    (models/config.py); sinks, an output bias, the clamped SwiGLU with its fixed constants (llama.cpp's alpha 1.702
    and limit 7, stored in no key), its sliding layers every other one from the first (its entry)."""
    experts = dict(num_experts=int(k.get("expert_count", 0)), experts_per_token=int(k.require("expert_used_count")),
                   expert_intermediate_size=int(k.require("expert_feed_forward_length")), moe_biases=True,
                   router_softmax_topk=True)  # fmt: skip
    return experts | dict(attn_sinks=True, o_bias="blk.0.attn_output.bias" in shape.tensors, swiglu_alpha=1.702,
                          swiglu_limit=7.0)  # fmt: skip


def gguf_where(config: ModelConfig, base: str, short: str) -> tuple[str, tuple[int, int]] | None:
    """Expert e's bias: row e of ffn_{gate,up,down}_exps.bias [experts, rows]."""
    expert, _, kind = short.partition(".")
    if not (expert.startswith("expert") and kind.endswith("_bias")):
        return None
    e = int(expert.removeprefix("expert"))
    return f"{base}ffn_{kind.removesuffix('_bias')}_exps.bias", (e, e + 1)


def gguf_fetch(name: str, weight: torch.Tensor) -> torch.Tensor:
    """An expert's bias: one row of its 2-D tensor."""
    return weight.reshape(-1) if name.endswith("_bias") else weight


def native_build(config: ModelConfig, tensors: FileTensors, family: Family) -> Transformer:
    """A gpt-oss file with every matrix on the native kernels as the file stores it (its MXFP4 experts too, each
    expert's rows of the 3-D tensors), and the rest on PyTorch, block by block: its attention with sinks (PyTorch's),
    the biases added to the products, the router's softmax over the chosen experts, the clamped SwiGLU."""
    return matrices_on_the_kernels(config, tensors, _block)


def _block(block: torch.nn.Module, tensors: FileTensors, config: ModelConfig, layer: int) -> dict:
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
