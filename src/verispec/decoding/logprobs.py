"""Log-probabilities of generated tokens, as an OpenAI client asks for them (`logprobs`, `top_logprobs`).

They are the target model's raw distribution at each generated position: log_softmax of its logits before
logit_bias, penalties, temperature and filters (vLLM's default, `raw_logprobs`). They come from the pass
that verified the token, so drafted, corrected and bonus tokens all carry them; a verification row is the
same computation as a plain decoding step (the kernels' rows are independent of each other), so with
speculation on they equal plain decoding's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MAX_TOP_LOGPROBS = 20  # alternatives per position (OpenAI's chat limit; vLLM's default max_logprobs)


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), most likely first
    text_offset: int = 0  # where the token's text starts in the generated text


def token_logprobs(logits: torch.Tensor, tokens: list[int], top_n: int) -> list[TokenLogprob]:
    """The logprob of tokens[i] under row i of `logits` [n, V], with row i's `top_n` most likely tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)].tolist()
    if top_n:
        values, ids = torch.topk(logprobs, top_n, dim=-1)
        tops = [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        tops = [[] for _ in tokens]
    return [TokenLogprob(t, lp, top) for t, lp, top in zip(tokens, chosen, tops, strict=True)]
