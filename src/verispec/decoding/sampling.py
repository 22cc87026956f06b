"""One sampling module for the draft, the target and acceptance.

Temperature, top-k and top-p reshape a logit vector into the distribution that plain decoding samples
from. Speculative decoding applies the *same* function to the target (p) and the draft (q): the
acceptance rule then reproduces the filtered target distribution exactly, whatever q is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import InvalidParameterError
from .noise import KeyedNoise, random_seed

GREEDY_BELOW = 1e-5  # temperatures under this decode greedily (vLLM's rule): logits / 1e-38 overflow float32
SEED_RANGE = range(-(2**63), 2**64)  # OpenAI's seeds are 64-bit integers, signed or not (noise.py takes them mod 2^64)
PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's range for presence and frequency penalties
BIAS_RANGE = (-100.0, 100.0)  # OpenAI's range for logit_bias values


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """temperature 0 (or under GREEDY_BELOW) means greedy; top_k 0 and top_p 1 mean no filter; seed None means
    random. presence_penalty, frequency_penalty and logit_bias (token id -> added logit) change the logits
    before all of these (adjustments.py); 0 and {} leave them alone."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise InvalidParameterError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidParameterError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidParameterError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.seed is not None and self.seed not in SEED_RANGE:
            raise InvalidParameterError(f"seed must be in [-2**63, 2**64), got {self.seed}")
        low, high = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            if not low <= getattr(self, name) <= high:
                raise InvalidParameterError(f"{name} must be in [{low:g}, {high:g}], got {getattr(self, name)}")
        low, high = BIAS_RANGE
        for token, bias in self.logit_bias.items():
            if not isinstance(token, int) or token < 0:
                raise InvalidParameterError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not low <= bias <= high:
                raise InvalidParameterError(f"logit_bias values must be in [{low:g}, {high:g}], got {bias}")

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def noise(self, vocab: int) -> KeyedNoise:
        """The sampling noise of a sequence over `vocab` tokens, keyed by the seed (a random one without a seed)."""
        return KeyedNoise(random_seed() if self.seed is None else self.seed, vocab)


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float32 logits with -inf for the tokens top-k and top-p drop (sampled params). Temperature is not applied:
    it scales the logits and never reorders them; top-p's mass is that of softmax(logits / temperature)."""
    logits = logits.float()
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = torch.sort(logits / params.temperature, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p  # keeps the smallest prefix whose mass reaches top_p
        drop_sorted[..., 0] = False  # and always the most likely token: a top_p that is 0 in float32 means that one
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution over the last axis after temperature, top-k and top-p (float32).

    Greedy params give a one-hot distribution at the argmax, so greedy is the temperature -> 0 limit.
    """
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return (filtered_logits(logits, params) / params.temperature).softmax(-1)


def keyed_draw(logits: torch.Tensor, params: SamplingParams, noise: KeyedNoise, position: int) -> int:
    """The sampled token at `position` ([vocab] logits, sampled params): the keyed race (decoding/noise.py) over the
    filtered distribution, without computing it."""
    return noise.race(filtered_logits(logits, params), params.temperature, position)
