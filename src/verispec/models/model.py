"""A Llama-family decoder in plain PyTorch, over a paged KV cache (kv_cache.py).

What departs from a plain Llama block (q/k norms, post-norms, GeGLU, soft-capping, sliding windows, layers
without rotary, scaled rotary tables, a partial rotary, a gated attention output, linear-attention layers) is read
from the config (config.py) and costs nothing where it is off.

A hybrid model's linear-attention layers (delta_net.py) keep a recurrent state beside the cache, per length
(recurrent_state.py): `cache.set_length` rolls it back with the keys. Its passes never hold token trees.

`forward(tokens, cache, slots)` runs any number of new tokens for one or several sequences (slots) at
once and appends their keys/values to the cache; rolling back rejected tokens is `cache.set_length`.
Cache entries past a slot's length are never read: the attention mask only admits key positions at or
before each query's position, and every position is rewritten before it is read again.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .delta_net import GatedDeltaNet
from .feed_forward import MLP, GemmaMixture, MixtureOfExperts, PerLayerInput, PerLayerInputs, RMSNorm
from .hidden_states import ServedHidden, tapped
from .kv_cache import KVCache
from .masks import causal_mask, tree_mask, tree_offsets, window_mask
from .pass_shape import PassShape, ShapedPasses, keep_group_ends, kept_rows, plan_groups, shaped_forward
from .rope import rotary_table
from .shaped_attention import ShapedPages

# `fused_blocks` takes a long pass (a prefill) in calls of at most this many rows, bounding its scratch memory
FUSED_CHUNK_ROWS = 256


@dataclass(frozen=True, kw_only=True)
class Rows:
    """Where a pass's rows stand: per slot, its length before the pass and each row's offset from it (a chain's
    0, 1, 2 ...; a token tree's node depths), and the rows' parents (token trees) or None."""

    starts: list[int]
    offsets: list[list[int]]
    parents: list | None = None


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_size_of(layer)
        self.num_kv_heads = config.kv_heads_of(layer)
        # where its keys and values are: its own layer's cache, or an earlier layer's it shares (Gemma 4), which
        # then makes them and this layer projects queries only
        self.source = config.kv_source(layer)
        self.shares = self.source != layer
        # values are the key projection (Gemma 4's full-attention layers)
        self.k_eq_v = config.k_eq_v and not config.window(layer) and not self.shares
        # [q; k; v]; with an output gate q's rows are, per head, its query then its gate (as checkpoints store them)
        self.gated = config.attn_output_gate
        kv_outputs = 0 if self.shares else 1 if self.k_eq_v else 2
        qkv_out = (config.num_heads * (2 if self.gated else 1) + kv_outputs * self.num_kv_heads) * self.head_dim
        self.wqkv = nn.Linear(config.hidden_size, qkv_out, bias=config.qkv_bias)
        self.rotary = config.rotary_size if not config.layer_head_dims else self.head_dim
        self.wo = nn.Linear(config.num_heads * self.head_dim, config.hidden_size, bias=config.o_bias)
        self.sinks = nn.Parameter(torch.zeros(config.num_heads)) if config.attn_sinks else None
        norm = (self.head_dim, config.rms_norm_eps, config.norm_offset)
        self.q_norm = RMSNorm(*norm) if config.qk_norm else None
        self.k_norm = RMSNorm(*norm) if config.qk_norm and not self.shares else None
        self.v_norm = config.v_norm
        self.eps = config.rms_norm_eps
        self.scale = config.query_scale or self.head_dim**-0.5
        self.query_scale = config.query_scale or None  # None: PyTorch's own 1 / sqrt(head size)
        self.window = config.window(layer)
        self.softcap = config.attn_softcap
        self.batch_invariant = False
        # per-query attention of decode and verify passes: None = the PyTorch loop below, else a function
        # (q [S, H, D], keys, values [kv heads, length, D], start, scale, window, softcap) -> [S, H, D]
        # (a native kernel)
        self.attend_per_query = None

    def forward(self, x, cos, sin, masks, cache, layer, where, slots, starts, invariant):
        """`cos`/`sin` None: this layer has no rotary embedding; `masks`: per window (0: none), the mask; `where`:
        the pass's addresses in the cache (PassPages)."""
        layer_keys, layer_values = cache.keys[self.source], cache.values[self.source]
        q, gate = self._project(x, cos, sin, keys=layer_keys, values=layer_values, written=where.written)
        keys, values = where.keys_values(self.source, layer_keys, layer_values, span=max(starts) + x.shape[1])
        attended = self._attend(q, keys, values, masks=masks, starts=starts, invariant=invariant)
        return self._out(attended.to(x.dtype), gate)

    def shaped(self, x, cos, sin, *, keys, values, where: ShapedPages) -> torch.Tensor:
        """In a pass of one shape (pass_shape.py): `x`'s attention over this layer's pools `keys`, `values` (its
        source's), each row's keys in its own order."""
        q, gate = self._project(x, cos, sin, keys=keys, values=values, written=where.written)
        return self._out(where.attend(self, q, keys, values).to(x.dtype), gate)

    def _project(self, x, cos, sin, *, keys, values, written) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`x`'s queries (turned, in the pools' dtype) and output gate; its keys and values written into the pools
        at `written` (a layer that shares another's cache: that layer wrote them before, in this pass)."""
        batch, seq, _ = x.shape
        projected = self.wqkv(x)
        q, gate = self._queries(projected)
        if cos is not None:
            q = self._rotate(q, cos, sin)
        if not self.shares:
            k, v = self._keys_values(projected, cos, sin)
            keys[written] = k.reshape(batch * seq, self.num_kv_heads, self.head_dim).to(keys.dtype)
            values[written] = v.reshape(batch * seq, self.num_kv_heads, self.head_dim).to(values.dtype)
        return q.to(keys.dtype), gate  # the cache may hold float32 (see Transformer.new_cache)

    def _queries(self, projected: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The queries [batch, seq, heads, head size] (normed where the config says) of the q/k/v product, and the
        output gate or []."""
        batch, seq, _ = projected.shape
        q = projected[..., : self.num_heads * self.head_dim * (2 if self.gated else 1)]
        gate = []
        if self.gated:
            q, gated = q.view(batch, seq, self.num_heads, 2, self.head_dim).unbind(3)
            gate = [gated.reshape(batch, seq, -1)]
        q = q.reshape(batch, seq, self.num_heads, self.head_dim)
        return (self.q_norm(q) if self.q_norm is not None else q), gate

    def _keys_values(self, projected: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys (normed, turned) and values [batch, seq, kv heads, head size] of the q/k/v product."""
        batch, seq, _ = projected.shape
        kv = self.num_kv_heads * self.head_dim
        k = projected[..., -kv * (1 if self.k_eq_v else 2) :]
        k, v = (k, k) if self.k_eq_v else k.split([kv, kv], dim=-1)
        k = k.reshape(batch, seq, self.num_kv_heads, self.head_dim)
        v = v.reshape(batch, seq, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.v_norm:
            v32 = v.float()
            v = (v32 * torch.pow(v32.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)).to(v.dtype)
        return (self._rotate(k, cos, sin) if cos is not None else k), v

    def _attend(self, q, keys, values, *, masks, starts, invariant) -> torch.Tensor:
        """[batch, seq, heads x head size]: each query over its keys."""
        batch, seq = q.shape[:2]
        if self.batch_invariant and invariant:
            return self._attend_per_query(q, keys, values, starts)
        mask = masks[self.window]
        if self.softcap or self.sinks is not None:
            out = self._eager(q.transpose(1, 2), keys, values, mask)
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True, scale=self.query_scale
            )
        return out.transpose(1, 2).reshape(batch, seq, -1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The rotary on the head's first `rotary` dimensions (all of them but where the config says fewer)."""
        if self.rotary == self.head_dim:
            return x * cos + rotate_half(x) * sin
        turned, kept = x[..., : self.rotary], x[..., self.rotary :]
        return torch.cat([turned * cos + rotate_half(turned) * sin, kept], dim=-1)

    def _out(self, attended: torch.Tensor, gate: list[torch.Tensor]) -> torch.Tensor:
        """The output projection of the attention [batch, seq, heads x head size], times sigmoid(gate) where gated."""
        if gate:
            attended = attended * torch.sigmoid(gate[0])
        return self.wo(attended)

    def _eager(self, q, keys, values, mask) -> torch.Tensor:
        """Attention with what PyTorch's fused attention has no step for, as transformers' eager attention does: scores
        soft-capped (cap * tanh(score / cap)) before the mask and softmax, and sink logits in the softmax."""
        group = self.num_heads // self.num_kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.scale
        if self.softcap:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(self._softmax(scores).to(q.dtype), values)

    def _softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """The softmax over the last dimension (float32), the sink of each head (dimension -3) taking its share."""
        if self.sinks is None:
            return torch.softmax(scores, dim=-1, dtype=torch.float32)
        sinks = self.sinks.float().view(-1, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.softmax(torch.cat([scores.float(), sinks], dim=-1), dim=-1)[..., :-1]

    def _attend_per_query(self, q, keys, values, starts) -> torch.Tensor:
        """Each query attends to exactly its own prefix, one call per query: the same shapes, hence the
        same rounding, whether the query is decoded alone or verified beside k others. `keys`/`values`: per row
        of the batch, its sequence's [kv heads, span, head size]."""
        batch, seq = q.shape[:2]
        if self.attend_per_query is not None:
            rows = [
                self.attend_per_query(
                    q[row], keys[row].contiguous(), values[row].contiguous(), start, self.scale, self.window,
                    self.softcap,
                )
                for row, start in enumerate(starts)
            ]  # fmt: skip
            return torch.stack(rows).reshape(batch, seq, -1)
        grouped = q.view(batch, seq, self.num_kv_heads, -1, self.head_dim)  # [.., kv_heads, group, dim]
        rows = []
        for row, start in enumerate(starts):
            for t in range(seq):
                span = start + t + 1
                first = max(0, span - self.window) if self.window else 0
                scores = torch.matmul(grouped[row, t], keys[row, :, first:span].transpose(1, 2)) * self.scale
                if self.softcap:
                    scores = torch.tanh(scores / self.softcap) * self.softcap
                probs = self._softmax(scores.view(self.num_heads, 1, -1)).view(scores.shape).to(q.dtype)
                rows.append(torch.matmul(probs, values[row, :, first:span]).reshape(-1))
        return torch.stack(rows).reshape(batch, seq, -1)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        norm = (config.hidden_size, config.rms_norm_eps, config.norm_offset)
        self.attn_norm = RMSNorm(*norm)
        # the token mixer: attention, or a Gated DeltaNet (its index among the linear layers: its recurrent state)
        self.linear = config.linear(layer)
        self.attn = (
            GatedDeltaNet(config, config.linear_layers.index(layer)) if self.linear else Attention(config, layer)
        )
        self.mlp_norm = RMSNorm(*norm)
        wide = 2 * config.intermediate_size if layer in config.wide_mlp_layers else 0
        replaced = config.moe(layer) and not config.moe_beside_mlp
        self.mlp = MixtureOfExperts(config) if replaced else MLP(config, wide)
        self.beside = GemmaMixture(config) if config.moe(layer) and config.moe_beside_mlp else None
        self.post_attn_norm = RMSNorm(*norm) if config.post_norms else None
        self.post_mlp_norm = RMSNorm(*norm) if config.post_norms else None
        self.per_layer = PerLayerInput(config) if config.per_layer_input_size else None
        self.scalar = nn.Parameter(torch.ones(1)) if config.layer_scalar else None

    def forward(self, x, cos, sin, masks, cache, layer, where, slots, starts, invariant, per_layer=None):
        """`per_layer`: this layer's per-layer input [batch, seq, size] where the model has them."""
        if self.linear:  # verify and decode passes keep the state after every row: the recurrent form
            h = self.attn(self.attn_norm(x), cache.recurrent, slots, starts, recurrent_form=invariant,
                          fresh_states=isinstance(where, ShapedPages))  # fmt: skip
        else:
            h = self.attn(self.attn_norm(x), cos, sin, masks, cache, layer, where, slots, starts, invariant)
        return self._after_mixer(x, h, per_layer)

    @property
    def defers_residual(self) -> bool:
        """Whether the layer's last step is the addition of its feed-forward output (an attention layer with no
        per-layer input or scalar after it), which a shaped pass may leave to the next layer (`shaped`)."""
        return not self.linear and self.per_layer is None and self.scalar is None

    def shaped(self, x, cos, sin, *, keys, values, where: ShapedPages, per_layer=None, defer: bool = False):
        """An attention layer in a pass of one shape (pass_shape.py) over its pools `keys`, `values`. It reads
        nothing that tells one layer from another but its weights and pools: one compilation serves every layer alike
        (pass_shape.py's compiled passes). `defer` (where `defers_residual`): returns (the hidden states before the
        feed-forward output is added, that output); else (the hidden states, None)."""
        mixed = self.attn.shaped(self.attn_norm(x), cos, sin, keys=keys, values=values, where=where)
        if defer:
            return self._after_mixer(x, mixed, per_layer, defer=True)
        return self._after_mixer(x, mixed, per_layer), None

    def _after_mixer(self, x, h, per_layer, defer: bool = False):
        """The rest of the layer after its token mixer's output `h`: residuals, the feed-forward, per-layer input;
        with `defer`, (x, the feed-forward output it would add last), else x."""
        x = x + (h if self.post_attn_norm is None else self.post_attn_norm(h))
        h = self.mlp(self.mlp_norm(x))
        if self.beside is not None:
            h = self.beside(x, h)
        h = h if self.post_mlp_norm is None else self.post_mlp_norm(h)
        if defer:
            return x, h
        x = x + h
        if self.per_layer is not None:
            x = x + self.per_layer(x, per_layer)
        return x if self.scalar is None else x * self.scalar


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, embeddings: bool = True):
        """`embeddings` False: no embeddings and no head of its own (the MTP layer, mtp.py, takes its target's)."""
        super().__init__()
        self.config = config
        self.embed: nn.Embedding | None = None
        if embeddings:
            embed = torch.empty(config.vocab_size, config.hidden_size)
            if embed.device.type != "meta":  # on meta (loading), initialising would import torch._dynamo: ~1 s
                nn.init.normal_(embed)
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size, _weight=embed)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset)
        self.per_layer_inputs = PerLayerInputs(config) if config.per_layer_input_size and embeddings else None
        self.lm_head = (
            None
            if config.tie_word_embeddings or not embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        # the checkpoint's multi-token-prediction layer (a drafter trained with the model), or None: mtp.py's
        # `transformer` makes a model with it
        self.mtp: nn.Module | None = None
        self._served: ServedHidden | None = None  # who serve_hidden hands every pass's hidden states, or None
        self._rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self._layer_tables = [config.rope_table(i) for i in range(config.num_layers)]  # per layer, or -1: none
        self._table_sizes = [size for _, _, size in config.rope_table_specs()]  # per table, the dimensions it turns
        self._windows = sorted(set(config.layer_windows) - {0})
        # every block at once for a pass (a native stack, kernels/stack.py), or None: the blocks one by one.
        # Called as fused_blocks(x [rows, hidden], cache, cos, sin, slot per row, position per row), in place,
        # x the embeddings as looked up (the stack scales them where the model does); it runs every pass of the
        # model, batch-invariant (each row's result depends on that row alone).
        self.fused_blocks = None
        # what the KV cache holds (new_cache); None: float32 on a CPU, else the weights' dtype. The native stack
        # reads and writes float16 (models/gguf_native.py): half the bytes a long context's attention reads.
        self.kv_dtype: torch.dtype | None = None
        # every pass at one padded shape (pass_shape.py: a row's bits whatever the pass), or None; set before the
        # caches are made (their scratch block), by `use_pass_shape`
        self.pass_shape: PassShape | None = None
        self.pass_graphs = False  # on CUDA, replay each shaped pass from a CUDA graph
        self.pass_compiled = False  # each shaped pass compiled by torch.compile
        self.pass_fused = False  # each shaped pass's attention one Triton kernel a layer (kernels/triton_attention)
        self._shaped: weakref.WeakKeyDictionary[KVCache, ShapedPasses] = weakref.WeakKeyDictionary()

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def cache_dtype(self) -> torch.dtype:
        """What the KV cache holds: `kv_dtype`, else float32 on a CPU whatever the weights (PyTorch's small bfloat16
        matmuls are slow there: one decode query's attention took 4x longer in bfloat16), else the weights' dtype."""
        return self.kv_dtype or (torch.float32 if self.device.type == "cpu" else self.dtype)

    def new_cache(self, num_slots: int = 1, max_len: int | None = None, num_blocks: int | None = None) -> KVCache:
        """A cache of `cache_dtype` for `num_slots` sequences of up to `max_len` positions, in `num_blocks` blocks
        (default: enough for every slot to reach max_len; memory is taken as blocks are used, kv_cache.py)."""
        max_len = max_len or self.config.max_position_embeddings
        return KVCache(
            self.config,
            num_slots,
            max_len=max_len,
            dtype=self.cache_dtype,
            device=self.device,
            num_blocks=num_blocks,
            scratch=self.pass_shape is not None,
        )

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos and sin tables [tables, at least `length` positions, head size] (float64), made once and
        kept: table t is the one the layers with config.rope_table(layer) == t take (rope.py)."""
        if self._rope_cache is None or self._rope_cache[0].shape[1] < length:
            specs = self.config.rope_table_specs()
            made = [rotary_table(theta, size, length, scaling) for theta, scaling, size in specs]
            widest = max(size for _, _, size in specs)  # narrower tables padded (Gemma 4's): `_layers` cuts them
            cos = torch.stack([F.pad(c, (0, widest - c.shape[1])) for c, _ in made])
            sin = torch.stack([F.pad(s, (0, widest - s.shape[1])) for _, s in made])
            self._rope_cache = (cos.to(self.device), sin.to(self.device))
        return self._rope_cache

    def embedding_scale(self, dtype: torch.dtype) -> torch.Tensor | None:
        """What the embeddings are multiplied by (Gemma: sqrt(hidden size), rounded to the weights' dtype as
        transformers rounds it), or None."""
        if not self.config.embed_scale:
            return None
        return torch.tensor(self.config.hidden_size**0.5, dtype=torch.float32).to(dtype)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slots: list[int],
        num_logits: int | None = None,
        invariant: bool = True,
        head: nn.Module | None = None,
        parents: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """tokens [batch, seq] for cache slots `slots`; returns float32 logits [batch, num_logits or seq, V].

        `parents` (one list per batch row) makes token trees: parents[b][i] is -1 for a row that follows
        everything before it (as in a chain), or an earlier row j of the same batch row, its parent node: row i
        then sits at row j's position + 1 and attends to the cache before the tree's root, then to its
        ancestors and itself only; at most TREE_ROWS rows from a root to its last node (`takes_trees` says whether the
        model can). Row i is stored at the slot's length + i whatever its position; `KVCache.keep_path` keeps
        an accepted path where a chain would hold it.

        invariant=False lets a batch-invariant model use ordinary (faster) attention: for prefills and
        drafts, whose rounding never has to match a decode step's (a model with `fused_blocks` is invariant in
        every pass; so is one with a `pass_shape`, whose every pass runs at that shape: pass_shape.py). `head`
        replaces the output head (a draft's restricted head, see draft_head.py).
        """
        batch, seq = tokens.shape
        if parents is not None and self.config.hybrid:
            raise ValueError("a hybrid model's passes hold no token trees (its recurrent state follows one chain)")
        starts = self._reserve(cache, slots, [seq] * batch)
        offsets = [list(range(seq))] * batch if parents is None else tree_offsets(parents, batch, seq)
        runner = self._shaped_runner(cache)
        if runner is not None:
            groups = plan_groups(slots, starts, offsets, parents=parents, width=runner.shape.width)
            return self._shaped_forward(runner, groups, tokens, cache, slots=slots, starts=starts,
                                        num_logits=num_logits, head=head, invariant=invariant)  # fmt: skip
        x = self.embed(tokens)
        if self.fused_blocks is not None:
            flat = None
            if parents is not None:
                flat = [-1 if p < 0 else b * seq + p for b, row in enumerate(parents) for p in row]
            x = x.reshape(batch * seq, -1).float().contiguous()
            taps = self._served.taps() if self._served is not None else None
            self._fused_rows(x, cache, slots, Rows(starts=starts, offsets=offsets, parents=flat), taps=taps)
            self._serve(slots, starts, taps, x.view(batch, seq, -1))
            return self._logits(x.view(batch, seq, -1).to(self.dtype), num_logits, head)
        if parents is not None and invariant and any(layer.attn.batch_invariant for layer in self.layers):
            raise ValueError("token trees need the native stack or ordinary attention")
        rows = Rows(starts=starts, offsets=offsets, parents=parents)
        taps = self._served.taps() if self._served is not None else None
        x = self._layers(x, cache, slots, rows, invariant=invariant, per_layer=self._per_layer(tokens, x), taps=taps)
        for slot in slots:
            cache.lengths[slot] += seq
        self._serve(slots, starts, taps, x)
        return self._logits(x, num_logits, head)

    def _shaped_runner(self, cache: KVCache) -> ShapedPasses | None:
        """The runner of this model's passes over `cache` at its pass shape, or None: no shape, or a cache made
        without a scratch block."""
        if self.pass_shape is None or cache.scratch_block is None:
            return None
        runner = self._shaped.get(cache)
        wanted = (self.pass_shape, self.pass_compiled, self.pass_fused)
        if runner is None or (runner.shape, runner.compiled, runner.fused) != wanted:
            runner = self._shaped[cache] = ShapedPasses(self, cache, self.pass_shape, graphs=self.pass_graphs,
                                                        compiled=self.pass_compiled, fused=self.pass_fused)  # fmt: skip
        return runner

    def _shaped_forward(self, runner: ShapedPasses, groups: list, tokens: torch.Tensor, cache: KVCache, *,
                        slots: list[int], starts: list[int], num_logits: int | None, head: nn.Module | None,
                        invariant: bool) -> torch.Tensor:  # fmt: skip
        """`forward` at the pass shape (its rows planned as `groups`): its logits [batch, num_logits or seq, V], the
        slots' lengths advanced, the hidden states served. A hybrid model's recurrent states: every row's kept in a
        verify or decode pass (`invariant`: a rollback may land on any), else each slot's last after each shaped run
        (a long prefill's states would fill the memory)."""
        batch, seq = tokens.shape
        tapped = tuple(self._served.layers or ()) if self._served is not None else ()
        settle = None if cache.recurrent is None or invariant else partial(keep_group_ends, cache.recurrent)
        hidden, logits, taps = shaped_forward(runner, tokens, groups, keep=kept_rows(batch, seq, num_logits),
                                              head=head, tapped=tapped, after_run=settle)  # fmt: skip
        for slot in slots:
            cache.lengths[slot] += seq
        if self._served is not None:
            served = {layer: [taps[layer].view(batch, seq, -1)] for layer in taps} if taps else None
            self._serve(slots, starts, served, hidden.view(batch, seq, -1))
        return logits.view(batch, -1, logits.shape[-1])

    def serve_hidden(self, reader, layers: tuple[int, ...] | None = None) -> None:
        """Hand every pass's hidden states to `reader(slots, starts, hidden [batch, seq, size])` from now on, in place
        of any reader before (None: to none): the final ones after the last norm, or the inputs of `layers` side by
        side (hidden_states.py). A drafter that reads them (an MTP layer, an assistant, an EAGLE head) declares it
        (`reads_hidden`, and `hidden_layers`), and the engine serves it."""
        self._served = None if reader is None else ServedHidden(reader, layers)

    def _serve(self, slots: list[int], starts: list[int], taps, x: torch.Tensor, lengths: list[int] | None = None):
        """The pass's hidden states to the reader, if any (`x` its output; `lengths`: rows laid end to end)."""
        if self._served is None:
            return
        hidden = self._served.hidden(taps, lambda: self.norm(x)).view(*x.shape[:-1], -1)
        if lengths is None:
            self._served.reader(slots, starts, hidden)
        else:
            self._served.serve_rows(slots, starts, lengths, hidden)

    def _per_layer(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
        """The pass's per-layer inputs [batch, seq, layers, size] of its tokens and embeddings (Gemma 4), or None."""
        if self.per_layer_inputs is None:
            return None
        scale = self.embedding_scale(x.dtype)
        return self.per_layer_inputs(tokens, x if scale is None else x * scale)

    def _layers(
        self,
        x: torch.Tensor,
        cache: KVCache,
        slots: list[int],
        rows: Rows,
        *,
        invariant: bool,
        per_layer: torch.Tensor | None = None,
        taps: dict | None = None,
    ) -> torch.Tensor:
        """The decoder layers on PyTorch over the padded batch `x` [batch, seq, hidden]; `per_layer` as `_per_layer`
        makes them; `taps` (hidden_states.py) records the inputs of the layers it names."""  # fmt: skip
        batch, seq = x.shape[:2]
        starts, offsets = rows.starts, rows.offsets
        cos_full, sin_full = self.rope_tables(cache.max_len)
        positions = torch.tensor(starts, device=x.device)[:, None] + torch.tensor(offsets, device=x.device)
        sizes = self._table_sizes
        tables = [
            (cos_full[t][positions][..., :size].to(self.dtype).unsqueeze(2),
             sin_full[t][positions][..., :size].to(self.dtype).unsqueeze(2))
            for t, size in enumerate(sizes)
        ]  # fmt: skip
        scale = self.embedding_scale(x.dtype)
        if scale is not None:
            x = x * scale
        span = max(starts) + seq
        if rows.parents is not None:
            mask = tree_mask(rows.parents, starts, span).to(x.device)
        else:
            mask = causal_mask(positions, span) if seq > 1 or batch > 1 else None
        masks = {0: mask} | {
            w: window_mask(mask, positions, starts=starts, offsets=offsets, span=span, window=w) for w in self._windows
        }
        where = cache.pass_pages(slots, starts, seq)
        for layer, block in enumerate(self.layers):
            table = self._layer_tables[layer]
            cos, sin = tables[table] if table >= 0 else (None, None)
            layer_input = None if per_layer is None else per_layer[:, :, layer]
            if taps is not None and layer in taps:
                taps[layer].append(x)
            x = block(x, cos, sin, masks, cache, layer, where, slots, starts, invariant, per_layer=layer_input)
        if taps is not None and len(self.layers) in taps:
            taps[len(self.layers)].append(x)
        return x

    @torch.inference_mode()
    def forward_rows(
        self,
        rows: list[list[int]],
        cache: KVCache,
        slots: list[int],
        parents: list[list[int] | None] | None = None,
        head: nn.Module | None = None,
    ) -> torch.Tensor:
        """`forward` without padding, for a model with `fused_blocks` (whose passes are row-invariant): row i's
        tokens append to slot i, the rows laid end to end; returns float32 logits [sum of the rows' lengths, V],
        row i's from the sum of the lengths before it. `parents` as in `forward`, one list (or None, a chain) per
        row; `head` as in `forward`. A row's logits are the bits `forward` gives it padded to any width: padding
        only adds rows."""
        if self.fused_blocks is None:
            raise ValueError("rows without padding need the native stack")
        parents = parents or [None] * len(rows)
        starts = self._reserve(cache, slots, [len(row) for row in rows])
        offsets = [
            list(range(len(row))) if tree is None else tree_offsets([tree], 1, len(row))[0]
            for row, tree in zip(rows, parents, strict=True)
        ]
        x = self.embed(torch.tensor([t for row in rows for t in row], dtype=torch.long, device=self.device))
        x = x.float().contiguous()
        flat = None
        if any(tree is not None for tree in parents):
            bases = list(itertools.accumulate((len(row) for row in rows[:-1]), initial=0))
            flat = [
                -1 if tree is None or tree[j] < 0 else base + tree[j]
                for base, row, tree in zip(bases, rows, parents, strict=True)
                for j in range(len(row))
            ]
        taps = self._served.taps() if self._served is not None else None
        self._fused_rows(x, cache, slots, Rows(starts=starts, offsets=offsets, parents=flat), taps=taps)
        self._serve(slots, starts, taps, x, lengths=[len(row) for row in rows])
        return self._logits(x.to(self.dtype), None, head)

    @staticmethod
    def _reserve(cache: KVCache, slots: list[int], lengths: list[int]) -> list[int]:
        """Each slot's length before a pass that appends `lengths` tokens to it; the blocks it writes taken (each the
        slot's own)."""
        starts = [cache.lengths[slot] for slot in slots]
        for slot, start, length in zip(slots, starts, lengths, strict=True):
            if start + length > cache.max_len:
                raise ValueError(f"sequence of {start + length} tokens exceeds the cache's {cache.max_len}")
            cache.ensure(slot, start + length)
            if cache.recurrent is not None:
                cache.recurrent.begin(slot, start)
        return starts

    def _fused_rows(self, x: torch.Tensor, cache: KVCache, slots: list[int], rows: Rows, taps=None) -> None:
        """The native stack over the rows `x` [rows, hidden] laid end to end, slot i's at `rows.offsets[i]` from its
        start; the slots' lengths advanced; `taps` as `_layers`'."""
        row_slots = [slot for slot, row in zip(slots, rows.offsets, strict=True) for _ in row]
        row_positions = [start + t for start, row in zip(rows.starts, rows.offsets, strict=True) for t in row]
        self._run_fused(x, cache, row_slots=row_slots, row_positions=row_positions, parents=rows.parents, taps=taps)
        for slot, row in zip(slots, rows.offsets, strict=True):
            cache.lengths[slot] += len(row)

    def _run_fused(
        self, x: torch.Tensor, cache: KVCache, row_slots: list[int], row_positions: list[int],
        parents: list[int] | None, taps: dict | None = None,
    ) -> None:  # fmt: skip
        """The native stack over the rows `x` [rows, hidden], in place: with token trees (`parents`, each row's
        parent row among them or -1) in one call, so that every parent is in it; else in calls of at most
        FUSED_CHUNK_ROWS rows in order (the stack's scratch stays bounded; its passes are row-invariant, so the cut
        changes no bit). `taps` (hidden_states.py): the stack runs in layer ranges, the tapped layers' inputs kept."""
        cos_full, sin_full = self.rope_tables(cache.max_len)
        step = x.shape[0] if parents is not None else FUSED_CHUNK_ROWS
        for begin in range(0, x.shape[0], step):
            rows, chunk = x[begin : begin + step], slice(begin, begin + step)
            run = partial(self.fused_blocks, rows, cache, cos_full, sin_full, row_slots[chunk], row_positions[chunk],
                          parents)  # fmt: skip
            tapped(run, rows, taps, num_layers=len(self.layers), scale=self.embedding_scale(torch.float32))

    @property
    def row_invariant(self) -> bool:
        """Whether every pass gives a row the bits it would get in any other pass (the native stack, or one pass
        shape): a prefill may then be cut anywhere and reused to the token."""
        return self.fused_blocks is not None or self.pass_shape is not None

    @property
    def takes_trees(self) -> bool:
        """Whether a verify pass may hold token trees (`forward`'s parents): the native stack takes them, and so
        does ordinary attention; the per-query attention of a batch-invariant model without the stack does not."""
        if self.config.hybrid:
            return False
        return self.fused_blocks is not None or not any(layer.attn.batch_invariant for layer in self.layers)

    def _logits(self, x: torch.Tensor, num_logits: int | None, head: nn.Module | None) -> torch.Tensor:
        if num_logits is not None:
            x = x[:, -num_logits:]
        return self._head(self.norm(x), head)

    @torch.inference_mode()
    def head_logits(self, normed: torch.Tensor, head: nn.Module | None = None) -> torch.Tensor:
        """float32 logits of hidden states after the last norm: the output head (or `head`), soft-capped where the
        config says so (for callers outside a forward, such as the MTP drafter)."""
        return self._head(normed, head)

    def _head(self, normed: torch.Tensor, head: nn.Module | None) -> torch.Tensor:
        if head is not None:
            logits = head(normed)
        elif self.lm_head is None:
            logits = F.linear(normed, self.embed.weight)
        else:
            logits = self.lm_head(normed)
        cap = self.config.final_softcap
        return logits.float() if not cap else (torch.tanh(logits / cap) * cap).float()
