"""Command line: `verispec generate`, plus the subcommands of other layers (bench, serve), each module of
which offers its own COMMANDS table.

Every user mistake ends as one line `verispec: error: ...` and exit status 2; no tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .arguments import (
    add_draft_arguments,
    add_model_arguments,
    add_sampling_arguments,
    validate_sampling_arguments,
)
from .errors import InvalidParameterError, VerispecError
from .models.weight_forms import resolve_quantization

if TYPE_CHECKING:
    from .decoding.grammar import GrammarSpec

# name -> (add_arguments, run); run(args) returns an exit status
Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
COMMANDS: dict[str, Command] = {}


def build_generator(args: argparse.Namespace, with_draft: bool = True):
    import torch

    from .generator import SpeculativeGenerator

    if args.threads is not None:
        if args.threads < 1:
            raise VerispecError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
        from .kernels import native

        if native.available():
            native.claim_threads(args.threads)
    draft = args.speculative_model if with_draft and args.speculative_model.lower() != "none" else None
    return SpeculativeGenerator(
        target=args.model,
        draft=draft,
        num_speculative_tokens=args.num_speculative_tokens,
        dtype=args.dtype,
        device=args.device,
        max_seq_len=args.max_model_len,
        quantization=args.quantization,
        draft_quantization=args.speculative_quantization,
        speculative_method=args.speculative_method,
        adaptive=args.adaptive_k,
        draft_vocab=args.draft_vocab,
        draft_window=args.draft_window,
        kv_cache_memory=args.kv_cache_memory,
        revision=args.revision,
        pass_shape=args.pass_shape,
        compile_passes=args.compile_passes,
    )


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="prompt text ('-' reads standard input)")
    add_model_arguments(parser)
    add_sampling_arguments(parser)
    parser.add_argument("--chat", action="store_true", help="render the prompt as a user message (chat template)")
    parser.add_argument("--compare", action="store_true", help="also run plain target decoding and compare")
    parser.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI's presence penalty (-2..2)")
    parser.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI's frequency penalty (-2..2)")
    constraint = parser.add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", help="the answer follows this JSON schema (a .json file, or JSON text)")
    constraint.add_argument("--regex", help="the answer matches this regular expression")
    constraint.add_argument("--grammar", help="the answer follows this Lark or GBNF grammar (a file, or its text)")
    add_draft_arguments(parser)
    parser.add_argument(
        "--adaptive-k",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="choose 0..--num-speculative-tokens drafts per round from measured costs (default on)",
    )


def _generate(args: argparse.Namespace) -> int:
    from .decoding.sampling import SamplingParams
    from .generator import SpeculativeGenerator

    validate_sampling_arguments(args)
    SamplingParams(presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty)
    grammar = _grammar_spec(args)  # mistakes in either are reported before seconds of loading
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt:
        raise InvalidParameterError("prompt is empty")
    request = [{"role": "user", "content": prompt}] if args.chat and prompt else prompt
    begin = time.perf_counter()
    generator = build_generator(args)
    load_seconds = time.perf_counter() - begin
    print(f"verispec: {generator.drafter.line}", file=sys.stderr)
    options = dict(
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, stop=args.stop, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, grammar=grammar,
    )  # fmt: skip
    spec = _stream_to_stdout(generator, request, options)
    label = "[speculative]" if generator.speculates else "[plain]      "
    print(f"{label} {spec.stats.summary()} | load {load_seconds:.2f} s", file=sys.stderr)
    if spec.stats.drafted:
        print(f"[positions]   acceptance by draft position {spec.stats.positions_summary()}", file=sys.stderr)
    if args.compare:
        plain_generator = SpeculativeGenerator(
            target=generator.target, draft=None, max_seq_len=generator.max_seq_len, progress=False
        )
        plain = plain_generator.generate(request, **options)
        speedup = spec.stats.tokens_per_second / plain.stats.tokens_per_second
        same = "identical" if plain.token_ids == spec.token_ids else "DIFFERENT"
        print(f"[plain]       {plain.stats.summary()}", file=sys.stderr)
        print(f"[compare]     speedup {speedup:.2f}x | texts {same}", file=sys.stderr)
        if args.temperature > 0 and same == "DIFFERENT":
            print(
                "[compare]     (sampled runs follow the same distribution, not the same random stream)", file=sys.stderr
            )
    return 0


def _grammar_spec(args: argparse.Namespace) -> GrammarSpec | None:
    """--json-schema, --regex or --grammar as a GrammarSpec (a file's contents where the value names a file)."""
    from .decoding.grammar import GrammarSpec

    for kind, value in (("json_schema", args.json_schema), ("regex", args.regex), ("grammar", args.grammar)):
        if value is None:
            continue
        if kind != "regex" and Path(value).expanduser().is_file():
            value = Path(value).expanduser().read_text()
        if kind == "json_schema":
            try:
                json.loads(value)
            except ValueError as exc:
                raise InvalidParameterError(f"--json-schema is neither a file nor JSON text ({exc})") from None
        return GrammarSpec(kind, value)
    return None


def _stream_to_stdout(generator, request, options):
    output = None
    for chunk in generator.stream(request, **options):
        if chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        output = chunk.output or output
    sys.stdout.write("\n")
    return output


COMMANDS["generate"] = (_generate_arguments, _generate)


# the modules offering more commands (each a COMMANDS table), their commands, and the extra that installs
# what they import
_EXTENSIONS = {
    "verispec.bench.cli": (("bench",), "bench"),
    "verispec.server.cli": (("serve", "bench-serve"), "serve"),
    "verispec.listing": (("models",), None),
}


def _load_extensions(command: str | None = None) -> None:
    """Import the subcommand modules: the one offering `command` (a command starts without the others' imports), or
    all of them (no command, or one none offers: for --help and argparse's list of choices). A module whose
    third-party imports are missing still gets its commands, which then say in one line what to install."""
    wanted = [module for module, (commands, _) in _EXTENSIONS.items() if command in commands]
    if command not in COMMANDS and not wanted:
        wanted = list(_EXTENSIONS)
    for module in wanted:
        commands, extra = _EXTENSIONS[module]
        if all(name in COMMANDS for name in commands):
            continue  # loaded before
        try:
            COMMANDS.update(importlib.import_module(module).COMMANDS)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] == "verispec":
                raise
            for name in commands:
                if name not in COMMANDS:
                    COMMANDS[name] = _missing_package_command(name, exc.name, extra)
                    _STUBS.add(name)


