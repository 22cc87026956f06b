"""verispec: lossless speculative decoding. Faster, and provably the same text.

The names below are imported when first used (PEP 562): `import verispec.cli` and a command's argument checks do not
wait for PyTorch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    BundledModelError,
    InvalidParameterError,
    ModelLoadError,
    PromptTooLongError,
    TokenizerMismatchError,
    VerispecError,
)

if TYPE_CHECKING:
    from .decoding.grammar import GrammarSpec
    from .decoding.sampling import SamplingParams
    from .decoding.stats import GenerationStats
    from .generator import GenerationOutput, SpeculativeGenerator, StreamChunk
    from .models.loading import LoadedModel, load_model

_LAZY = {
    "GrammarSpec": ".decoding.grammar",
    "SamplingParams": ".decoding.sampling",
    "GenerationStats": ".decoding.stats",
    "GenerationOutput": ".generator",
    "SpeculativeGenerator": ".generator",
    "StreamChunk": ".generator",
    "LoadedModel": ".models.loading",
    "load_model": ".models.loading",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'verispec' has no attribute {name!r}")


__all__ = [
    "BundledModelError",
    "GenerationOutput",
    "GenerationStats",
    "GrammarSpec",
    "InvalidParameterError",
    "LoadedModel",
    "ModelLoadError",
    "PromptTooLongError",
    "SamplingParams",
    "SpeculativeGenerator",
    "StreamChunk",
    "TokenizerMismatchError",
    "VerispecError",
    "load_model",
]
__version__ = "0.1.0"
