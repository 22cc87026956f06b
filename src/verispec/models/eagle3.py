"""An EAGLE-3 head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test"): a drafter trained for one target, reading that target's hidden states. Its checkpoints are read
by eagle3_checkpoint.py; engine/eagle3.py drafts with it.

The head's row at position i reads the token at i + 1 and the target's features at i, and predicts the token at i + 2:

    f   = [x_low; x_mid; x_high]         the residual streams entering three target layers at row i (3 x target hidden)
    g   = fc(f)                          (fc_norm(f) first, where the head has one: norm_before_fc)
    a   = [input_norm(embed(token)); hidden_norm(g)]            2 x hidden: the attention's input
    h   = r + o(attention(a))            r = g, or hidden_norm(g) where norm_before_residual
    out = h + mlp(post_attention_norm(h))                       the row's prenorm output
    logits = lm_head(norm(out))          over its draft vocabulary; draft id d is target id d2t[d]

One Llama decoder layer (rotary at the row's position, grouped-query attention over the head's own KV cache). For a
further draft the head reads its own prenorm output in place of g (no fc): the chain of EAGLE's training-time test,
as llama.cpp, vLLM and SGLang run it. The embeddings are the head's own where its checkpoint has them, else the
target's (as looked up, unscaled).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .kv_cache import KVCache
from .model import MLP, RMSNorm, rotate_half
from .rope import rotary_table
from .trained_drafter import on_the_kernels as coarse


@dataclass(frozen=True, kw_only=True)
class Eagle3Spec:
    """A head's shape as its checkpoint says it."""

    layer: ModelConfig  # its decoder layer (one Llama layer of the head's hidden size) and rotary
    target_hidden: int  # the hidden size of the target it reads
    target_layers: tuple[int, ...] | None  # the target layers whose inputs it reads; None: default_layers
    draft_vocab: int  # its head's rows
    vocab: int  # the target vocabulary it drafts in
    own_embeddings: bool  # its checkpoint has embeddings (else it looks tokens up in the target's)
    own_head: bool = True  # its checkpoint has an output head (else the target's, over the whole vocabulary)
    norm_before_residual: bool = False  # the attention's residual is hidden_norm(g), not g (RedHat's speculators)
    norm_before_fc: bool = False  # f is RMS-normed before fc (EAGLE 3.1)

    @property
    def hidden(self) -> int:
        return self.layer.hidden_size

    def layers_of(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose inputs it reads, for a target of `target_layers` layers."""
        return self.target_layers if self.target_layers is not None else default_layers(target_layers)


def default_layers(layers: int) -> tuple[int, int, int]:
    """The low, middle and high layers a head reads when its checkpoint names none: the inputs of layers 2, n / 2 and
    n - 3 (vLLM's, SGLang's and llama.cpp's choice, which the published heads were trained with)."""
    return (2, layers // 2, layers - 3)


class Eagle3Head(nn.Module):
    def __init__(self, spec: Eagle3Spec):
        super().__init__()
        self.spec = spec
        c = spec.layer
        hidden, eps = c.hidden_size, c.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_size
        self.fc_norm = RMSNorm(3 * spec.target_hidden, eps) if spec.norm_before_fc else None
        self.fc = nn.Linear(3 * spec.target_hidden, hidden, bias=False)
        self.embed = nn.Embedding(spec.vocab, hidden) if spec.own_embeddings else None
        self.input_norm, self.hidden_norm = RMSNorm(hidden, eps), RMSNorm(hidden, eps)
        self.wqkv = nn.Linear(2 * hidden, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=False)
        self.wo = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.post_attention_norm = RMSNorm(hidden, eps)
        self.mlp = MLP(c)
        self.norm = RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, spec.draft_vocab, bias=False) if spec.own_head else None
        self.register_buffer("d2t", torch.arange(spec.draft_vocab), persistent=False)  # target id of each row
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def new_cache(self, slots: int, max_len: int, num_blocks: int | None = None) -> KVCache:
        """The head's KV cache (one layer), float32."""
        return KVCache(self.spec.layer, slots, max_len=max_len, dtype=torch.float32, device=self.fc_device,
                       num_blocks=num_blocks)  # fmt: skip

    @property
    def fc_device(self) -> torch.device:
        return self.norm.weight.device

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """g of the target's features [..., 3 x target hidden] -> [..., hidden], float32."""
        features = features.float()
        if self.fc_norm is not None:
            features = self.fc_norm(features)
        return self.fc(features).float()

    def rope(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [at least `length` positions, head dim] (float32), made once and grown."""
        if self._rope is None or self._rope[0].shape[0] < length:
            size = max(length, 2 * (self._rope[0].shape[0] if self._rope is not None else 1024))
            c = self.spec.layer
            cos, sin = rotary_table(c.rope_theta, self.head_dim, size, c.rope_scaling)
            self._rope = (cos.float().to(self.fc_device), sin.float().to(self.fc_device))
        return self._rope

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, *, cache: KVCache, slots: list[int],
                starts: list[int], positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The layer over rows [batch, seq]: `embeds` their tokens' embeddings, `hidden` their g (or the head's own
        output a row before), written to `cache` at starts[b] + t of slots[b] (the slots' lengths set past them);
        `positions` [batch, seq] their rotary positions; `visible` [batch, 1, seq, span] the keys each row attends to
        (span: the largest start + seq). Returns each row's prenorm output [batch, seq, hidden]."""
        batch, seq, _ = hidden.shape
        hidden = hidden.float()
        normed = self.hidden_norm(hidden)
        residual = normed if self.spec.norm_before_residual else hidden
        x = torch.cat([self.input_norm(embeds.float()), normed], dim=-1)
        attended = self._attend(self.wqkv(x).float(), cache=cache, slots=slots, starts=starts, positions=positions,
                                visible=visible)  # fmt: skip
        h = residual + self.wo(attended).float()
        return h + self.mlp(self.post_attention_norm(h)).float()

    def _attend(self, qkv: torch.Tensor, *, cache: KVCache, slots: list[int], starts: list[int],
                positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        batch, seq, _ = qkv.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        cos, sin = self.rope(int(positions.max()) + 1)
        cos, sin = cos[positions].unsqueeze(2), sin[positions].unsqueeze(2)
        q = q.reshape(batch, seq, heads, dim)
        k = k.reshape(batch, seq, kv_heads, dim)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        for slot, start in zip(slots, starts, strict=True):
            cache.ensure(slot, start + seq, start)
        where = cache.pass_pages(slots, starts, seq)
        cache.keys[0][where.written] = k.reshape(batch * seq, kv_heads, dim).to(cache.keys[0].dtype)
        cache.values[0][where.written] = v.reshape(batch * seq, kv_heads, dim).to(cache.values[0].dtype)
        for slot, start in zip(slots, starts, strict=True):
            cache.lengths[slot] = start + seq
        span = visible.shape[-1]
        keys, values = where.keys_values(0, cache.keys[0], cache.values[0], span=span)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.float(), values.float(), attn_mask=visible,
                                             enable_gqa=True)  # fmt: skip
        return out.transpose(1, 2).reshape(batch, seq, heads * dim)

    def logits(self, prenorm: torch.Tensor, target=None) -> torch.Tensor:
        """float32 logits over the head's draft vocabulary (row d: target id d2t[d]) of prenorm outputs; a head without
        its own output head takes the target's (`target`, a Transformer), over the whole vocabulary."""
        normed = self.norm(prenorm.float())
        if self.lm_head is None:
            return target.head_logits(normed.to(target.dtype))
        return self.lm_head(normed).float()

    def embeddings(self, tokens: torch.Tensor, target) -> torch.Tensor:
        """The tokens' embeddings: the head's own, else the target's (`target`, a Transformer) as looked up."""
        table = self.embed if self.embed is not None else target.embed
        return table(tokens).float()

    def on_the_kernels(self) -> None:
        """Its matrices on the native kernels in Q4_0 (requantized once, as a draft's form; a matrix whose rows do not
        split into 32-weight blocks stays float32): the form beside a target on the native stack."""
        from ..kernels import native

        native.claim_threads()
        self.fc, self.wqkv, self.wo, self.lm_head = (coarse(m) for m in (self.fc, self.wqkv, self.wo, self.lm_head))
        self.mlp.w_gate_up, self.mlp.w_down = coarse(self.mlp.w_gate_up), coarse(self.mlp.w_down)

    def to_target_vocab(self, logits: torch.Tensor, size: int) -> torch.Tensor:
        """Draft-vocabulary logits [..., draft vocab] spread over the target's `size` ids (the others -inf)."""
        if self.lm_head is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], size), float("-inf"))
        full[..., self.d2t] = logits
        return full


def visible_chain(starts: list[int], lengths: list[int], seq: int, firsts: list[int] | None = None) -> torch.Tensor:
    """The keys each row of a chain pass sees [batch, 1, seq, max start + seq]: its slot's keys from firsts[b] (0 by
    default) up to its own (row t of batch row b is stored at starts[b] + t; rows past lengths[b] are padding and see
    themselves only)."""
    span = max(starts) + seq
    keys = torch.arange(span)
    mask = torch.zeros(len(starts), 1, seq, span, dtype=torch.bool)
    for b, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        first = firsts[b] if firsts is not None else 0
        for t in range(seq):
            mask[b, 0, t] = (keys >= first) & (keys <= start + t) if t < length else keys == start + t
    return mask
