"""The decoding methods a bench compares: plain decoding, and each speculative method at each k.

All of them run through SpeculativeGenerator over the same loaded models (one load, several k).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..decoding.grammar import GrammarSpec
from ..decoding.stats import GenerationStats
from ..generator import GenerationOutput, SpeculativeGenerator
from ..models.loading import LoadedModel
from .config import BenchConfig, bench_method


@dataclass
class Outcome:
    """What one generation gave, for any contender (ours or a peer)."""

    token_ids: list[int]
    finish_reason: str
    target_passes: int
    stats: GenerationStats | None = None  # ours only
    rejected: int | None = None  # rounds that ended on a rejected draft token (draft methods only)
    seconds: float | None = None  # the time the contender reports itself (a separate process), else measured
    new_tokens: int | None = None  # the count the contender reports itself, else len(token_ids)


@dataclass
class Method:
    name: str
    k: int  # tokens drafted per target pass; 0 for plain decoding
    generator: SpeculativeGenerator
    kind: str = "verispec"

    def generate(
        self, prompt_ids: list[int], max_tokens: int, config: BenchConfig, seed: int | None,
        grammar: GrammarSpec | None = None,
    ) -> Outcome:  # fmt: skip
        output: GenerationOutput = self.generator.generate(
            prompt_ids, max_tokens, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
            seed=seed, stop=list(config.stop) or None, ignore_eos=config.ignore_eos, grammar=grammar,
        )  # fmt: skip
        rejected = output.stats.rejected if self.k else None
        return Outcome(
            output.token_ids,
            output.finish_reason,
            target_passes=output.stats.target_passes,
            stats=output.stats,
            rejected=rejected,
        )


def method_name(method: str, k: int) -> str:
    return method if method == "plain" else f"{method}-k{k}"


def build_methods(
    config: BenchConfig, target: LoadedModel, draft: LoadedModel | None, max_seq_len: int
) -> list[Method]:
    methods = []
    for method in config.methods:
        if method == "plain":
            generator = SpeculativeGenerator(
                target, None, max_seq_len=max_seq_len, progress=False, kv_cache_memory=config.kv_cache_memory
            )
            methods.append(Method("plain", 0, generator))
        else:  # draft, ngram, hybrid, auto-*: one method per k
            methods += [
                _speculative_method(method, target, draft=draft, k=k, max_seq_len=max_seq_len, config=config)
                for k in config.ks
            ]
    return methods


def _speculative_method(
    method: str, target: LoadedModel, draft: LoadedModel | None, k: int, max_seq_len: int, config: BenchConfig
) -> Method:
    read = bench_method(method)
    generator = SpeculativeGenerator(
        target, None if read.alone else draft, num_speculative_tokens=k, max_seq_len=max_seq_len,
        progress=False, speculative_method=read.engine, adaptive=read.adaptive, draft_vocab=config.draft_vocab,
        draft_window=config.draft_window, token_trees=read.trees, kv_cache_memory=config.kv_cache_memory,
    )  # fmt: skip
    return Method(method_name(method, k), k, generator)
