"""`verispec bench`: speedup against plain decoding, peers, and the theoretical limit, in one run."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..arguments import add_draft_arguments, add_model_arguments, add_sampling_arguments
from .config import QUICK, BenchConfig, as_command, bench_method_names, parse_ks, parse_list

DEFAULT_ROOT = Path("bench-results")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Measure speculative decoding against plain decoding on the same prompts, in one run."
    add_model_arguments(parser)
    add_sampling_arguments(parser)
    add_draft_arguments(parser)
    parser.set_defaults(num_speculative_tokens=None, max_tokens=None)  # None: bench or --quick default
    parser.add_argument(
        "--dataset",
        default="humaneval",
        help="humaneval, humaneval-long (800-2,700-token prompts), json-schema, json-schema-long; long, long-summary, "
        "long-extract, long-rag (1-4k tokens of the standard library's sources, docs/long-prompts.md); code-edit, "
        "multi-turn, agent-loop (repetition, docs/repetition.md); agent-runs (recorded agent runs with tool calls, "
        "docs/tools.md); or a .jsonl file",
    )
    parser.add_argument("--num-prompts", type=int, default=None, help="prompts to run (default 10; --quick 2)")
    parser.add_argument(
        "--methods",
        default="plain,draft",
        help=f"comma-separated, of: {', '.join(bench_method_names())}. X-only: without the draft model; X-trees: "
        "token trees on; auto-X picks the draft model's k per round (at most --k)",
    )
    parser.add_argument("--k", default=None, help="draft tokens per target pass, e.g. 2,4,6,8 (one method per k)")
    parser.add_argument(
        "--peers",
        default=None,
        help="other engines in the same run: hf (transformers), llamacpp (llama-cpp-python; GGUF models), "
        "llamacpp-native (llama.cpp's own programs, built separately: docs/bench.md)",
    )
    parser.add_argument("--chat", action="store_true", help="send raw prompts as a user message (chat template)")
    parser.add_argument(
        "--ignore-eos", action="store_true", help="generate --max-tokens tokens through end-of-sequence (as llama.cpp)"
    )
    parser.add_argument("--warmup-tokens", type=int, default=None, help="tokens per method in the warm-up (0 = none)")
    parser.add_argument("--cost-repeats", type=int, default=None, help="repetitions per measured step cost")
    parser.add_argument("--output", type=Path, default=None, help="output folder (default bench-results/<time>/)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--quick", action="store_true", help="a smoke run of about two minutes")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # in-process tiny models (tests)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    base = BenchConfig(**QUICK, quick=True) if args.quick else BenchConfig()
    ks = parse_ks(args.k) if args.k is not None else None
    if ks is None and args.num_speculative_tokens is not None:
        ks = (args.num_speculative_tokens,)
    draft = None if args.speculative_model.lower() == "none" else args.speculative_model
    chosen = {
        "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "ks": ks,
        "warmup_tokens": args.warmup_tokens, "cost_repeats": args.cost_repeats,
    }  # fmt: skip
    config = replace(
        base, **{name: value for name, value in chosen.items() if value is not None},
        dataset=args.dataset, methods=parse_list(args.methods, "--methods"),
        peers=parse_list(args.peers, "--peers") if args.peers is not None else (), chat=args.chat,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=tuple(args.stop or ()),
        ignore_eos=args.ignore_eos,
        model=args.model, revision=args.revision, draft_model=draft, dtype=args.dtype, device=args.device,
        max_model_len=args.max_model_len,
        threads=args.threads, output=args.output, plots=not args.no_plots,
        quantization=args.quantization, draft_quantization=args.speculative_quantization, draft_vocab=args.draft_vocab,
        draft_window=args.draft_window, kv_cache_memory=args.kv_cache_memory,
    )  # fmt: skip
    config = config.checked()
    return replace(config, command=as_command(config, tiny=args.tiny))


def run(args: argparse.Namespace) -> int:
    from .report import write_outputs
    from .runner import run_bench

    config = config_from_args(args)
    result = run_bench(config, _tiny_models(config) if args.tiny else None)
    folder = config.output or _timestamped_folder(DEFAULT_ROOT)
    rows = write_outputs(result, folder)
    for row in rows:
        speedup = f"{row.speedup:.2f}x" if row.speedup is not None else "-"
        print(f"{row.method:>12}  {row.tokens_per_s_total:8.2f} tok/s  speedup {speedup}")
    print(f"wrote {folder / 'report.md'} and {folder / 'results.json'}")
    if result.interrupted:
        print(f"partial results (finished runs only) are in {folder}", file=sys.stderr)
        raise KeyboardInterrupt
    return 0


def _tiny_models(config: BenchConfig):
    from .runner import Models
    from .tiny import hf_twin, tiny_models

    target, draft = tiny_models(config.dtype)
    return Models(target, draft, load_hf=lambda role: hf_twin((target if role == "target" else draft).model))


def _timestamped_folder(root: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, n = root / stamp, 1
    while folder.exists():
        folder, n = root / f"{stamp}-{n}", n + 1
    return folder


COMMANDS = {"bench": (add_arguments, run)}
