"""Rotary position embedding: each rope type's frequencies, as transformers computes them.

A rotary table holds, per position p and dimension i of a head, cos(p * f_i) and sin(p * f_i) (times an
attention factor, for yarn), f_i = 1 / theta^(2i / D) rescaled by the rope type:

- `default`: as is.
- `linear`: f_i / factor (positions interpolated).
- `llama3` (Llama 3.1-3.3): low frequencies (wavelength past original / low_freq_factor) divided by factor,
  high ones (wavelength under original / high_freq_factor) kept, a smooth ramp between.
- `factors`: f_i / factors[i], the per-frequency divisors a GGUF file stores as its `rope_freqs` tensor
  (llama.cpp's converter writes llama3's scaling so).
- `proportional` (Gemma 4's full-attention layers): the first int(partial x D / 2) frequencies as `default` over the
  whole head (f_i = 1 / theta^(2i / D)), the rest 0 (those dimensions are not turned), all divided by factor.
- `yarn`: a ramp between interpolated (f_i / factor) and original frequencies over the dimensions between the
  correction range of beta_fast and beta_slow rotations in the original context; cos and sin are multiplied by
  the attention factor (given, or 0.1 ln(factor) + 1; with mscale and mscale_all_dim, their ratio of those).

Other rope types (`dynamic`, `longrope`, ...) are refused where a config is read (hf_config.py, gguf_config.py):
their frequencies depend on the length of the sequence being decoded, which a fixed table cannot follow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TYPES = ("linear", "llama3", "factors", "yarn", "proportional")


@dataclass(frozen=True)
class RopeScaling:
    type: str  # one of TYPES
    factor: float = 1.0
    original_max_position_embeddings: int = 0  # llama3, yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: the correction range rounded outwards to whole dimensions
    attention_factor: float = 1.0  # yarn: cos and sin multiplied by it
    factors: tuple[float, ...] = ()  # `factors`: one divisor per frequency
    partial: float = 1.0  # proportional: the share of the frequencies that turn

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"rope type '{self.type}' is not one of {', '.join(TYPES)}")


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """Transformers' default for yarn's attention factor when the config gives none."""

    def get(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return get(factor, mscale) / get(factor, mscale_all_dim)
    return get(factor)


def inverse_frequencies(theta: float, dim: int, scaling: RopeScaling | None = None) -> torch.Tensor:
    """f_i for i < dim / 2, float64."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if scaling is None:
        return inv
    if scaling.type == "linear":
        return inv / scaling.factor
    if scaling.type == "proportional":
        turned = int(scaling.partial * dim // 2)
        return torch.cat([inv[:turned], torch.zeros(dim // 2 - turned, dtype=torch.float64)]) / scaling.factor
    if scaling.type == "factors":
        if len(scaling.factors) != dim // 2:
            raise ValueError(f"{len(scaling.factors)} rope frequency factors for a head of {dim}")
        return inv / torch.tensor(scaling.factors, dtype=torch.float64)
    if scaling.type == "llama3":
        return _llama3(inv, scaling)
    return _yarn(inv, theta, dim, scaling)


def _llama3(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    wavelength = 2 * math.pi / inv
    low_wavelength = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelength = s.original_max_position_embeddings / s.high_freq_factor
    smooth = (s.original_max_position_embeddings / wavelength - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    ramped = (1 - smooth) * inv / s.factor + smooth * inv
    scaled = torch.where(wavelength > low_wavelength, inv / s.factor, inv)
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return torch.where(medium, ramped, scaled)


def _yarn(inv: torch.Tensor, theta: float, dim: int, s: RopeScaling) -> torch.Tensor:
    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp  # the share of the original frequency
    return inv / s.factor * (1 - extrapolated) + inv * extrapolated


def rotary_table(theta: float, dim: int, length: int, scaling: RopeScaling | None = None):
    """(cos, sin) [length, dim] float64 in the rotate-half layout (each frequency twice)."""
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inverse_frequencies(theta, dim, scaling))
    angles = torch.cat((angles, angles), dim=-1)
    factor = scaling.attention_factor if scaling is not None else 1.0
    if factor == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * factor, angles.sin() * factor
