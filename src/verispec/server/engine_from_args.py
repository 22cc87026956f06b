"""The engine a `verispec serve` command line asks for (its models and scheduler), built alike by the one-process
server (server/cli.py) and by each replica of a cluster (server/cluster/replica.py)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..errors import VerispecError
from ..models import bundled
from ..models.loading import LoadedModel

TINY = "tiny"  # --model tiny / --speculative-model tiny: the random test pair of verispec.testing


def build_scheduler(args: argparse.Namespace):
    import torch

    from ..engine.scheduler import Scheduler, SchedulerConfig

    if args.threads is not None:
        if args.threads < 1:
            raise VerispecError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    config = SchedulerConfig(
        max_num_seqs=args.max_num_seqs, max_queue=args.max_queue, max_model_len=args.max_model_len,
        num_speculative_tokens=args.num_speculative_tokens, draft_policy=args.draft_policy,
        speculative_method=args.speculative_method, draft_vocab=args.draft_vocab, draft_window=args.draft_window,
        prefill_chunk=args.prefill_chunk, suffix_cache_tokens=args.suffix_cache_tokens,
        token_trees=args.token_trees, kv_cache_memory=args.kv_cache_memory,
        answer_reuse=getattr(args, "answer_reuse", True),
    )  # fmt: skip
    draft_source(args)  # the method's verdict, before seconds of loading
    target, draft = load_models(args)  # after the config: its mistakes are reported before seconds of loading
    scheduler = Scheduler(target, draft, config)
    if getattr(args, "warm_up", True):
        from ..engine.warm_up import warm_up

        seconds = warm_up(scheduler)
        if seconds is not None:
            logging.getLogger("verispec.server").info("warmed up in %.2f s (one request, forgotten)", seconds)
    return scheduler


def load_models(args: argparse.Namespace) -> tuple[LoadedModel, LoadedModel | None]:
    from ..models.loading import load_pair

    if TINY in (args.model, args.speculative_model):
        from ..testing import tiny_pair

        if args.model != TINY:
            raise VerispecError("--speculative-model tiny needs --model tiny (the pair shares a tokenizer)")
        tiny_target, tiny_draft = tiny_pair()
        return tiny_target, tiny_draft if args.speculative_model == TINY else None
    draft = draft_source(args)
    return load_pair(
        args.model, draft, args.dtype, args.device, quantization=args.quantization,
        draft_quantization=args.speculative_quantization,
    )  # fmt: skip


def draft_source(args: argparse.Namespace) -> str | None:
    """The draft model the flags ask for, as the method rules decide (engine/methods.py: raises for a method that
    needs one when none is given; None where no draft model is given, or the method uses none)."""
    from ..engine.methods import resolve_method

    given = args.speculative_model.lower() != "none"
    method = resolve_method(args.speculative_method, given)
    return args.speculative_model if method is not None and method.uses_draft_model and given else None


def model_id(source: str) -> str:
    """The id clients send: a bundled model's full name, a GGUF file's stem, a folder's name."""
    if source in bundled.BUNDLED:
        return bundled.BUNDLED[source].name
    if bundled.is_bundled_name(source) or source == TINY:
        return source
    path = Path(source)
    return path.stem if path.suffix == ".gguf" else path.name
