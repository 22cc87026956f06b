"""Runs a bench: every contender over the same prompts, interleaved prompt by prompt, after a warm-up.

Per prompt the contenders run one after another, in an order rotated by the prompt's index, so
machine drift (thermal, other load) hits every method alike. Ctrl-C stops the loop; the finished
runs are kept and written, then the interrupt goes on to the caller.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
from tqdm import tqdm

from ..decoding.grammar import GrammarSpec
from ..defaults import DEFAULT_DRAFTER
from ..engine.default_drafter import load_with_drafter
from ..engine.methods import DEFAULT_METHOD
from ..errors import InvalidParameterError
from ..kernels.linear import GGUFEmbedding, NativeLinear
from ..models import bundled
from ..models.draft_head import DraftHead, draft_ids
from ..models.loading import LoadedModel, choose_draft_form, default_draft_quantization
from ..models.quantize import QuantizedLinear
from ..server.tools import request_prompt
from .config import PEER_FAMILIES, BenchConfig, as_command, without_draft_model
from .costs import Costs, measure_costs
from .datasets import SESSIONS, Request, load_requests
from .hf import HFLoader, build_hf_peers, hf_loader
from .memory import PeakMemory
from .methods import Outcome, build_methods
from .peers import check_available


class Contender(Protocol):
    name: str
    k: int
    kind: str

    def generate(
        self, prompt_ids: list[int], max_tokens: int, config: BenchConfig, seed: int | None,
        grammar: GrammarSpec | None = None,
    ) -> Outcome: ...  # fmt: skip


@dataclass
class Prompt:
    index: int
    id: str
    token_ids: list[int]
    grammar: GrammarSpec | None = None  # structured output (the json-schema dataset), or tool calls' (agent-runs)
    session: str | None = None  # its session (agent-runs): it meets the engine its session's earlier steps left


@dataclass
class Run:
    """One prompt x one contender. Counts and times that a contender cannot report are None."""

    prompt: int
    method: str
    new_tokens: int
    wall_s: float
    target_passes: int
    finish_reason: str
    output_ids: list[int]
    peak_rss_bytes: int
    drafted: int | None = None
    accepted: int | None = None
    rejected: int | None = None
    drafted_by_position: list[int] | None = None
    accepted_by_position: list[int] | None = None
    time_prefill: float | None = None
    time_draft: float | None = None
    time_target: float | None = None
    time_other: float | None = None
    time_grammar: float | None = None  # computing grammar masks (structured output)
    time_catch_up: float | None = None  # the draft model catching up on the context (inside time_draft)
    drafted_by_lookup: int | None = None  # drafted tokens a lookup proposed (the rest: the draft model)
    accepted_by_lookup: int | None = None  # ... of which the target accepted
    rejected_by_lookup: int | None = None  # rounds that ended on a rejected looked-up token
    peak_cuda_bytes: int | None = None
    identical_to_plain: bool | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class Models:
    target: LoadedModel
    draft: LoadedModel | None
    load_hf: HFLoader | None = None  # for --peers hf: "target" | "draft" -> a transformers model


@dataclass
class BenchResult:
    config: BenchConfig
    prompts: list[Prompt]
    contenders: list[dict]  # name, kind, k
    runs: list[Run] = field(default_factory=list)
    costs: Costs | None = None
    peer_passes: dict[int, float] | None = None  # llama-bench: seconds per pass over n tokens (llamacpp-native)
    models: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    skipped_prompts: list[str] = field(default_factory=list)
    interrupted: bool = False
    started: str = ""
    duration_s: float = 0.0


def run_bench(
    config: BenchConfig, models: Models | None = None, log: Callable[[str], None] | None = None
) -> BenchResult:
    """Checks `config`, loads models (unless given), measures, and returns the result (not yet written)."""
    log = log or (lambda message: print(message, file=sys.stderr))
    config = config.checked()
    config = replace(config, command=config.command or as_command(config))
    check_available(config.peers, from_files=models is None or models.load_hf is None)
    requests = load_requests(config.dataset, config.chat)
    if config.peers and any(r.grammar is not None for r in requests):
        raise InvalidParameterError(f"the peers run no grammars: drop --peers for --dataset {config.dataset}")
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    if models is None:
        models, config = _load_models(config, log)
    prompts, skipped, max_seq_len = _select_prompts(config, requests, models)
    contenders = _contenders(config, models, max_seq_len, log)
    result = BenchResult(config, prompts, [{"name": c.name, "kind": c.kind, "k": c.k} for c in contenders])
    result.skipped_prompts, result.models, result.environment = skipped, _describe(models), _environment(config)
    result.started = time.strftime("%Y-%m-%d %H:%M:%S")
    begin = time.perf_counter()
    _warm_up(config, contenders, prompts[0], log)
    result.costs = _measure_costs(config, models, prompts, log)
    if "llamacpp-native" in config.peers:
        from .llamacpp_native import pass_costs

        log("timing llama.cpp's passes (llama-bench) ...")
        result.peer_passes = pass_costs(config, _threads(config))
    try:
        _main_loop(config, contenders, prompts=prompts, result=result, memory=PeakMemory(models.target.model.device))
    except KeyboardInterrupt:
        result.interrupted = True
    result.duration_s = time.perf_counter() - begin
    _mark_identical(result, {c.name for c in contenders if getattr(c, "compares_prefix", False)})
    return result


def _contenders(config: BenchConfig, models: Models, max_seq_len: int, log: Callable[[str], None]) -> list[Contender]:
    if config.uses_draft and models.draft is None:
        raise InvalidParameterError("methods draft and hybrid need a draft model")
    contenders: list[Contender] = [*build_methods(config, models.target, models.draft, max_seq_len)]
    stop_ids = models.target.tokenizer.stop_token_ids
    if "hf" in config.peers:
        log("loading peers: transformers on the same model files ...")
        load = models.load_hf or hf_loader(config)
        contenders += build_hf_peers(load, stop_ids, models.draft is not None)
    if "llamacpp" in config.peers:
        from .llamacpp import build_llamacpp_peers

        log("loading peers: llama.cpp on the same GGUF files ...")
        contenders += build_llamacpp_peers(config, stop_ids, max_seq_len, torch.get_num_threads())
    if "llamacpp-native" in config.peers:
        from .llamacpp_native import build_programs

        context = -(-(max_seq_len + 64) // 256) * 256
        contenders += build_programs(config, models.target.tokenizer, _threads(config), context)
    return contenders


def _load_models(config: BenchConfig, log: Callable[[str], None]) -> tuple[Models, BenchConfig]:
    """The target and the draft model (the one chosen for the target where --speculative-model is auto:
    engine/default_drafter.py); the config with the draft model's source, and, where none fits, without the methods
    that need one (config.py: without_draft_model)."""
    draft_quantization = config.draft_quantization or default_draft_quantization(config.quantization)
    chosen = config.draft_model == DEFAULT_DRAFTER
    if draft_quantization == "auto" and config.uses_draft and not chosen:  # the draft's fastest form, in the log
        draft_quantization = choose_draft_form(config.draft_model)
    log(f"loading {config.model} ({_form(config.dtype, config.quantization)}) ...")
    if config.uses_draft and not chosen:
        log(f"loading {config.draft_model} ({_form(config.dtype, draft_quantization)}) ...")
    draft = config.draft_model if config.uses_draft else None
    loaded = load_with_drafter(
        DEFAULT_METHOD if chosen else None, config.model, draft, dtype=config.dtype, device=config.device,
        progress=True, quantization=config.quantization, draft_quantization=draft_quantization,
        revision=config.revision,
    )  # fmt: skip
    if not bundled.is_bundled_name(config.model):  # the peers read the models' files from the config
        config = replace(config, model=str(loaded.target.path))
    if chosen:
        config = replace(config, draft_model=loaded.drafter.model)
    if chosen and config.uses_draft:
        log(loaded.drafter.line)
        if loaded.draft is None:
            config = without_draft_model(config, loaded.drafter.why)
    return Models(loaded.target, loaded.draft), config


def _threads(config: BenchConfig) -> int:
    """The threads our models run on (the native pool claims PyTorch's), for peers to use as many."""
    from ..kernels import native

    if config.threads is not None:
        return config.threads
    return native.library().vsk_get_threads() if native.available() else torch.get_num_threads()


def _form(dtype: str, quantization: str) -> str:
    return dtype if quantization == "none" else f"{quantization} weights"


def _select_prompts(config: BenchConfig, requests: list[Request], models: Models) -> tuple[list[Prompt], list, int]:
    """The first num_prompts requests that fit the context with max_tokens (and k) to spare."""
    limit = min(config.max_model_len, models.target.model.config.max_position_embeddings)
    if models.draft is not None:
        limit = min(limit, models.draft.model.config.max_position_embeddings)
    spare = config.max_tokens + max(config.ks, default=0) + 2
    tokenizer = models.target.tokenizer
    prompts, skipped = [], []
    for request in requests:
        if len(prompts) == config.num_prompts:
            break
        grammar = request.grammar
        if request.chat is not None:  # the server's own prompt and tool grammar for the recorded request
            ids, calls = request_prompt(request.chat, tokenizer)
            grammar = GrammarSpec("grammar", calls) if calls is not None else None
        else:
            ids = tokenizer.encode_chat(request.prompt) if request.is_chat else tokenizer.encode(request.prompt)
        if ids and len(ids) + spare <= limit:
            prompts.append(
                Prompt(index=len(prompts), id=request.id, token_ids=ids, grammar=grammar, session=request.session)
            )
        else:
            skipped.append(request.id)
    if not prompts:
        raise InvalidParameterError(
            f"no prompt of the dataset fits the {limit}-token context with --max-tokens {config.max_tokens} to spare"
        )
    return prompts, skipped, max(len(p.token_ids) for p in prompts) + spare


def _warm_up(config: BenchConfig, contenders: list[Contender], prompt: Prompt, log: Callable[[str], None]) -> None:
    if config.warmup_tokens == 0:
        return
    log(f"warm-up: {len(contenders)} methods x {config.warmup_tokens} tokens ...")
    # the first prompt without its first token: the engine reuses a prompt it has prefilled (and a draft slot
    # the prefix it holds), so warming up on the prompt itself would make its timed prefill free
    ids = prompt.token_ids[1:] or prompt.token_ids
    for contender in contenders:
        contender.generate(ids, config.warmup_tokens, config, seed=config.seed, grammar=prompt.grammar)
        if (generator := getattr(contender, "generator", None)) is not None:
            generator.forget_history()  # the warm-up's answer must not be there for suffix drafting to copy
            generator.forget_prompts()


def _measure_costs(config: BenchConfig, models: Models, prompts: list[Prompt], log: Callable[[str], None]) -> Costs:
    log(f"measuring step costs ({config.cost_repeats} repetitions) ...")
    typical = sorted(prompts, key=lambda p: len(p.token_ids))[len(prompts) // 2]
    draft, head = None, None
    if models.draft is not None:
        draft = models.draft.model
        ids = draft_ids(config.draft_vocab, draft.config.vocab_size, models.target.tokenizer.stop_token_ids)
        head = DraftHead(draft, models.target.model.config.vocab_size, ids).module
    return measure_costs(
        models.target.model,
        draft,
        context=typical.token_ids,
        ks=config.ks,
        repeats=config.cost_repeats,
        draft_head=head,
    )


def _main_loop(
    config: BenchConfig, contenders: list[Contender], prompts: list[Prompt], result: BenchResult, memory: PeakMemory
) -> None:
    sessions: dict[str, str] = {}
    with tqdm(total=len(prompts) * len(contenders), desc="bench", unit="run", disable=not config.progress) as bar:
        for prompt in prompts:
            shift = prompt.index % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                bar.set_postfix_str(f"prompt {prompt.index + 1}/{len(prompts)} {contender.name}")
                result.runs.append(_timed_run(config, contender, prompt=prompt, memory=memory, sessions=sessions))
                bar.update(1)


def _timed_run(
    config: BenchConfig, contender: Contender, prompt: Prompt, memory: PeakMemory, sessions: dict[str, str]
) -> Run:
    """One contender on one prompt. `sessions`: each contender's current session (agent-runs)."""
    seed = None if config.seed is None else config.seed + prompt.index
    generator = getattr(contender, "generator", None)
    if generator is not None and prompt.session is not None:
        if sessions.get(contender.name) != prompt.session:  # a new run: a fresh engine
            generator.forget_history()
            generator.forget_prompts()
            sessions[contender.name] = prompt.session
    elif generator is not None and config.dataset not in SESSIONS:
        generator.forget_prompts()  # each prompt is prefilled as by a fresh server (a session's are not: SESSIONS)
    memory.reset()
    begin = time.perf_counter()
    outcome = contender.generate(prompt.token_ids, config.max_tokens, config, seed=seed, grammar=prompt.grammar)
    wall = time.perf_counter() - begin if outcome.seconds is None else outcome.seconds
    tokens = len(outcome.token_ids) if outcome.new_tokens is None else outcome.new_tokens
    run = Run(
        prompt=prompt.index, method=contender.name, new_tokens=tokens, wall_s=wall,
        target_passes=outcome.target_passes, finish_reason=outcome.finish_reason, output_ids=outcome.token_ids,
        rejected=outcome.rejected, **memory.read(),
    )  # fmt: skip
    if outcome.stats is not None:
        _add_stats(run, outcome)
    return run


def _add_stats(run: Run, outcome: Outcome) -> None:
    stats = outcome.stats
    run.drafted, run.accepted = stats.drafted, stats.accepted
    run.drafted_by_position, run.accepted_by_position = stats.drafted_by_position, stats.accepted_by_position
    run.time_prefill, run.time_draft, run.time_target = stats.time_prefill, stats.time_draft, stats.time_target
    run.time_other = max(0.0, run.wall_s - stats.time_prefill - stats.time_draft - stats.time_target)
    run.time_grammar = stats.time_grammar
    run.time_catch_up = stats.time_catch_up
    run.drafted_by_lookup, run.accepted_by_lookup = stats.drafted_by_lookup, stats.accepted_by_lookup
    run.rejected_by_lookup = stats.rejected_by_lookup


def _mark_identical(result: BenchResult, by_prefix: set[str] = frozenset()) -> None:
    """`by_prefix`: contenders whose outputs are compared up to the shorter one's length less its last two tokens
    (llama.cpp's programs: their text, re-encoded, has no end tokens, speculation may decode a few tokens past
    the limit, and a cut text's last tokens can re-encode differently than inside the longer text)."""
    outputs = {(run.method, run.prompt): run.output_ids for run in result.runs}
    methods = {run.method for run in result.runs}
    for run in result.runs:
        reference = reference_method(run.method, methods)
        if run.method != reference and (reference, run.prompt) in outputs:
            other = outputs[reference, run.prompt]
            if by_prefix & {run.method, reference}:
                length = min(len(other), len(run.output_ids)) - 2
                run.identical_to_plain = length > 0 and run.output_ids[:length] == other[:length]
            else:
                run.identical_to_plain = run.output_ids == other


def reference_method(method: str, methods: set[str]) -> str:
    """Whose output a method's is compared with: ours and a peer's plain decoding, our plain decoding; a peer's
    speculative method, that peer's own plain decoding when it ran (does *its* speculation keep its output?)."""
    family = method.partition("-")[0]
    own_plain = f"{family}-plain"
    return own_plain if family in PEER_FAMILIES and own_plain in methods and method != own_plain else "plain"


def _describe(models: Models) -> dict:
    described = {"target": models.target}
    if models.draft is not None:
        described["draft"] = models.draft
    return {role: _model_info(loaded) for role, loaded in described.items()}


def _parameter_count(model) -> int:
    """Weights as the model defines them, quantized ones included (a tied head's quantized copy is not)."""
    quantized = sum(
        m.in_features * m.out_features
        for name, m in model.named_modules()
        if isinstance(m, QuantizedLinear | NativeLinear)
        and not (name == "lm_head" and model.config.tie_word_embeddings)
    )
    embedding = model.config.vocab_size * model.config.hidden_size if isinstance(model.embed, GGUFEmbedding) else 0
    return quantized + embedding + sum(p.numel() for p in model.parameters())


def _model_info(loaded: LoadedModel) -> dict:
    model = loaded.model
    return {
        "name": loaded.name,
        "path": str(loaded.path),
        "parameters": _parameter_count(model),
        "layers": model.config.num_layers,
        "hidden_size": model.config.hidden_size,
        "vocab_size": model.config.vocab_size,
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
    }


def _environment(config: BenchConfig) -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "dtype": config.dtype,
        "device": config.device,
    }
