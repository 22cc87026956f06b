"""Helpers for statistical tests: empirical histograms and total-variation distance."""

from __future__ import annotations

from collections import Counter

import torch


def total_variation(empirical: Counter, exact: dict, samples: int) -> float:
    keys = set(empirical) | set(exact)
    return 0.5 * sum(abs(empirical.get(k, 0) / samples - float(exact.get(k, 0.0))) for k in keys)


def random_distribution(vocab: int, generator: torch.Generator, sharpness: float = 2.0) -> torch.Tensor:
    return (torch.randn(vocab, generator=generator) * sharpness).softmax(-1)
