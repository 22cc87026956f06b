"""A Llama-family decoder in plain PyTorch, with a slotted KV cache.

`forward(tokens, cache, slots)` runs any number of new tokens for one or several sequences (slots) at
once and appends their keys/values to the cache; rolling back rejected tokens is `cache.set_length`.
Cache entries past a slot's length are never read: the attention mask only admits key positions at or
before each query's position, and every position is rewritten before it is read again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig

# `fused_blocks` takes a long pass (a prefill) in calls of at most this many rows, bounding its scratch memory
FUSED_CHUNK_ROWS = 256


class KVCache:
    """Preallocated keys and values: per layer, [slots, kv_heads, max_len, head_dim]."""

    def __init__(self, config: ModelConfig, num_slots: int, max_len: int, dtype: torch.dtype, device):
        shape = (num_slots, config.num_kv_heads, max_len, config.head_size)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.lengths = [0] * num_slots
        self.max_len = max_len

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    def set_length(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"slot {slot}: cannot set length {length} (holds {self.lengths[slot]})")
        self.lengths[slot] = length

    def copy(self, source: int, slot: int, end: int) -> None:
        """Give `slot` the keys and values `source` holds at positions [slot's length, end); its length
        becomes `end`. Copying from the slot itself keeps what it still holds there."""
        start = self.lengths[slot]
        if not start <= end <= self.max_len:
            raise ValueError(f"slot {slot} holds {start} positions: cannot copy up to {end}")
        if source != slot:
            for layer in self.keys + self.values:
                layer[slot, :, start:end].copy_(layer[source, :, start:end])
        self.lengths[slot] = end

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_size
        qkv_out = (config.num_heads + 2 * config.num_kv_heads) * config.head_size
        self.wqkv = nn.Linear(config.hidden_size, qkv_out, bias=config.qkv_bias)
        self.wo = nn.Linear(config.num_heads * config.head_size, config.hidden_size, bias=False)
        self.batch_invariant = False
        # per-query attention of decode and verify passes: None = the PyTorch loop below, else a function
        # (q [S, H, D], keys, values [kv heads, length, D], start, scale) -> [S, H, D] (a native kernel)
        self.attend_per_query = None

    def forward(self, x, cos, sin, mask, layer_keys, layer_values, slots, starts, invariant):
        batch, seq, _ = x.shape
        q, k, v = self.wqkv(x).split(
            [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim],
            dim=-1,
        )
        q = q.view(batch, seq, self.num_heads, self.head_dim)
        k = k.view(batch, seq, self.num_kv_heads, self.head_dim)
        v = v.view(batch, seq, self.num_kv_heads, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            layer_keys[slot, :, start : start + seq] = k[row].transpose(0, 1)
            layer_values[slot, :, start : start + seq] = v[row].transpose(0, 1)
        q = q.to(layer_keys.dtype)  # the cache may hold float32 (see Transformer.new_cache)
        if self.batch_invariant and invariant:
            return self.wo(self._attend_per_query(q, layer_keys, layer_values, slots, starts).to(x.dtype))
        span = max(starts) + seq
        if batch == 1:
            keys, values = layer_keys[slots[0], :, :span].unsqueeze(0), layer_values[slots[0], :, :span].unsqueeze(0)
        else:
            index = torch.tensor(slots, device=x.device)
            keys, values = layer_keys[index, :, :span], layer_values[index, :, :span]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1).to(x.dtype))

    def _attend_per_query(self, q, layer_keys, layer_values, slots, starts) -> torch.Tensor:
        """Each query attends to exactly its own prefix, one call per query: the same shapes, hence the
        same rounding, whether the query is decoded alone or verified beside k others."""
        batch, seq = q.shape[:2]
        if self.attend_per_query is not None:
            scale = self.head_dim**-0.5
            rows = [
                self.attend_per_query(q[row], layer_keys[slot], layer_values[slot], start, scale)
                for row, (slot, start) in enumerate(zip(slots, starts, strict=True))
            ]
            return torch.stack(rows).reshape(batch, seq, -1)
        grouped = q.view(batch, seq, self.num_kv_heads, -1, self.head_dim)  # [.., kv_heads, group, dim]
        rows = []
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            for t in range(seq):
                span = start + t + 1
                scores = torch.matmul(grouped[row, t], layer_keys[slot, :, :span].transpose(1, 2))
                probs = torch.softmax(scores * self.head_dim**-0.5, dim=-1, dtype=torch.float32).to(q.dtype)
                rows.append(torch.matmul(probs, layer_values[slot, :, :span]).reshape(-1))
        return torch.stack(rows).reshape(batch, seq, -1)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w_gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.w_down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, layer_keys, layer_values, slots, starts, invariant):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, layer_keys, layer_values, slots, starts, invariant)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        embed = torch.empty(config.vocab_size, config.hidden_size)
        if embed.device.type != "meta":  # on meta (loading), initialising would import torch._dynamo: ~1 s
            nn.init.normal_(embed)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size, _weight=embed)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = (
            None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self._rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        # every block at once for a pass (a native stack, kernels/stack.py), or None: the blocks one by one.
        # Called as fused_blocks(x [rows, hidden], cache, cos, sin, slot per row, position per row), in place;
        # it runs every pass of the model, batch-invariant (each row's result depends on that row alone).
        self.fused_blocks = None
        # what the KV cache holds (new_cache); None: float32 on a CPU, else the weights' dtype. The native stack
        # reads and writes float16 (models/gguf_native.py): half the bytes a long context's attention reads.
        self.kv_dtype: torch.dtype | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def new_cache(self, num_slots: int = 1, max_len: int | None = None) -> KVCache:
        """A cache of `kv_dtype`. By default on the CPU it holds float32 whatever the weights: PyTorch's small
        bfloat16 matmuls are slow there (one decode query's attention took 4x longer in bfloat16)."""
        max_len = max_len or self.config.max_position_embeddings
        dtype = self.kv_dtype or (torch.float32 if self.device.type == "cpu" else self.dtype)
        return KVCache(self.config, num_slots, max_len, dtype, self.device)

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos and sin tables [at least `length` positions, head size], made once and kept."""
        if self._rope_cache is None or self._rope_cache[0].shape[0] < length:
            dim = self.config.head_size
            inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            angles = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)
            self._rope_cache = (angles.cos().to(self.device), angles.sin().to(self.device))
        return self._rope_cache

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slots: list[int],
        num_logits: int | None = None,
        invariant: bool = True,
        head: nn.Module | None = None,
    ) -> torch.Tensor:
        """tokens [batch, seq] for cache slots `slots`; returns float32 logits [batch, num_logits or seq, V].

        invariant=False lets a batch-invariant model use ordinary (faster) attention: for prefills and
        drafts, whose rounding never has to match a decode step's (a model with `fused_blocks` is invariant in
        every pass). `head` replaces the output head (a
        draft's restricted head, see draft_head.py).
        """
        batch, seq = tokens.shape
        starts = [cache.lengths[s] for s in slots]
        if max(starts) + seq > cache.max_len:
            raise ValueError(f"sequence of {max(starts) + seq} tokens exceeds the cache's {cache.max_len}")
        cos_full, sin_full = self.rope_tables(cache.max_len)
        x = self.embed(tokens)
        if self.fused_blocks is not None:
            x = x.reshape(batch * seq, -1).float().contiguous()
            row_slots = [slot for slot in slots for _ in range(seq)]
            row_positions = [start + t for start in starts for t in range(seq)]
            for begin in range(0, batch * seq, FUSED_CHUNK_ROWS):  # each sequence's rows stay in position order
                chunk = slice(begin, begin + FUSED_CHUNK_ROWS)
                self.fused_blocks(x[chunk], cache, cos_full, sin_full, row_slots[chunk], row_positions[chunk])
            x = x.view(batch, seq, -1).to(self.dtype)
        else:
            positions = torch.tensor(starts, device=tokens.device)[:, None] + torch.arange(seq, device=tokens.device)
            cos = cos_full[positions].to(self.dtype).unsqueeze(2)
            sin = sin_full[positions].to(self.dtype).unsqueeze(2)
            mask = self._mask(positions, max(starts) + seq) if seq > 1 or batch > 1 else None
            for layer, block in enumerate(self.layers):
                x = block(x, cos, sin, mask, cache.keys[layer], cache.values[layer], slots, starts, invariant)
        for slot in slots:
            cache.lengths[slot] += seq
        if num_logits is not None:
            x = x[:, -num_logits:]
        x = self.norm(x)
        if head is not None:
            return head(x).float()
        if self.lm_head is None:
            return F.linear(x, self.embed.weight).float()
        return self.lm_head(x).float()

    @staticmethod
    def _mask(positions: torch.Tensor, span: int) -> torch.Tensor:
        """[batch, 1, seq, span] boolean: key position <= query position."""
        key_positions = torch.arange(span, device=positions.device)
        return (key_positions[None, None, :] <= positions[:, :, None]).unsqueeze(1)
