"""What one bench run measures: checked in full before any model is loaded."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from ..decoding.sampling import GREEDY_BELOW
from ..defaults import DEFAULT_DRAFT_VOCAB, DEFAULT_DRAFT_WINDOW, DEFAULT_DRAFTER
from ..engine.methods import DraftModelUse, Method, get_method, method_names, resolve_method
from ..errors import InvalidParameterError

# the bench's methods, from the engine's (engine/methods.py) when a run is checked: plain; each method by name; X-only:
# a method that may draft without a draft model, without one (suffix-only: the lookups alone); X-trees: a method whose
# lookups may propose token trees, with them on (--token-trees), to measure what the trees add; auto-X: X with k
# chosen each step from measured costs (engine/policy.py), k from --k as the most
PEERS = ("hf", "llamacpp", "llamacpp-native")
PEER_FAMILIES = ("hf", "llamacpp", "llama.cpp")  # contender names start with these (hf-plain, llama.cpp-draft, ...)
BASELINE = "plain"

# --quick: a smoke run that finishes in about two minutes on the bundled models (2-core CPU).
QUICK = {"num_prompts": 2, "max_tokens": 24, "ks": (2, 4), "cost_repeats": 3, "warmup_tokens": 2}


@dataclass(frozen=True)
class BenchConfig:
    dataset: str = "humaneval"
    num_prompts: int = 10
    max_tokens: int = 128
    methods: tuple[str, ...] = ("plain", "draft")
    ks: tuple[int, ...] = (2, 4, 6, 8)
    peers: tuple[str, ...] = ()
    chat: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # every contender generates max_tokens (llama.cpp's --ignore-eos)
    model: str = "target"
    revision: str | None = None  # the model's on the Hugging Face hub, where it is a repo id
    draft_model: str | None = DEFAULT_DRAFTER  # the one chosen for the target (engine/default_drafter.py)
    dtype: str = "float32"
    device: str = "cpu"
    max_model_len: int = 4096
    kv_cache_memory: int | None = None  # bytes (None: the engine's default, engine/budget.py)
    threads: int | None = None
    quantization: str = "none"
    draft_quantization: str | None = None
    draft_vocab: int = DEFAULT_DRAFT_VOCAB
    draft_window: int = DEFAULT_DRAFT_WINDOW
    warmup_tokens: int = 16
    cost_repeats: int = 10
    output: Path | None = None
    plots: bool = True
    progress: bool = True
    quick: bool = False
    command: str = ""  # the command line, recorded in the report
    notes: tuple[str, ...] = ()  # remarks for the report

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def uses_draft(self) -> bool:
        return any(bench_method(m).uses_draft_model for m in self.methods)

    @property
    def speculates(self) -> bool:
        return any(m != BASELINE for m in self.methods)

    def checked(self) -> BenchConfig:
        """This config with plain added as the baseline; raises InvalidParameterError on any bad value."""
        _check_names("method", self.methods, bench_method_names())
        _check_names("peer", self.peers, PEERS)
        _check_ranges(self)
        for name in self.methods:  # the engine's verdict on each method with the models given (engine/methods.py)
            bench_method(name).resolve(self.draft_model is not None)
        if self.peers and not self.greedy:
            raise InvalidParameterError("--peers compares greedy outputs; use --temperature 0")
        if self.ignore_eos and {"hf", "llamacpp"} & set(self.peers):
            raise InvalidParameterError("--ignore-eos is not supported with --peers hf or llamacpp (they stop at EOS)")
        if self.peers and self.stop:
            raise InvalidParameterError("--stop is not supported with --peers (their outputs would not be comparable)")
        methods, notes = tuple(dict.fromkeys(self.methods)), self.notes
        if BASELINE not in methods:
            methods = (BASELINE, *methods)
            notes = (*notes, "plain decoding was added: it is the baseline every speedup is measured against")
        ks = tuple(dict.fromkeys(self.ks)) if self.speculates else ()
        return replace(self, methods=methods, ks=ks, peers=tuple(dict.fromkeys(self.peers)), notes=notes)


@dataclass(frozen=True, kw_only=True)
class BenchMethod:
    """A bench method name read: the engine's method (None: plain decoding) and how it runs."""

    engine: str | None
    alone: bool = False  # without the draft model (X-only)
    trees: bool = False  # token trees on (X-trees)
    adaptive: bool = False  # k chosen each step (auto-X)

    def resolve(self, draft_model: bool) -> Method | None:
        """The engine's method for it with a draft model given or not (raises as `generate` and `serve` do)."""
        return None if self.engine is None else resolve_method(self.engine, draft_model and not self.alone)

    @property
    def uses_draft_model(self) -> bool:
        return self.engine is not None and not self.alone and get_method(self.engine).uses_draft_model


