"""verispec: lossless speculative decoding. Faster, and provably the same text."""

from .errors import (
    BundledModelError,
    InvalidParameterError,
    ModelLoadError,
    PromptTooLongError,
    TokenizerMismatchError,
    VerispecError,
)
from .generator import GenerationOutput, SpeculativeGenerator, StreamChunk
from .grammar import GrammarSpec
from .loading import LoadedModel, load_model
from .sampling import SamplingParams
from .stats import GenerationStats

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
