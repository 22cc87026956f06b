"""Gemma 4's assistant (`gemma4_assistant`): a drafter trained with its target, which reads the target's final hidden
state and attends to the target's own keys and values (engine/assistant.py drafts with it).

A draft step of a sequence whose last token t sits at position p (the target's cache holds positions [0, p)):

    x  = pre([target.embed(t) x sqrt(target hidden); h])      pre: 2 x target hidden -> hidden
    x  = its decoder layers: Gemma 4 blocks that project queries only (at position p) and attend to the target's keys
         and values of the last target layer of their kind (sliding or full) that makes them: positions [0, p), a
         sliding layer's last window + 1 of them (transformers' assistant masks its sliding layers with an inclusive
         bidirectional window, flipped to look back: window + 1 keys, where the target's own query sees window)
    logits = head(norm(x))    its own embedding matrix; with ordered embeddings (centroids), the tokens of the top-k
                              centroids' clusters only, every other token at the smallest of those logits minus 1
    h' = post(norm(x))        post: hidden -> target hidden

h is the target's final hidden state (after its norm) at p - 1, the position whose logits gave t. Further drafts keep
the position p and the target's keys, and read the draft before them and h', as transformers'
Gemma4AssistantCandidateGenerator chains them; nothing is written to any cache. Where transformers hands the assistant
the target's keys sliced to the sequence's length (which, after a rejection, holds the rejected draft's keys at p),
this reads [0, p) only: what the target verified.

The minimum for the tokens outside the chosen clusters is taken per row (transformers takes it over the batch): a
sequence's drafts do not hinge on the rows beside it (beyond the rounding of batched products).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import native
from .config import ModelConfig
from .kv_cache import KVCache
from .model import Transformer

F16_TYPE = 1  # GGML's F16: the native kernels' float16 rule


class AssistantModel(Transformer):
    # a drafter that reads its target's states, driven by this method only (engine/methods.py); never a target
    drafter_method = "assistant"

    def __init__(self, config: ModelConfig, backbone_hidden: int, centroids: tuple[int, int] = (0, 0)):
        """`config`: its layers' (kv_sources -1: its target's, bound by `bind`); `backbone_hidden`: the target's
        hidden size; `centroids`: (clusters, chosen per step) of ordered embeddings, (0, 0): the whole head."""
        super().__init__(config)
        self.pre = nn.Linear(2 * backbone_hidden, config.hidden_size, bias=False)
        self.post = nn.Linear(config.hidden_size, backbone_hidden, bias=False)
        count, self.top_k = centroids
        self.centroids = nn.Linear(config.hidden_size, count, bias=False) if count else None
        self.register_buffer("token_ordering", torch.arange(config.vocab_size if count else 0), persistent=True)
        self._clustered: torch.Tensor | None = None  # the head's rows in cluster order, made at the first draft
        self._native_head = False  # its clusters' products on the native kernels (float16 rows)

    def native_head(self) -> None:
        """Its chosen clusters' logits on the native kernels, the clusters' rows kept in float16 (beside a target on
        the kernels, whose drafter puts the assistant's matrices there too)."""
        if self.centroids is not None:
            clusters = self.token_ordering.view(self.centroids.out_features, -1)
            self._clustered = self.embed.weight.detach()[self.token_ordering].half().view(*clusters.shape, -1)
            self._native_head = True

    def bind(self, target: Transformer) -> None:
        """Each layer reads the keys and values of the target's last layer of its kind that makes them; raises
        ValueError where the target has none of that kind or of another head shape."""
        tc = target.config
        if (tc.vocab_size, tc.hidden_size) != (self.config.vocab_size, self.post.out_features):
            raise ValueError(
                f"its vocabulary and target hidden size {(self.config.vocab_size, self.post.out_features)}, the "
                f"target's {(tc.vocab_size, tc.hidden_size)}"
            )
        for layer, block in enumerate(self.layers):
            sliding = bool(self.config.window(layer))
            makers = [i for i in range(tc.num_layers) if tc.kv_source(i) == i and bool(tc.window(i)) == sliding
                      and not tc.linear(i)]  # fmt: skip
            if not makers:
                raise ValueError(f"the target has no {'sliding' if sliding else 'full'} attention layer to read")
            source = makers[-1]
            shape = (tc.kv_heads_of(source), tc.head_size_of(source), tc.window(source))
            if shape != (block.attn.num_kv_heads, block.attn.head_dim, self.config.window(layer)):
                raise ValueError(
                    f"assistant layer {layer} reads target layer {source}: kv heads, head size and window "
                    f"{(block.attn.num_kv_heads, block.attn.head_dim, self.config.window(layer))}, the target's {shape}"
                )
            block.attn.source = source

    @torch.inference_mode()
    def step(
        self, target: Transformer, tokens: list[int], hidden: torch.Tensor, *, cache: KVCache, slots: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step of each row: `tokens` (each sequence's last), `hidden` [rows, target hidden] (the target's at
        the position before, or the last step's), over `cache` (the target's) for `slots`, each at its cache's length.
        Returns (float32 logits [rows, vocabulary], the next hidden [rows, target hidden])."""
        embedded = target.embed(torch.tensor(tokens, device=self.device))
        scale = target.embedding_scale(embedded.dtype)
        embedded = embedded if scale is None else embedded * scale
        x = self.pre(torch.cat([embedded.to(self.dtype), hidden.to(self.dtype)], dim=-1))[:, None]
        positions = [cache.lengths[slot] for slot in slots]
        starts = [p - 1 for p in positions]  # a pass "of one row at p - 1": it reads [0, p), writes nothing
        where = replace(cache.pass_pages(slots, starts, 1), kept={})  # its layers of a kind read one target layer
        cos, sin, masks = self._reading(positions, cache.max_len)
        for layer, block in enumerate(self.layers):
            table = self._layer_tables[layer]
            x = block(x, cos[table], sin[table], masks, cache, layer, where, slots, starts, False)
        normed = self.norm(x[:, 0])
        return self._head_of(normed), self.post(normed)

    def _reading(self, positions: list[int], length: int) -> tuple[list, list, dict]:
        """Per rotary table the queries' cos and sin at `positions` [rows, 1, 1, size], and per window the keys each
        row reads: [0, p), or its last window + 1 of them [rows, 1, 1, max p]; the tables made once for `length`
        positions (the cache's), as the target makes its own."""
        cos_full, sin_full = self.rope_tables(length)
        at = torch.tensor(positions, device=self.device)
        sizes = self._table_sizes
        cos = [cos_full[t][at][:, None, None, :size].to(self.dtype) for t, size in enumerate(sizes)]
        sin = [sin_full[t][at][:, None, None, :size].to(self.dtype) for t, size in enumerate(sizes)]
        keys = torch.arange(max(positions), device=self.device)[None, :]
        before = keys < at[:, None]
        masks = {0: before[:, None, None]}
        for window in self._windows:
            masks[window] = (before & (keys >= at[:, None] - window - 1))[:, None, None]
        return cos, sin, masks

    def _head_of(self, normed: torch.Tensor) -> torch.Tensor:
        """float32 logits over the vocabulary (ordered embeddings: the chosen clusters' tokens, the rest at their
        row's smallest minus 1)."""
        weight = self.embed.weight
        if self.centroids is None:
            return F.linear(normed, weight).float()
        chosen = torch.topk(self.centroids(normed), self.top_k, dim=-1).indices  # [rows, top k]
        clusters = self.token_ordering.view(self.centroids.out_features, -1)
        ids = clusters[chosen].reshape(normed.shape[0], -1)  # [rows, top k x cluster size]
        if self._clustered is None:  # each cluster's rows side by side: a step reads top k runs, not scattered rows
            self._clustered = weight.detach()[self.token_ordering].view(*clusters.shape, -1)
        picked = self._picked(normed, chosen)  # [rows, ids]
        floor = picked.min(dim=-1, keepdim=True).values - 1.0
        return floor.expand(-1, weight.shape[0]).clone().scatter_(-1, ids, picked)

    def _picked(self, normed: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """Each row's logits of its chosen clusters' tokens [rows, top k x cluster size], float32: on the native
        kernels where the assistant's matrices are (its clusters kept in float16 there, read as the F16 rule reads
        them), else PyTorch's product."""
        if self._native_head:  # a product per chosen cluster, on its rows in place (nothing gathered)
            return torch.cat([
                torch.cat([native.linear(F16_TYPE, self._clustered[c].view(torch.uint8), normed[r : r + 1])
                           for c in row.tolist()], dim=1)
                for r, row in enumerate(chosen)
            ])  # fmt: skip
        rows = self._clustered[chosen].reshape(normed.shape[0], -1, self._clustered.shape[-1])
        return torch.matmul(rows, normed[:, :, None].to(rows.dtype))[..., 0].float()
