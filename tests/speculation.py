"""The speculative configurations that feature tests run against plain decoding, on the tiny pair."""

from __future__ import annotations

from verispec import SpeculativeGenerator
from verispec.testing import tiny_loaded, truncated_copy

# (method, k); "clone": a draft equal to the target, which accepts everything, so deep rows of every pass are used
METHODS = [("draft", 1), ("draft", 4), ("clone", 4), ("hybrid", 3), ("ngram", 3)]


def speculative_generator(target, draft, method: str, k: int) -> SpeculativeGenerator:
    if method == "clone":
        method, draft = (
            "draft",
            tiny_loaded(truncated_copy(target.model, target.model.config.num_layers), target.tokenizer),
        )
    return SpeculativeGenerator(
        target, None if method == "ngram" else draft, num_speculative_tokens=k, speculative_method=method,
        adaptive=False,
    )  # fmt: skip
