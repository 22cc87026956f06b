"""The decoding methods a bench compares: plain decoding and a draft model at each k.

All of them run through SpeculativeGenerator over the same loaded models (one load, several k).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..drafters import Proposal
from ..generator import GenerationOutput, SpeculativeGenerator
from ..loading import LoadedModel
from ..stats import GenerationStats
from .config import BenchConfig


class RejectionCounter:
    """Wraps a drafter and counts the rounds that ended on a rejected draft token.

    accepted / (accepted + rejected) estimates α, the chance that one drafted token is accepted
    (Leviathan et al.): every drafted token up to and including the first rejection was tested.
    The loop sees the drafter's own interface, unchanged.
    """

    def __init__(self, drafter):
        self.inner = drafter
        self.rejected = 0
        self._drafted = 0

    def reset(self, prompt_ids: list[int]) -> None:
        self.rejected = 0
        self.inner.reset(prompt_ids)

    def propose(self, tokens, k, params, rng) -> Proposal:
        proposal = self.inner.propose(tokens, k, params, rng)
        self._drafted = int(proposal.tokens.shape[0])
        return proposal

    def observe(self, num_accepted: int) -> None:
        self.rejected += num_accepted < self._drafted
        self._drafted = 0
        self.inner.observe(num_accepted)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@dataclass
class Outcome:
    """What one generation gave, for any contender (ours or a peer)."""

    token_ids: list[int]
    finish_reason: str
    target_passes: int
    stats: GenerationStats | None = None  # ours only
    rejected: int | None = None  # rounds that ended on a rejected draft token (draft methods only)


@dataclass
class Method:
    name: str
    k: int  # tokens drafted per target pass; 0 for plain decoding
    generator: SpeculativeGenerator
    counter: RejectionCounter | None = None
    kind: str = "verispec"

    def generate(self, prompt_ids: list[int], max_tokens: int, config: BenchConfig, seed: int | None) -> Outcome:
        output: GenerationOutput = self.generator.generate(
            prompt_ids, max_tokens, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
            seed=seed, stop=list(config.stop) or None,
        )  # fmt: skip
        rejected = self.counter.rejected if self.counter else None
        return Outcome(output.token_ids, output.finish_reason, output.stats.target_passes, output.stats, rejected)


def method_name(method: str, k: int) -> str:
    return method if method == "plain" else f"{method}-k{k}"


def build_methods(
    config: BenchConfig, target: LoadedModel, draft: LoadedModel | None, max_seq_len: int
) -> list[Method]:
    methods = []
    for method in config.methods:
        if method == "plain":
            generator = SpeculativeGenerator(target, None, max_seq_len=max_seq_len, progress=False)
            methods.append(Method("plain", 0, generator))
        else:  # "draft": one method per k
            methods += [_draft_method(target, draft, k, max_seq_len) for k in config.ks]
    return methods


def _draft_method(target: LoadedModel, draft: LoadedModel | None, k: int, max_seq_len: int) -> Method:
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=k, max_seq_len=max_seq_len, progress=False)
    counter = RejectionCounter(generator.drafter)
    generator.drafter = counter
    return Method(method_name("draft", k), k, generator, counter)
