"""The engine a `verispec serve` command line asks for (its models and scheduler), built alike by the one-process
server (server/cli.py) and by each replica of a cluster (server/cluster/replica.py)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from ..defaults import DEFAULT_DRAFTER
from ..errors import VerispecError
from ..models import bundled
from ..models.loading import LoadedModel

TINY = "tiny"  # --model tiny / --speculative-model tiny: the random test pair of verispec.testing


def build_scheduler(args: argparse.Namespace):
    import torch

    from ..engine.scheduler import Scheduler

    if args.threads is not None:
        if args.threads < 1:
            raise VerispecError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    config = scheduler_config(args)
    source = draft_source(args)  # the method's verdict: like the config's mistakes, before seconds of loading
    target, draft = load_models(args, source)
    if getattr(args, "drafter", None) is not None:  # the drafter's method: named, or chosen with the draft model
        config.speculative_method = args.drafter.method
    scheduler = Scheduler(target, draft, config)
    if getattr(args, "warm_up", True):
        from ..engine.warm_up import warm_up

        seconds = warm_up(scheduler)
        if seconds is not None:
            logging.getLogger("verispec.server").info("warmed up in %.2f s (one request, forgotten)", seconds)
    return scheduler


def scheduler_config(args: argparse.Namespace):
    """The SchedulerConfig of a command line: each of its fields from the flag of that name where the command has one
    (a front end without the flag keeps the field's default), the methods' options from their flags."""
    from ..engine.methods import method_options
    from ..engine.scheduler import SchedulerConfig

    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(SchedulerConfig)
             if hasattr(args, field.name)}  # fmt: skip
    options = {name: getattr(args, name) for name in method_options() if hasattr(args, name)}
    return SchedulerConfig(**given, method_options=options)


def load_models(args: argparse.Namespace, draft: str | None) -> tuple[LoadedModel, LoadedModel | None]:
    """The target and the draft model `draft` (draft_source's verdict; None: none; "auto": the one chosen for the
    target, engine/default_drafter.py); the drafter in use is left in `args.drafter` (for /v1/models)."""
    from ..engine.default_drafter import Drafter, load_with_drafter

    if TINY in (args.model, args.speculative_model):
        from ..testing import tiny_pair

        if args.model != TINY:
            raise VerispecError("--speculative-model tiny needs --model tiny (the pair shares a tokenizer)")
        tiny_target, tiny_draft = tiny_pair()
        with_draft = args.speculative_model == TINY
        args.drafter = Drafter(args.speculative_method, TINY if with_draft else None, TINY, "the tiny test pair")
        return tiny_target, tiny_draft if with_draft else None
    loaded = load_with_drafter(
        args.speculative_method, args.model, draft, revision=getattr(args, "revision", None), dtype=args.dtype,
        device=args.device, quantization=args.quantization, draft_quantization=args.speculative_quantization,
    )  # fmt: skip
    args.drafter = loaded.drafter
    return loaded.target, loaded.draft


def drafter_card(args: argparse.Namespace) -> dict | None:
    """What drafts, as /v1/models shows it (None where the models were given otherwise)."""
    drafter = getattr(args, "drafter", None)
    return drafter.as_dict() if drafter is not None else None


def draft_source(args: argparse.Namespace) -> str | None:
    """The draft model the flags ask for, as the method rules decide (engine/methods.py: raises for a method that
    needs one when none is given; None where no draft model is given, or the method uses none; "auto" where the
    drafter is to be chosen for the target)."""
    from ..engine.methods import resolve_method

    given = args.speculative_model.lower() != "none"
    method = resolve_method(args.speculative_method, given)
    if args.speculative_model == DEFAULT_DRAFTER:
        return DEFAULT_DRAFTER
    return args.speculative_model if method is not None and method.uses_draft_model and given else None


def model_id(source: str) -> str:
    """The id clients send: a bundled model's full name, a GGUF file's stem, a folder's name, a name as given (a
    Hugging Face repo id, an Ollama name: models/names.py)."""
    if source in bundled.BUNDLED:
        return bundled.BUNDLED[source].name
    if bundled.is_bundled_name(source) or source == TINY:
        return source
    path = Path(source).expanduser()
    if not path.exists():
        return source
    return path.stem if path.suffix == ".gguf" else path.name
