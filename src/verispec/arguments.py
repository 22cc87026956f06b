"""Command-line flags shared by `generate`, `bench`, `serve` and `bench-serve` (vLLM's names where vLLM has one)."""

from __future__ import annotations

import argparse

from .defaults import DEFAULT_DRAFT_VOCAB, DEFAULT_DRAFT_WINDOW, DEFAULT_DRAFTER
from .engine.methods import method_names, methods_help
from .errors import InvalidParameterError
from .models.weight_forms import DRAFT_QUANTIZATIONS, QUANTIZATIONS


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every command that loads models (vLLM's names)."""
    _add_model_sources(parser)
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=3,
        help="tokens drafted per target pass (k; the most, with adaptive k)",
    )
    parser.add_argument(
        "--speculative-method",
        default=None,
        choices=method_names(),  # the registry as it is when the parser is built (engine/methods.py)
        help=methods_help(),
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="weights and activations when not quantized (default float32; naming one turns auto quantization off)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument(
        "--quantization",
        default="auto",
        choices=("auto", *QUANTIZATIONS),
        help="target weights: gguf (the GGUF file's own blocks on the native kernels), none (--dtype), int4 (4-bit "
        "GGUF tensors exact, int8 for the rest), int4-all, int8; auto (default): gguf on the CPU where the native "
        "kernels were compiled (else int4) unless --dtype is given, none on a GPU",
    )
    parser.add_argument(
        "--speculative-quantization",
        default=None,
        choices=("auto", *DRAFT_QUANTIZATIONS),
        help="draft weights (default: auto for a gguf target, int4-all for an int4 one, else as the target); q4_0: as "
        "gguf, the draft's layers stored in more bits requantized to Q4_0 once (cached): fewer bytes per draft step, "
        "the output unchanged; auto: whichever of gguf and q4_0 drafts faster on this machine (timed once, cached)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=4096,
        help="context length (tokens) per sequence (serve's default: the models' trained context, cut to what "
        "--kv-cache-memory holds)",
    )
    parser.add_argument(
        "--kv-cache-memory",
        type=memory_size,
        default=None,
        help="bytes the KV caches (target and draft together) may take, e.g. 4GiB, 512MiB: requests wait for room "
        "beyond it; the context is cut to what it holds (default: 4096 tokens per slot, or one whole context if that "
        "is more, at most half the memory available at start; memory is taken as the cache fills)",
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch (default: all cores)")
    _add_pass_options(parser)


def _add_pass_options(parser: argparse.ArgumentParser) -> None:
    """--pass-shape, --compile-passes: how the target's passes run (models/pass_shape.py)."""
    parser.add_argument(
        "--pass-shape",
        default="auto",
        help="every target pass at one padded shape GROUPSxWIDTH, so that a row's bits never depend on the pass "
        "(greedy speculative output = plain output in bfloat16 on a GPU); auto (default): 8x8 on CUDA, off on a CPU",
    )
    parser.add_argument(
        "--compile-passes",
        action="store_true",
        help="compile each shaped pass with torch.compile (fewer, fused kernels; the first pass of each kind "
        "compiles for seconds); needs a pass shape",
    )


def _add_model_sources(parser: argparse.ArgumentParser) -> None:
    """--model, --revision, --speculative-model: a path or a name (models/names.py), the drafter auto by default."""
    parser.add_argument(
        "--model",
        default="target",
        help="target: bundled 'target', a .gguf file, a HF folder, a Hugging Face repo id (Org/Repo, Org/Repo:Q4_K_M), "
        "an Ollama name (qwen2.5-coder:7b) or an LM Studio key (publisher/repo); `verispec models` lists yours",
    )
    parser.add_argument("--revision", default=None, help="--model's revision on the Hugging Face hub (default main)")
    parser.add_argument(
        "--speculative-model",
        default=DEFAULT_DRAFTER,
        help=f"draft model: as --model, or 'none' (plain decoding, or a method's lookups alone); {DEFAULT_DRAFTER} "
        "(default): the bundled draft where its vocabulary is the target's, else the target's own drafter (an MTP "
        "layer), an assistant or a smaller model of its family among yours, else lookups alone (docs/models.md)",
    )


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def memory_size(text: str) -> int:
    """An argparse type: bytes, or a size with a unit (4GiB, 512MiB, 1.5GB; engine/budget.py)."""
    from .engine.budget import parse_memory

    try:
        return parse_memory(text)
    except InvalidParameterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (argparse names the flag in its error, before any model loads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


# methods' options (engine/methods.py) whose flags add_draft_arguments defines for every drafting command; a front end
# adds the flags of the others from the methods' own declarations
DRAFT_ARGUMENTS = frozenset({"draft_vocab"})


def add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    """--draft-vocab and --draft-window, for every command that drafts with a model (generate, bench, serve,
    bench-serve)."""
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=DEFAULT_DRAFT_VOCAB,
        help=f"the draft proposes only among the first N token ids and the stop tokens (default {DEFAULT_DRAFT_VOCAB}; "
        "0 = all)",
    )
    parser.add_argument(
        "--draft-window",
        type=non_negative_int,
        default=DEFAULT_DRAFT_WINDOW,
        help="the draft model reads a long prompt's first 4 tokens and its last N only, so its catch-up never "
        f"exceeds N tokens (default {DEFAULT_DRAFT_WINDOW}; 0 = the whole prompt). The target still reads all of it",
    )


def validate_sampling_arguments(args: argparse.Namespace) -> None:
    """Fail on bad sampling flags before spending seconds on loading models."""
    from .decoding.sampling import SamplingParams

    SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    if args.max_tokens < 1:
        raise InvalidParameterError(f"max_tokens must be >= 1, got {args.max_tokens}")
    if args.num_speculative_tokens < 1:
        raise InvalidParameterError(f"num_speculative_tokens must be >= 1, got {args.num_speculative_tokens}")