def without_draft_model(config: BenchConfig, why: str) -> BenchConfig:
    """The config where no draft model fits the target: each method that needs one measured as the default method's
    lookups alone (X-only), with a note saying so."""
    from ..engine.methods import DEFAULT_METHOD

    alone = f"{DEFAULT_METHOD}-only"
    needing = [m for m in config.methods if bench_method(m).uses_draft_model
               and get_method(bench_method(m).engine).needs_draft_model]  # fmt: skip
    swapped = {m: f"auto-{alone}" if bench_method(m).adaptive else alone for m in needing}
    if not swapped:
        return config
    methods = tuple(dict.fromkeys(swapped.get(m, m) for m in config.methods))
    note = f"no draft model fits the target ({why}): {', '.join(f'{a} ran as {b}' for a, b in swapped.items())}"
    return replace(config, methods=methods, notes=(*config.notes, note))


def bench_method_names() -> tuple[str, ...]:
    """plain, then every engine method and its variants (the registry as it is now)."""
    speculative = []
    for method in (get_method(name) for name in method_names()):
        alone = [method.name, f"{method.name}-only"] if method.draft_model is DraftModelUse.OPTIONAL else [method.name]
        speculative += alone + ([f"{name}-trees" for name in alone] if method.trees else [])
    return (BASELINE, *speculative, *(f"auto-{name}" for name in speculative))


def bench_method(name: str) -> BenchMethod:
    """What a name of bench_method_names() runs."""
    if name == BASELINE:
        return BenchMethod(engine=None)
    base = name.removeprefix("auto-")
    trees = base.endswith("-trees")
    base = base.removesuffix("-trees")
    alone = base.endswith("-only")
    return BenchMethod(engine=base.removesuffix("-only"), alone=alone, trees=trees, adaptive=name.startswith("auto-"))


def parse_list(text: str, what: str) -> tuple[str, ...]:
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    if not items:
        raise InvalidParameterError(f"{what} must not be empty")
    return items


def parse_ks(text: str) -> tuple[int, ...]:
    values = []
    for item in parse_list(text, "--k"):
        try:
            values.append(int(item))
        except ValueError:
            raise InvalidParameterError(f"--k expects comma-separated integers, got '{item}'") from None
    return tuple(values)


def _check_names(kind: str, names: tuple[str, ...], known: tuple[str, ...]) -> None:
    for name in names:
        if name not in known:
            raise InvalidParameterError(f"unknown {kind} '{name}' (choose from {', '.join(known)})")


def _check_ranges(config: BenchConfig) -> None:
    bad = [k for k in config.ks if k < 1]
    if bad:
        raise InvalidParameterError(f"k (tokens drafted per target pass) must be >= 1, got {bad[0]}")
    if config.speculates and not config.ks:
        raise InvalidParameterError("speculative methods need at least one k")
    if config.draft_vocab < 0:
        raise InvalidParameterError(f"--draft-vocab must be >= 0 (0 = the whole vocabulary), got {config.draft_vocab}")
    if config.draft_window < 0:
        raise InvalidParameterError(f"--draft-window must be >= 0 (0 = the whole prompt), got {config.draft_window}")
    for name in ("num_prompts", "max_tokens", "cost_repeats"):
        if getattr(config, name) < 1:
            raise InvalidParameterError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(config, name)}")
    if config.warmup_tokens < 0:
        raise InvalidParameterError(f"--warmup-tokens must be >= 0, got {config.warmup_tokens}")
    if config.threads is not None and config.threads < 1:
        raise InvalidParameterError(f"--threads must be >= 1, got {config.threads}")
    if config.temperature < 0 or not 0 < config.top_p <= 1 or config.top_k < 0:
        raise InvalidParameterError("need --temperature >= 0, 0 < --top-p <= 1 and --top-k >= 0")


def as_command(config: BenchConfig, tiny: bool = False) -> str:
    """A command line that repeats this run (--quick spelled out as the values it chose)."""
    parts = ["verispec", "bench", "--dataset", config.dataset, "--num-prompts", str(config.num_prompts)]
    parts += ["--max-tokens", str(config.max_tokens), "--methods", ",".join(config.methods)]
    if config.speculates:
        parts += ["--k", ",".join(map(str, config.ks))]
    if config.peers:
        parts += ["--peers", ",".join(config.peers)]
    optional = {
        "--model": (config.model, "target"), "--revision": (config.revision, None),
        "--speculative-model": (config.draft_model, DEFAULT_DRAFTER),
        "--dtype": (config.dtype, "float32"), "--device": (config.device, "cpu"), "--threads": (config.threads, None),
        "--temperature": (config.temperature, 0.0), "--top-p": (config.top_p, 1.0), "--top-k": (config.top_k, 0),
        "--seed": (config.seed, None), "--max-model-len": (config.max_model_len, 4096),
        "--kv-cache-memory": (config.kv_cache_memory, None),
        "--quantization": (config.quantization, None),  # always written: its default depends on --dtype
        "--speculative-quantization": (config.draft_quantization, None),
        "--draft-vocab": (config.draft_vocab, DEFAULT_DRAFT_VOCAB),
        "--draft-window": (config.draft_window, DEFAULT_DRAFT_WINDOW),
    }  # fmt: skip
    for flag, (value, default) in optional.items():
        if value != default:
            parts += [flag, str(value)]
    parts += [arg for s in config.stop for arg in ("--stop", s)]
    parts += ["--chat"] * config.chat + ["--ignore-eos"] * config.ignore_eos + ["--tiny"] * tiny
    return shlex.join(parts)
