"""What a request adds to the logits before temperature and filters: logit_bias, and the presence and
frequency penalties of OpenAI's API.

At a position whose generated tokens before it are t_1..t_m, token j's logit l_j becomes

    l_j + bias_j - presence_penalty * [c_j > 0] - frequency_penalty * c_j,    c_j = #{i : t_i = j}

Only generated tokens count (not the prompt), as in OpenAI's and vLLM's APIs. Under speculation a row of
the verification pass stands at the position after the accepted tokens *and the drafted tokens before
it*: those are exactly the tokens plain decoding would have generated before that position if the drafts
are accepted, and a row after a rejected draft is never used. So the target's adjusted distribution at
every emitted position is plain decoding's, and the acceptance rule keeps the output exact. The draft gets
the same adjustments, only so that it proposes what the target will accept.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .sampling import SamplingParams


class LogitAdjustments:
    """One sequence's adjustments; `record` each generated token, `apply` to the rows about to be sampled."""

    def __init__(self, params: SamplingParams, vocab_size: int):
        self.presence = params.presence_penalty
        self.frequency = params.frequency_penalty
        self.penalises = bool(self.presence or self.frequency)
        self.active = params.adjusts_logits
        self.bias: torch.Tensor | None = None
        if params.logit_bias:
            self.bias = torch.zeros(vocab_size)
            ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
            self.bias[ids] = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32)
        self.counts = torch.zeros(vocab_size) if self.penalises else None

    def record(self, token: int) -> None:
        """A token was generated (emitted, not merely drafted)."""
        if self.counts is not None:
            self.counts[token] += 1

    def apply(self, logits: torch.Tensor, drafted: Sequence[int] = ()) -> torch.Tensor:
        """Adjusted copy of `logits` [n, V]: its rows are the last n of the positions after the recorded
        tokens, then after each of `drafted` (row i sees drafted[:len(drafted) - n + 1 + i]). A verification
        pass has n = k + 1 rows over k drafts; a drafting step has 1 row over the tokens drafted so far."""
        if not self.active:
            return logits
        adjusted = logits.float()
        if self.bias is not None:
            adjusted = adjusted + self.bias
        if self.counts is not None:
            adjusted = adjusted - self._penalties(logits.shape[0], drafted)
        return adjusted

    def _penalties(self, rows: int, drafted: Sequence[int]) -> torch.Tensor:
        counts = self.counts.expand(rows, -1).clone()
        seen_from = len(drafted) - rows + 1  # drafted[j] counts in rows i with i >= j - seen_from + 1
        for j, token in enumerate(drafted):
            counts[max(0, j - seen_from + 1) :, token] += 1
        return self.presence * (counts > 0).float() + self.frequency * counts