_STUBS: set[str] = set()  # commands that only report a missing package (they accept any arguments)


def _missing_package_command(command: str, package: str, extra: str):
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.description = f"(unavailable: needs the '{package}' package)"

    def run(args: argparse.Namespace) -> int:
        raise VerispecError(_install_hint(command, package, extra))

    return add_arguments, run


def _install_hint(command: str, package: str, extra: str | None = None) -> str:
    fix = f'pip install "verispec[{extra}]"' if extra else f"pip install {package}"
    return f"verispec {command} needs the Python package '{package}', which is not installed; fix: {fix}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _load_extensions(next((arg for arg in argv if not arg.startswith("-")), None))
    parser = argparse.ArgumentParser(prog="verispec", description="Lossless speculative decoding.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (add_arguments, _) in COMMANDS.items():
        add_arguments(subparsers.add_parser(name))
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command not in _STUBS:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if hasattr(args, "quantization"):
            args.quantization = resolve_quantization(
                args.quantization, args.device, dtype_chosen=args.dtype is not None
            )
            args.dtype = args.dtype or "float32"
        return COMMANDS[args.command][1](args)
    except VerispecError as exc:
        print(f"verispec: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional package a command imports when it runs
        if exc.name is None or exc.name.split(".")[0] == "verispec":
            raise
        print(f"verispec: error: {_install_hint(args.command, exc.name.split('.')[0])}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("verispec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
