"""Shape of a decoder: Llama-family (Llama, Qwen2/3, Qwen3-MoE, Mistral, SmolLM2/3, Phi-3), Gemma 2/3, and Qwen3.5's
hybrid of Gated DeltaNet (linear attention) and gated full attention.

Every field past `head_dim` describes a departure from a plain Llama block, and its default is Llama's, so a
config written before they existed still reads as what it was. Which source field sets each one, and what
is refused: hf_config.py, gguf_config.py, docs/models.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from .rope import RopeScaling


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    head_dim: int = 0  # 0: hidden_size // num_heads
    # the global rotary's scaling (rope.py), None: none
    rope_scaling: RopeScaling | None = None
    # the base of the sliding layers' own unscaled rotary (Gemma 3), 0: they share the global one
    rope_local_theta: float = 0.0
    # layers without rotary embedding (SmolLM3)
    no_rope_layers: tuple[int, ...] = ()
    # per layer, how many keys a query sees (itself and those before it) or 0: all; () for all layers 0
    layer_windows: tuple[int, ...] = ()
    # per-head RMSNorm of q and k before the rotary (Qwen3, Gemma 3)
    qk_norm: bool = False
    # RMSNorm of the attention's and the MLP's outputs before each residual add (Gemma 2, 3)
    post_norms: bool = False
    # every RMSNorm multiplies by (norm_offset + weight): 1.0 for Gemma's own weights (GGUF files hold 1 + w)
    norm_offset: float = 0.0
    activation: str = "silu"  # the gated MLP's: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size) (Gemma)
    query_scale: float = 0.0  # attention scores' scale, 0: head_size ** -0.5
    attn_softcap: float = 0.0  # scores -> cap * tanh(scores / cap) before the softmax (Gemma 2), 0: none
    final_softcap: float = 0.0  # the same on the output logits (Gemma 2), 0: none
    # a mixture of experts in place of the MLP (Qwen3-MoE): each row's top experts_per_token of num_experts gated
    # MLPs of expert_intermediate_size, weighted by the router's softmax (renormalized over them: norm_topk_prob)
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    dense_layers: tuple[int, ...] = ()  # layers that keep a dense MLP all the same
    # beside the experts, a shared expert every row goes through, weighted by sigmoid(a gate of the row) (Qwen3.5-MoE);
    # its MLP's size, 0: none
    shared_expert_intermediate_size: int = 0
    # the rotary turns the first rotary_dim of each head's dimensions only (Qwen3.5: a quarter), 0: all of them
    rotary_dim: int = 0
    # the attention's output times sigmoid(a gate the query projection also makes, per head) (Qwen3.5)
    attn_output_gate: bool = False
    # layers whose token mixer is a Gated DeltaNet (delta_net.py) in place of attention (Qwen3.5), and its shape:
    # key/query heads and their size, value heads and their size, the causal convolution's width
    linear_layers: tuple[int, ...] = ()
    linear_key_heads: int = 0
    linear_key_dim: int = 0
    linear_value_heads: int = 0
    linear_value_dim: int = 0
    linear_conv_kernel: int = 0
    # where value heads outnumber key heads: value head h reads key head h % key heads (llama.cpp's tiled order) rather
    # than h // (value heads / key heads) (transformers' grouped order)
    linear_heads_tiled: bool = False
    # multi-token-prediction layers the checkpoint carries (Qwen3.5's drafter: mtp.py), 0: none
    mtp_layers: int = 0
    # per head a learned sink logit in every attention softmax: it takes its share and adds no value (gpt-oss)
    attn_sinks: bool = False
    o_bias: bool = False  # a bias on the attention's output projection (gpt-oss)
    # gpt-oss's mixture: biases on the router and the experts' products, the softmax over the chosen k logits only
    moe_biases: bool = False
    router_softmax_topk: bool = False
    # activation "swiglu_oai" (gpt-oss): (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit)
    swiglu_alpha: float = 0.0
    swiglu_limit: float = 0.0
    # Gemma 4: per layer the head size and kv heads where layers differ (its full-attention layers' wider heads), ()
    # for all head_size and num_kv_heads
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    # per layer, the earlier layer whose keys and values it attends to (its own: it makes them), () for all their own
    kv_sources: tuple[int, ...] = ()
    k_eq_v: bool = False  # the full-attention layers' values are their key projection (before the key's norm)
    v_norm: bool = False  # values RMS-normalised (no weight) before the cache
    # per-layer inputs: a second embedding of per_layer_vocab rows, per_layer_input_size per layer, and a projection
    # of the embeddings, both fed to each layer through a gate after its MLP, 0: none
    per_layer_input_size: int = 0
    per_layer_vocab: int = 0
    layer_scalar: bool = False  # each layer's output times a learned scalar
    wide_mlp_layers: tuple[int, ...] = ()  # layers whose MLP is twice intermediate_size
    # Gemma 4's 26B-A4B: the mixture (num_experts ...) beside the dense MLP in every layer, not in place of it
    moe_beside_mlp: bool = False

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    def head_size_of(self, layer: int) -> int:
        return self.layer_head_dims[layer] if self.layer_head_dims else self.head_size

    def kv_heads_of(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_kv_heads

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values layer `layer` attends to (itself, unless it shares an earlier one's)."""
        return self.kv_sources[layer] if self.kv_sources else layer

    def cached_kv_heads(self, layer: int) -> int:
        """The kv heads layer `layer` keeps in the cache: none for a linear-attention layer or one sharing another's."""
        return 0 if self.linear(layer) or self.kv_source(layer) != layer else self.kv_heads_of(layer)

    @property
    def rotary_size(self) -> int:
        """How many of a head's dimensions the rotary turns."""
        return self.rotary_dim or self.head_size

    @property
    def hybrid(self) -> bool:
        """Whether some layers carry a recurrent state (linear attention) beside the KV cache."""
        return bool(self.linear_layers)

    def linear(self, layer: int) -> bool:
        """Whether layer `layer`'s token mixer is a Gated DeltaNet."""
        return layer in self.linear_layers

    @property
    def linear_conv_dim(self) -> int:
        """The channels the DeltaNet's convolution runs over: queries, keys and values."""
        return 2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim

    @property
    def scale(self) -> float:
        return self.query_scale or self.head_size**-0.5

    def moe(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is a mixture of experts (beside the MLP, where moe_beside_mlp)."""
        return self.num_experts > 0 and layer not in self.dense_layers

    def window(self, layer: int) -> int:
        """The keys layer `layer`'s queries see (0: all of them)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def rope_table(self, layer: int) -> int:
        """Which rotary table layer `layer` takes: 0 (the global one), 1 (the sliding layers'), -1 (none)."""
        if layer in self.no_rope_layers:
            return -1
        return 1 if self.rope_local_theta and self.window(layer) else 0

    def rope_table_specs(self) -> list[tuple[float, RopeScaling | None, int]]:
        """(theta, scaling, size) of each rotary table the layers take; its size, the head dimensions it turns."""
        sizes = {self.rope_table(i): self.head_size_of(i) for i in range(self.num_layers) if self.layer_head_dims}
        size = sizes.get(0, self.rotary_size)
        tables = [(self.rope_theta, self.rope_scaling, size)]
        return tables + [(self.rope_local_theta, None, sizes.get(1, size))] if self.rope_local_theta else tables

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        values = json.loads(text)
        for field in fields(cls):
            if isinstance(values.get(field.name), list):
                values[field.name] = tuple(values[field.name])
        if values.get("rope_scaling") is not None:
            scaling = values["rope_scaling"]
            values["rope_scaling"] = RopeScaling(**{**scaling, "factors": tuple(scaling.get("factors", ()))})
        return cls(**values)
