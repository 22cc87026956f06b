"""The ways of drafting, by name: what `--speculative-method` (CLI), `speculative_method` (Python API,
SchedulerConfig) and the bench's method names choose from. A method is one `Method` entry: how its proposer is
built and the properties the engine and the front ends read, so that neither knows a method by its name.

Rules (resolve_method, the one verdict of `generate`, `serve`, the Python API and `bench`):
- no method named: DEFAULT_METHOD where a draft model is given, else plain decoding (no proposer);
- a method that needs a draft model refuses to run without one; one that uses none ignores a draft model given
  (the model is not loaded);
- a proposal never holds more than the method's `widest(k)` tokens: the engine reserves cache room for that many,
  and a proposal wider than it fails its own request, never the batch.

Adding a method is one class (a Proposer, proposer.py) and one `register(Method(...))`; it becomes a
`--speculative-method` choice, a bench method and an API value from then on (tests/test_methods.py adds one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from ..errors import InvalidParameterError

if TYPE_CHECKING:  # imported when a proposer is built: `verispec --help` and argument checks need no PyTorch
    from ..models.kv_cache import KVCache
    from ..models.model import Transformer
    from .draft_model import BatchedDrafter
    from .proposer import Proposer

DEFAULT_METHOD = "suffix"  # the fastest measured on every workload with a draft model (docs/repetition.md)


class DraftModelUse(Enum):
    NEEDED = "needs a draft model"
    OPTIONAL = "uses a draft model where one is given"
    UNUSED = "uses no draft model"


@dataclass(frozen=True, kw_only=True)
class Setup:
    """What a method's proposer is built from."""

    model: BatchedDrafter | None  # the draft model, ready (None: none given, or the method uses none)
    slots: int
    suffix_cache_tokens: int
    target: Transformer | None = None  # the target (a method that drafts with its own layers: mtp)
    max_len: int = 0  # the positions a slot's caches hold, in blocks of the target cache's number
    num_blocks: int = 0
    draft_vocab: int | None = None  # --draft-vocab (a drafter's restricted head), None: not given
    stop_ids: frozenset[int] = frozenset()  # the tokenizer's stop tokens (a restricted head keeps them)
    assistant: Transformer | None = None  # a draft model that reads the target (draft_reads_target), as loaded
    cache: KVCache | None = None  # the target's KV cache (what such a drafter reads)


@dataclass(frozen=True, kw_only=True)
class Method:
    name: str
    summary: str  # one line for --help and the docs
    build: Callable[[Setup], Proposer]
    draft_model: DraftModelUse
    # the most tokens one proposal holds when the draft model's k is k: the engine reserves room for that many
    widest: Callable[[int], int] = lambda k: k
    trees: bool = False  # its lookups may propose token trees (--token-trees)
    target_drafts: bool = False  # it drafts with the target's own layers (its cache is the engine's to budget)
    # its draft model reads the target's hidden states and KV cache and keeps no cache (Gemma 4's assistant)
    draft_reads_target: bool = False

    @property
    def needs_draft_model(self) -> bool:
        return self.draft_model is DraftModelUse.NEEDED

    @property
    def uses_draft_model(self) -> bool:
        return self.draft_model is not DraftModelUse.UNUSED


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

    return LookupThenModel(SuffixLookups(SuffixIndex(setup.suffix_cache_tokens), setup.slots), setup.model)


def _suffix_widest(k: int) -> int:
    from .suffix import LOOKUP_MAX

    return max(k, LOOKUP_MAX)


def _mtp(setup: Setup) -> Proposer:
    from ..models.draft_head import frequent_ids
    from .mtp import MtpDrafter, mtp_head_rows

    vocab = setup.target.config.vocab_size
    rows = mtp_head_rows(setup.draft_vocab, vocab)
    ids = frequent_ids(rows, vocab, setup.stop_ids) if rows and rows < vocab else None
    return MtpDrafter(setup.target, setup.slots, setup.max_len, setup.num_blocks or None, head_ids=ids)


def _assistant(setup: Setup) -> Proposer:
    from .assistant import AssistantDrafter

    return AssistantDrafter(setup.target, setup.assistant, setup.cache)


register(Method(name="draft", summary="the --speculative-model drafts", build=_draft, draft_model=DraftModelUse.NEEDED))
register(Method(name="ngram", summary="prompt lookup in the context (no draft model)", build=_ngram,
                draft_model=DraftModelUse.UNUSED))  # fmt: skip
register(Method(name="hybrid", summary="prompt lookup where the context repeats itself, the draft model elsewhere",
                build=_hybrid, draft_model=DraftModelUse.NEEDED))  # fmt: skip
register(Method(
    name="suffix",
    summary="lookups in the context and earlier requests' outputs, up to 15 tokens where the match is long, the "
    "draft model elsewhere (with --speculative-model none: the lookups alone)",
    build=_suffix, draft_model=DraftModelUse.OPTIONAL, widest=_suffix_widest, trees=True,
))  # fmt: skip
register(Method(
    name="mtp",
    summary="the target's own multi-token-prediction layer (Qwen3.5 checkpoints that carry one)",
    build=_mtp, draft_model=DraftModelUse.UNUSED, target_drafts=True,
))  # fmt: skip
register(Method(
    name="assistant",
    summary="a Gemma 4 assistant checkpoint (gemma4_assistant) as --speculative-model, reading the target's hidden "
    "states and keys",
    build=_assistant, draft_model=DraftModelUse.NEEDED, draft_reads_target=True,
))  # fmt: skip
