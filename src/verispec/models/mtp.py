"""A checkpoint's multi-token-prediction (MTP) layer: the drafter Qwen3.5 is trained with (engine/mtp.py drafts).

At position i it reads the token at i + 1 and the target's final hidden state at i (after the last norm) and
predicts the token at i + 2:

    x = fc([enorm(embed(token)); hnorm(hidden)])      fc: 2 x hidden -> hidden
    x = a full-attention decoder layer of the target's kind (gated attention, partial rotary), its own KV cache
    logits = the target's head(norm(x))

For a second draft it reads its own output (after `norm`) in place of the target's hidden state, as vLLM chains it.
The embeddings and the head are the target's (passed in, not held: the state dict has one copy).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from .config import ModelConfig
from .feed_forward import RMSNorm
from .kv_cache import KVCache
from .model import Rows, Transformer


def mtp_config(config: ModelConfig) -> ModelConfig:
    """The MTP layer's own shape: one full-attention layer of the target's."""
    return replace(config, num_layers=1, linear_layers=(), mtp_layers=0, layer_windows=(), no_rope_layers=(),
                   dense_layers=())  # fmt: skip


def transformer(config: ModelConfig) -> Transformer:
    """A Transformer of `config`, with its MTP layer where the config has one (what loaders build: the state dict
    holds the layer's tensors under "mtp.")."""
    model = Transformer(config)
    if config.mtp_layers:
        model.mtp = MtpModel(config)
    return model


class MtpModel(Transformer):
    def __init__(self, config: ModelConfig):
        super().__init__(mtp_config(config), embeddings=False)
        norm = (config.hidden_size, config.rms_norm_eps, config.norm_offset)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.enorm = RMSNorm(*norm)
        self.hnorm = RMSNorm(*norm)

    @torch.inference_mode()
    def draft(
        self, target: Transformer, tokens: torch.Tensor, hidden: torch.Tensor, cache: KVCache, slots: list[int]
    ) -> torch.Tensor:
        """tokens [batch, seq] (the token at i + 1) and hidden [batch, seq, hidden] (the target's at i) appended to
        `cache` for `slots`; returns every row's output hidden state [batch, seq, hidden] after the norm: what the
        target's head (`target.head_logits`) makes logits of, and what a chained draft reads."""
        batch, seq = tokens.shape
        embedded = target.embed(tokens).to(self.dtype)
        x = self.fc(torch.cat([self.enorm(embedded), self.hnorm(hidden.to(self.dtype))], dim=-1))
        starts = self._reserve(cache, slots, [seq] * batch)
        x = self._layers(x, cache, slots, Rows(starts=starts, offsets=[list(range(seq))] * batch), invariant=False)
        for slot in slots:
            cache.lengths[slot] += seq
        return self.norm(x)
