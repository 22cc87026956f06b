"""verispec: lossless speculative decoding. Faster, and provably the same text."""

from .decoding.grammar import GrammarSpec
from .decoding.sampling import SamplingParams
from .decoding.stats import GenerationStats
from .errors import (
    BundledModelError,
    InvalidParameterError,
    ModelLoadError,
    PromptTooLongError,
    TokenizerMismatchError,
    VerispecError,
)
from .generator import GenerationOutput, SpeculativeGenerator, StreamChunk
from .models.loading import LoadedModel, load_model

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
