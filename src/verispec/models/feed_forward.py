"""The parts of a block that mix no positions: RMSNorm, the feed-forward (SwiGLU, GeGLU, gpt-oss's clamped SwiGLU),
mixtures of experts (Qwen3-MoE's in place of the MLP, Gemma 4's beside it) and Gemma 4's per-layer inputs. model.py
puts them together with attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class RMSNorm(nn.Module):
    """x / rms(x) * (offset + weight), in float32; Gemma's weights come with offset 1, added here in float32 as
    transformers adds it (so in every weight dtype the product is transformers')."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = self.weight.float()
        if self.offset:
            weight = weight + self.offset
        return (x32 * weight).to(x.dtype)


class MLP(nn.Module):
    """act(gate) * up, then down: SwiGLU (silu), GeGLU (gelu, tanh-approximated), or gpt-oss's clamped SwiGLU."""

    def __init__(self, config: ModelConfig, intermediate_size: int = 0, bias: bool = False):
        super().__init__()
        inter = intermediate_size or config.intermediate_size
        self.w_gate_up = nn.Linear(config.hidden_size, 2 * inter, bias=bias)
        self.w_down = nn.Linear(inter, config.hidden_size, bias=bias)
        if config.activation not in ("silu", "gelu_tanh", "swiglu_oai"):
            raise ValueError(f"activation '{config.activation}' is not silu, gelu_tanh or swiglu_oai")
        self.activation, self.alpha, self.limit = config.activation, config.swiglu_alpha, config.swiglu_limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        if self.activation == "gelu_tanh":
            return self.w_down(F.gelu(gate, approximate="tanh") * up)
        if self.activation == "swiglu_oai":
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
            return self.w_down((up + 1) * gate * torch.sigmoid(gate * self.alpha))
        return self.w_down(F.silu(gate) * up)


def through_experts(experts: nn.ModuleList, inputs: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, *,
                    padded: bool) -> torch.Tensor:  # fmt: skip
    """Each row of `inputs` [rows, hidden] through its chosen experts (`chosen` [rows, k]), weighted (`weights`), summed
    in the experts' order. `padded`: each expert's product runs over as many rows as `inputs` holds (the rows that
    chose it first, then zeros), so that a row's result never depends on how many other rows chose the same expert
    (one pass shape, pass_shape.py)."""
    out = torch.zeros_like(inputs)
    for expert in chosen.unique().tolist():
        picked, rank = torch.where(chosen == expert)
        rows = inputs[picked]
        if padded:
            rows = torch.cat([rows, rows.new_zeros(inputs.shape[0] - rows.shape[0], rows.shape[1])])
        out.index_add_(0, picked, experts[expert](rows)[: picked.shape[0]] * weights[picked, rank, None])
    return out


class MixtureOfExperts(nn.Module):
    """Each row through its top k experts (MLPs), weighted by the router's softmax over all experts (float32),
    renormalized over the k chosen where the config says so: transformers' Qwen3-MoE block. Ties among the router's
    probabilities go to the lower expert. Where the config has a shared expert (Qwen3.5-MoE), every row goes through it
    too, weighted by sigmoid(its gate's one output)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=config.moe_biases)
        self.experts = nn.ModuleList(
            MLP(config, config.expert_intermediate_size, bias=config.moe_biases) for _ in range(config.num_experts)
        )
        self.top_k, self.renormalize = config.experts_per_token, config.norm_topk_prob
        self.topk_softmax = config.router_softmax_topk
        shared = config.shared_expert_intermediate_size
        self.shared = MLP(config, shared) if shared else None
        self.shared_gate = nn.Linear(config.hidden_size, 1, bias=False) if shared else None
        self.padded = False  # each expert over every row's count (through_experts): set with a pass shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.topk_softmax:  # gpt-oss: the k largest logits, then their softmax
            logits, chosen = torch.topk(self.router(rows), self.top_k, dim=-1)
            weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
        else:
            probs = torch.softmax(self.router(rows), dim=-1, dtype=torch.float32)
            weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        out = through_experts(self.experts, rows, chosen, weights.to(x.dtype), padded=self.padded)
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(rows)) * self.shared(rows)
        return out.reshape(x.shape)


class GemmaMixture(nn.Module):
    """Gemma 4's mixture beside its MLP: post_1(mlp output) + post_2(experts(pre_2(x))), x the layer's stream before
    the MLP's norm. The router reads x RMS-normalised (no weight), times a learned vector and 1 / sqrt(hidden): the
    softmax over all experts, the top k renormalized, each times its expert's learned scale."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        norm = (config.hidden_size, config.rms_norm_eps, config.norm_offset)
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.router_scale = nn.Parameter(torch.ones(config.hidden_size))
        self.expert_scale = nn.Parameter(torch.ones(config.num_experts))
        self.experts = nn.ModuleList(MLP(config, config.expert_intermediate_size) for _ in range(config.num_experts))
        self.pre_norm, self.mlp_post_norm, self.post_norm = RMSNorm(*norm), RMSNorm(*norm), RMSNorm(*norm)
        self.top_k, self.eps = config.experts_per_token, config.rms_norm_eps
        self.hidden_scale = config.hidden_size**-0.5
        self.padded = False  # as MixtureOfExperts'

    def forward(self, x: torch.Tensor, mlp_out: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        r32 = rows.float()
        routed = (r32 * torch.pow(r32.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)).to(rows.dtype)
        scores = self.router(routed * self.router_scale * self.hidden_scale)
        weights, chosen = torch.topk(torch.softmax(scores, dim=-1, dtype=torch.float32), self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True) * self.expert_scale.float()[chosen]
        out = through_experts(self.experts, self.pre_norm(rows), chosen, weights.to(x.dtype), padded=self.padded)
        return self.mlp_post_norm(mlp_out) + self.post_norm(out.reshape(x.shape))


class PerLayerInput(nn.Module):
    """Gemma 4's per-layer input, after a layer's MLP: norm(up(act(gate(x)) * input)), added to the stream."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.per_layer_input_size, bias=False)
        self.up = nn.Linear(config.per_layer_input_size, config.hidden_size, bias=False)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset)

    def forward(self, x: torch.Tensor, per_layer: torch.Tensor) -> torch.Tensor:
        return self.norm(self.up(F.gelu(self.gate(x), approximate="tanh") * per_layer))


class PerLayerInputs(nn.Module):
    """Every layer's per-layer input of a pass (Gemma 4): (norm(project(embedded) / sqrt(hidden)) + a second
    embedding of the tokens times sqrt(its size)) / sqrt(2), [batch, seq, layers, size]."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.layers, self.size = config.num_layers, config.per_layer_input_size
        self.embed = nn.Embedding(config.per_layer_vocab, self.layers * self.size)
        self.project = nn.Linear(config.hidden_size, self.layers * self.size, bias=False)
        self.norm = RMSNorm(self.size, config.rms_norm_eps, config.norm_offset)
        self.hidden_scale = config.hidden_size**-0.5

    def forward(self, tokens: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        shape = (*tokens.shape, self.layers, self.size)
        looked_up = self.embed(tokens)
        scale = torch.tensor(self.size**0.5, dtype=torch.float32).to(looked_up.dtype)  # as transformers rounds it
        looked_up = (looked_up * scale).reshape(shape)
        projected = self.norm((self.project(embedded) * self.hidden_scale).reshape(shape))
        return (projected + looked_up) * 2.0**-0.5
