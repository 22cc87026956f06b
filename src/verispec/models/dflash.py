"""A DFlash block drafter ("DFlash: Block Diffusion for Flash Speculative Decoding", z-lab): a drafter
trained for one target that proposes a whole block of tokens in one pass, reading the target's hidden states. Its
checkpoints are read by dflash_checkpoint.py; engine/dflash.py drafts with it.

The context: the target's features at every position p it has computed (the residual streams entering its chosen
layers, side by side), fused once per position:

    g_p = hidden_norm(fc([x_1; ...; x_m]))                 m target layers: m x target hidden -> hidden

and, per draft layer l, written to the drafter's cache as keys and values at p (rotary at p):

    K_l[p] = rope(k_norm(wk_l g_p)),  V_l[p] = wv_l g_p

The block: B rows at positions n .. n + B - 1 holding [the sequence's newest token, MASK x (B - 1)], embedded with the
target's embeddings; each Qwen3 decoder layer (q/k norms, rotary, grouped-query attention, SwiGLU) attends, every row
alike, to the whole context and to every row of the block (no causal mask inside the block). The final norm, then
the target's output head: row i + 1's logits draft the token at n + 1 + i. A block holds at most `block_size` rows
(the trained size); llama.cpp runs k + 1 rows for k drafts, and so does verispec.
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
class DFlashSpec:
    """A drafter's shape as its checkpoint says it."""

    layers: ModelConfig  # its decoder layers (Qwen3 layers of the target's hidden size) and rotary
    target_hidden: int  # the hidden size of the target it reads
    target_layers: tuple[int, ...]  # the target layers whose inputs it reads (the checkpoint's ids + 1)
    block_size: int  # the trained block: at most block_size - 1 drafts a pass
    mask_token: int
    vocab: int  # the target vocabulary it drafts in
    own_embeddings: bool = False  # its checkpoint has embeddings (else the target's)
    own_head: bool = False  # its checkpoint has an output head (else the target's)

    @property
    def hidden(self) -> int:
        return self.layers.hidden_size


class DFlashLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_size
        hidden, eps = c.hidden_size, c.rms_norm_eps
        self.input_norm, self.post_attention_norm = RMSNorm(hidden, eps), RMSNorm(hidden, eps)
        self.wq = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(hidden, 2 * self.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm, self.k_norm = RMSNorm(self.head_dim, eps), RMSNorm(self.head_dim, eps)
        self.mlp = MLP(c)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, turned) and values [rows, kv heads, head dim] of rows x [rows, hidden]."""
        k, v = self.wkv(x).float().view(x.shape[0], 2, self.kv_heads, self.head_dim).unbind(1)
        k = self.k_norm(k)
        return k * cos + rotate_half(k) * sin, v


class DFlashDrafter(nn.Module):
    def __init__(self, spec: DFlashSpec):
        super().__init__()
        self.spec = spec
        c = spec.layers
        self.fc = nn.Linear(len(spec.target_layers) * spec.target_hidden, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.embed = nn.Embedding(spec.vocab, c.hidden_size) if spec.own_embeddings else None
        self.lm_head = nn.Linear(c.hidden_size, spec.vocab, bias=False) if spec.own_head else None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def new_cache(self, slots: int, max_len: int, num_blocks: int | None = None) -> KVCache:
        """The drafter's keys and values of the context (one layer each of its layers), float32."""
        return KVCache(self.spec.layers, slots, max_len=max_len, dtype=torch.float32, device=self.device,
                       num_blocks=num_blocks)  # fmt: skip

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [rows, 1, head dim] at `positions` (float32); the table made once and grown."""
        length = int(positions.max()) + 1
        if self._rope is None or self._rope[0].shape[0] < length:
            size = max(length, 2 * (self._rope[0].shape[0] if self._rope is not None else 1024))
            c = self.spec.layers
            cos, sin = rotary_table(c.rope_theta, c.head_size, size, c.rope_scaling)
            self._rope = (cos.float().to(self.device), sin.float().to(self.device))
        return self._rope[0][positions].unsqueeze(1), self._rope[1][positions].unsqueeze(1)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """g of the target's features [..., m x target hidden] -> [..., hidden], float32."""
        return self.hidden_norm(self.fc(features.float()).float())

    def inject(self, g: torch.Tensor, positions: torch.Tensor, *, cache: KVCache, slot: int,
               stored: list[int]) -> None:  # fmt: skip
        """The context's keys and values of rows g [rows, hidden] at rotary `positions` into `cache`, slot `slot`, at
        its positions `stored` (the slot's length set past the last)."""
        cos, sin = self.rope(positions)
        cache.ensure(slot, stored[-1] + 1, stored[0])
        where = cache.where(slot, stored)
        for layer, block in enumerate(self.layers):
            k, v = block.keys_values(g, cos, sin)
            cache.keys[layer][where] = k
            cache.values[layer][where] = v
        cache.lengths[slot] = stored[-1] + 1

    def block_pass(self, embeds: torch.Tensor, *, cache: KVCache, slots: list[int], starts: list[int],
              positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The layers over block rows `embeds` [batch, rows, hidden], batch row b's written to its slot at starts[b]
        + t (after its context; the caller rolls them back), `positions` [batch, rows] their rotary positions,
        `visible` [batch, 1, rows, span] the keys each row attends to. Returns the rows after the final norm."""
        batch, rows, _ = embeds.shape
        x = embeds.float()
        cos, sin = self.rope(positions.reshape(-1))
        for slot, start in zip(slots, starts, strict=True):
            cache.ensure(slot, start + rows, start)
        where = cache.pass_pages(slots, starts, rows)
        span = visible.shape[-1]
        for layer, block in enumerate(self.layers):
            normed = block.input_norm(x).reshape(batch * rows, -1)
            q = block.q_norm(block.wq(normed).float().view(batch * rows, block.heads, block.head_dim))
            q = q * cos + rotate_half(q) * sin
            k, v = block.keys_values(normed, cos, sin)
            cache.keys[layer][where.written], cache.values[layer][where.written] = k, v
            keys, values = where.keys_values(layer, cache.keys[layer], cache.values[layer], span=span)
            q = q.view(batch, rows, block.heads, block.head_dim).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, keys.float(), values.float(), attn_mask=visible, enable_gqa=True)
            x = x + block.wo(out.transpose(1, 2).reshape(batch * rows, -1)).float().view(batch, rows, -1)
            x = x + block.mlp(block.post_attention_norm(x)).float()
        for slot, start in zip(slots, starts, strict=True):
            cache.lengths[slot] = max(cache.lengths[slot], start + rows)
        return self.norm(x)

    def embeddings(self, tokens: torch.Tensor, target) -> torch.Tensor:
        """The tokens' embeddings: the drafter's own, else the target's (`target`, a Transformer) as looked up."""
        table = self.embed if self.embed is not None else target.embed
        return table(tokens).float()

    def logits(self, normed: torch.Tensor, target) -> torch.Tensor:
        """float32 logits over the target's vocabulary of rows after the final norm: the drafter's head, else the
        target's (`target`, a Transformer)."""
        if self.lm_head is None:
            return target.head_logits(normed.to(target.dtype))
        return self.lm_head(normed).float()

    def on_the_kernels(self) -> None:
        """Its matrices on the native kernels in Q4_0 (requantized once, as a draft's form; a matrix whose rows do not
        split into 32-weight blocks stays float32): the form beside a target on the native stack. The drafter only
        proposes, so the coarser rounding changes which tokens it proposes, never the output."""
        from ..kernels import native

        native.claim_threads()
        self.fc, self.lm_head = coarse(self.fc), coarse(self.lm_head)
        for block in self.layers:
            block.wq, block.wkv, block.wo = coarse(block.wq), coarse(block.wkv), coarse(block.wo)
            block.mlp.w_gate_up, block.mlp.w_down = coarse(block.mlp.w_gate_up), coarse(block.mlp.w_down)


def visible_block(starts: list[int], rows: list[int], width: int, firsts: list[int] | None = None) -> torch.Tensor:
    """The keys each row of a block pass sees [batch, 1, width, max start + width]: batch row b's real rows (the first
    rows[b]) see its slot's context [firsts[b], starts[b]) and every real row of its block; padding rows see
    themselves only."""
    span = max(starts) + width
    keys = torch.arange(span)
    mask = torch.zeros(len(starts), 1, width, span, dtype=torch.bool)
    for b, (start, count) in enumerate(zip(starts, rows, strict=True)):
        first = firsts[b] if firsts is not None else 0
        mask[b, 0, :count] = (keys >= first) & (keys < start + count)
        for t in range(count, width):
            mask[b, 0, t, start + t] = True
    return mask
