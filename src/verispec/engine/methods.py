"""The ways of drafting, by name: what `--speculative-method` (CLI), `speculative_method` (Python API,
SchedulerConfig) and the bench's method names choose from. A method is one `Method` entry: how its proposer is
built and the properties the engine and the front ends read, so that neither knows a method by its name.

Rules (resolve_method, the one verdict of `generate`, `serve`, the Python API and `bench`):
- no method named: DEFAULT_METHOD where a draft model is given, else plain decoding (no proposer);
- a method that needs a draft model refuses to run without one; one that uses none ignores a draft model given
  (the model is not loaded);
- a proposal never holds more than the method's `widest(k)` tokens: the engine reserves cache room for that many,
  and a proposal wider than it fails its own request, never the batch.

A method owns what is its own: its checks on the models it is given (`check`), the bytes its drafter's caches take
per block of positions (`cache_bytes`, which the engine's KV budget counts), how its proposer and that proposer's
draft model are built (`build`, from a `Setup`), and its options (`options`: one mapping, SchedulerConfig's
`method_options`). A proposer that reads the target's hidden states says so itself (proposer.py: `reads_hidden`); the
engine has the target serve them to it. The engine and the loader name no method and branch on none.

Adding a method is one class (a Proposer, proposer.py) and one `register(Method(...))`; it becomes a
`--speculative-method` choice, a bench method and an API value from then on (tests/test_methods.py adds one;
docs/architecture.md, "Adding a drafter", adds one with a checkpoint of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..defaults import DEFAULT_DRAFT_VOCAB, DEFAULT_SUFFIX_CACHE_TOKENS
from ..errors import InvalidParameterError
from .setup import Setup

if TYPE_CHECKING:  # imported when a proposer is built: `verispec --help` and argument checks need no PyTorch
    from ..models.loading import LoadedModel
    from .proposer import Proposer

DEFAULT_METHOD = "suffix"  # the fastest measured on every workload with a draft model (docs/repetition.md)


class DraftModelUse(Enum):
    NEEDED = "needs a draft model"
    OPTIONAL = "uses a draft model where one is given"
    UNUSED = "uses no draft model"


@dataclass(frozen=True, kw_only=True)
class MethodOption:
    """An option a method reads (`Setup.options[name]`), given in SchedulerConfig.method_options or by its flag
    (`--name-with-dashes` where a front end offers it), else `default`; `check` raises InvalidParameterError for a
    value it refuses."""

    name: str
    default: Any
    help: str
    check: Callable[[Any], None] = lambda value: None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _at_least_zero(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidParameterError(f"{name} must be an integer >= 0, got {value!r}")
        if value is not None and value < 0:
            raise InvalidParameterError(f"{name} must be >= 0, got {value}")

    return check


DRAFT_VOCAB = MethodOption(
    name="draft_vocab", default=None, check=_at_least_zero("draft_vocab"),
    help=f"the drafter proposes only the first N token ids and the stop tokens (a restricted head, "
    f"models/draft_head.py); 0: the whole vocabulary; not given: the front end's default ({DEFAULT_DRAFT_VOCAB})",
)  # fmt: skip


def check_draft_model(target: LoadedModel, draft: LoadedModel | None) -> None:
    """What a method that drafts with a draft model of its own asks of it: the target's tokenizer, and what
    check_draft_model_of_any_vocabulary asks."""
    check_draft_model_of_any_vocabulary(target, draft)
    if draft is not None:
        target.tokenizer.check_compatible(draft.tokenizer)


def check_draft_model_of_any_vocabulary(target: LoadedModel, draft: LoadedModel | None) -> None:
    """What a method that drafts with a draft model of any vocabulary asks of it (Method.other_vocabulary): a cache
    that rolls back to any length, and no drafter made for another method (a model that reads its target:
    `drafter_method`)."""
    if draft is None:
        return
    made_for = getattr(draft.model, "drafter_method", None)
    if made_for is not None:
        raise InvalidParameterError(
            f"the speculative model {draft.name} drafts by reading its target: draft with it by "
            f"--speculative-method {made_for}"
        )
    if draft.model.config.hybrid:
        raise InvalidParameterError(
            "a draft model with linear-attention layers (Qwen3.5) is not supported: its cache is forked and "
            "rolled back to any length, which a recurrent state is not; draft with the target's own MTP layer "
            "(--speculative-method mtp), lookups (suffix, ngram), or a draft model without such layers"
        )


def draft_model_limits(target: LoadedModel, draft: LoadedModel | None) -> tuple[int | None, int | None]:
    """A draft model's (longest context, vocabulary it embeds); (None, None) without one, or for one of another
    vocabulary (it reads the target's text cut into its own tokens, windowed to its positions: cross_vocab.py)."""
    if draft is None or not target.tokenizer.shares_vocabulary(draft.tokenizer):
        return None, None
    return draft.model.config.max_position_embeddings, draft.model.config.vocab_size


def draft_model_cache_bytes(target: LoadedModel, draft: LoadedModel | None) -> int:
    """A draft model's KV cache per block of positions (0 without one)."""
    if draft is None:
        return 0
    from ..models.kv_cache import KVCache

    return KVCache.block_bytes(draft.model.config, draft.model.cache_dtype)


@dataclass(frozen=True, kw_only=True)
class Method:
    name: str
    summary: str  # one line for --help and the docs
    build: Callable[[Setup], Proposer]
    draft_model: DraftModelUse
    # the most tokens one proposal holds when the draft model's k is k: the engine reserves room for that many
    widest: Callable[[int], int] = lambda k: k
    trees: bool = False  # its lookups may propose token trees (--token-trees)
    # raises InvalidParameterError where the method cannot run with these models (the draft None where not given)
    check: Callable[[LoadedModel, LoadedModel | None], None] = check_draft_model
    # the bytes its drafter's caches take per block of positions (the engine's KV budget counts them)
    cache_bytes: Callable[[LoadedModel, LoadedModel | None], int] = draft_model_cache_bytes
    # what its drafter bounds: (the longest context it reads, the token ids it embeds), None where it bounds nothing
    limits: Callable[[LoadedModel, Any], tuple[int | None, int | None]] = draft_model_limits
    # how the checkpoint given as --speculative-model is loaded, beside the loaded target: None, as a model of a
    # family (models/families.py) by the loader; else the method's own reader (a head, not a model)
    load_draft: Callable[[str, LoadedModel], Any] | None = None
    options: tuple[MethodOption, ...] = ()
    # its draft model may have another vocabulary than the target's (drafts translated through text: cross_vocab.py);
    # its `check` then does not refuse one (check_draft_model_of_any_vocabulary), and it drafts with `setup.model`
    other_vocabulary: bool = False

    @property
    def needs_draft_model(self) -> bool:
        return self.draft_model is DraftModelUse.NEEDED

    @property
    def uses_draft_model(self) -> bool:
        return self.draft_model is not DraftModelUse.UNUSED

    def settings(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Its options: each given one (checked), else its default; the others' options are not its own."""
        values = {}
        for option in self.options:
            value = given.get(option.name, option.default)
            option.check(value)
            values[option.name] = value
        return values


_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add (or replace) a method; it is a choice everywhere from then on."""
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def method_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get_method(name: str) -> Method:
    if name not in _REGISTRY:
        raise InvalidParameterError(f"unknown speculative method '{name}' (choose from {', '.join(_REGISTRY)})")
    return _REGISTRY[name]


def method_options() -> dict[str, MethodOption]:
    """Every registered method's options by name (one entry for an option several methods read)."""
    return {option.name: option for method in _REGISTRY.values() for option in method.options}


def check_method_options(given: Mapping[str, Any]) -> None:
    """Raises InvalidParameterError for an option no method has, or a value its option refuses."""
    known = method_options()
    for name, value in given.items():
        if name not in known:
            raise InvalidParameterError(f"unknown method option '{name}' (known: {', '.join(sorted(known))})")
        known[name].check(value)


def resolve_method(name: str | None, draft_model: bool) -> Method | None:
    """The method to run for `name` (None: not named) with a draft model given or not; None: plain decoding.
    Raises InvalidParameterError for an unknown name or a method that needs a draft model when none is given."""
    if name is None:
        return _REGISTRY[DEFAULT_METHOD] if draft_model else None
    method = get_method(name)
    if method.needs_draft_model and not draft_model:
        raise InvalidParameterError(
            f"the {name} speculative method needs a draft model (--speculative-model; not 'none')"
        )
    return method


def load_models(method: Method | None, target: Any, draft: Any, **loading) -> tuple[LoadedModel, Any]:
    """The target and what `method` drafts with, from sources or as loaded: a draft model by the loader
    (models/loading.py: load_pair, `loading` its arguments), or the method's own checkpoint by the method
    (Method.load_draft, beside the loaded target)."""
    from ..models.loading import LoadedModel, load_pair

    own = method is not None and method.load_draft is not None
    if not own or draft is None or isinstance(draft, LoadedModel):
        return load_pair(target, draft, **loading)
    loaded, _ = load_pair(target, None, **loading)
    return loaded, method.load_draft(str(draft), loaded)


def methods_help() -> str:
    """Every method's summary, for --help."""
    default = f"default: {DEFAULT_METHOD} (plain decoding with --speculative-model none)"
    return "; ".join([default, *(f"{m.name}: {m.summary}" for m in _REGISTRY.values())])


def _draft(setup: Setup) -> Proposer:
    return setup.model


def _ngram(setup: Setup) -> Proposer:
    from .prompt_lookup import PromptLookups
    from .proposer import LookupThenModel

    return LookupThenModel(PromptLookups(min_match=1), None)


def _hybrid(setup: Setup) -> Proposer:
    from .prompt_lookup import PromptLookups
    from .proposer import LookupThenModel

    return LookupThenModel(PromptLookups(min_match=PromptLookups.HYBRID_MATCH), setup.model)


def _suffix(setup: Setup) -> Proposer:
    from .proposer import LookupThenModel
    from .suffix import SuffixIndex, SuffixLookups

    lookups = SuffixLookups(SuffixIndex(setup.options["suffix_cache_tokens"]), setup.slots)
    return LookupThenModel(lookups, setup.model)


def _suffix_widest(k: int) -> int:
    from .suffix import LOOKUP_MAX

    return max(k, LOOKUP_MAX)


SUFFIX_CACHE_TOKENS = MethodOption(
    name="suffix_cache_tokens", default=DEFAULT_SUFFIX_CACHE_TOKENS, check=_at_least_zero("suffix_cache_tokens"),
    help="--speculative-method suffix: tokens of earlier requests' outputs kept to draft from, in at most 256 "
    f"partitions; the oldest leave first (default {DEFAULT_SUFFIX_CACHE_TOKENS}, about "
    f"{DEFAULT_SUFFIX_CACHE_TOKENS * 1500 >> 20} MiB; 0 = none)",
)  # fmt: skip


def _no_cache(target: LoadedModel, draft: LoadedModel | None) -> int:
    return 0


def _mtp(setup: Setup) -> Proposer:
    from .mtp import mtp_drafter

    return mtp_drafter(setup)


def _check_mtp(target: LoadedModel, draft: LoadedModel | None) -> None:
    if getattr(target.model, "mtp", None) is None:
        raise InvalidParameterError(
            "the mtp speculative method needs a target whose checkpoint carries a multi-token-prediction layer "
            "(Qwen3.5: mtp_num_hidden_layers in its config and its mtp.* tensors); this one has none"
        )


def _mtp_cache_bytes(target: LoadedModel, draft: LoadedModel | None) -> int:
    from .mtp import mtp_cache_bytes

    return mtp_cache_bytes(target)


def _assistant(setup: Setup) -> Proposer:
    from .assistant import AssistantDrafter

    return AssistantDrafter(setup.target.model, setup.draft.model, setup.cache)


def _check_assistant(target: LoadedModel, draft: LoadedModel | None) -> None:
    if draft is not None and getattr(draft.model, "drafter_method", None) != "assistant":
        raise InvalidParameterError(
            f"the assistant speculative method needs a Gemma 4 assistant checkpoint (model_type gemma4_assistant) as "
            f"--speculative-model; {draft.name} is not one"
        )


def _eagle3(setup: Setup) -> Proposer:
    from .eagle3 import eagle3_drafter

    return eagle3_drafter(setup)


def _load_eagle3(path: str, target: LoadedModel) -> Any:
    from ..models.eagle3_checkpoint import load_eagle3

    return load_eagle3(path, target)


def _check_eagle3(target: LoadedModel, head: Any) -> None:
    from ..models.eagle3 import Eagle3Head

    if head is not None and not isinstance(head, Eagle3Head):
        raise InvalidParameterError(
            "the eagle3 speculative method drafts with an EAGLE-3 head: give its folder or GGUF file as "
            "--speculative-model"
        )


def _eagle3_cache_bytes(target: LoadedModel, head: Any) -> int:
    from .hidden_proposer import own_cache_bytes

    return own_cache_bytes(head.spec.layer)


def _eagle3_limits(target: LoadedModel, head: Any) -> tuple[int | None, int | None]:
    """No bound on the context (its rotary reaches any position); the ids it embeds where it has embeddings."""
    return None, head.spec.vocab if head.embed is not None else None


def _eagle3_widest(k: int) -> int:
    from .eagle3 import TREE_NODES

    return max(k, TREE_NODES)


def _dflash(setup: Setup) -> Proposer:
    from .dflash import dflash_drafter

    return dflash_drafter(setup)


def _load_dflash(path: str, target: LoadedModel) -> Any:
    from ..models.dflash_checkpoint import load_dflash

    return load_dflash(path, target)


def _check_dflash(target: LoadedModel, drafter: Any) -> None:
    from ..models.dflash import DFlashDrafter

    if drafter is not None and not isinstance(drafter, DFlashDrafter):
        raise InvalidParameterError(
            "the dflash speculative method drafts with a DFlash block drafter: give its folder or GGUF file as "
            "--speculative-model"
        )


def _dflash_cache_bytes(target: LoadedModel, drafter: Any) -> int:
    from .hidden_proposer import own_cache_bytes

    return own_cache_bytes(drafter.spec.layers)


def _dflash_limits(target: LoadedModel, drafter: Any) -> tuple[int | None, int | None]:
    """No bound on the context (its rotary reaches any position); the ids it embeds where it has embeddings."""
    return None, drafter.spec.vocab if drafter.embed is not None else None


# the methods drafting with a draft model of their own take one of any vocabulary (cross_vocab.py)
ANY_VOCABULARY = dict(check=check_draft_model_of_any_vocabulary, other_vocabulary=True)
register(Method(name="draft", summary="the --speculative-model drafts (of the target's vocabulary or another)",
                build=_draft, draft_model=DraftModelUse.NEEDED, options=(DRAFT_VOCAB,), **ANY_VOCABULARY))  # fmt: skip
register(Method(name="ngram", summary="prompt lookup in the context (no draft model)", build=_ngram,
                draft_model=DraftModelUse.UNUSED))  # fmt: skip
register(Method(name="hybrid", summary="prompt lookup where the context repeats itself, the draft model elsewhere",
                build=_hybrid, draft_model=DraftModelUse.NEEDED, options=(DRAFT_VOCAB,), **ANY_VOCABULARY))  # fmt: skip
register(Method(
    name="suffix",
    summary="lookups in the context and earlier requests' outputs, up to 15 tokens where the match is long, the "
    "draft model elsewhere (with --speculative-model none: the lookups alone)",
    build=_suffix, draft_model=DraftModelUse.OPTIONAL, widest=_suffix_widest, trees=True,
    options=(SUFFIX_CACHE_TOKENS, DRAFT_VOCAB), **ANY_VOCABULARY,
))  # fmt: skip
register(Method(
    name="mtp",
    summary="the target's own multi-token-prediction layer (Qwen3.5 checkpoints that carry one)",
    build=_mtp, draft_model=DraftModelUse.UNUSED, check=_check_mtp, cache_bytes=_mtp_cache_bytes,
    options=(DRAFT_VOCAB,),
))  # fmt: skip
register(Method(
    name="assistant",
    summary="a Gemma 4 assistant checkpoint (gemma4_assistant) as --speculative-model, reading the target's hidden "
    "states and keys",
    build=_assistant, draft_model=DraftModelUse.NEEDED, check=_check_assistant, cache_bytes=_no_cache,
))  # fmt: skip
register(Method(
    name="eagle3",
    summary="an EAGLE-3 head trained for the target (its folder or GGUF as --speculative-model) reading the target's "
    "hidden states; dynamic token trees with --token-trees",
    build=_eagle3, draft_model=DraftModelUse.NEEDED, check=_check_eagle3, cache_bytes=_eagle3_cache_bytes,
    limits=_eagle3_limits, load_draft=_load_eagle3, widest=_eagle3_widest, trees=True,
))  # fmt: skip
register(Method(
    name="dflash",
    summary="a DFlash block drafter trained for the target (its folder or GGUF as --speculative-model): one pass over "
    "the target's hidden states proposes a block of k tokens",
    build=_dflash, draft_model=DraftModelUse.NEEDED, check=_check_dflash, cache_bytes=_dflash_cache_bytes,
    limits=_dflash_limits, load_draft=_load_dflash,
))  # fmt: skip
