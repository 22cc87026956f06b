"""What a method's proposer is built from (Method.build): the models as loaded, the engine's sizes, the method's
options; and the draft model as a proposer, which every method drafting with one builds the same way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when a proposer is built: `verispec --help` and argument checks need no PyTorch
    from ..models.kv_cache import KVCache
    from ..models.loading import LoadedModel
    from .cross_vocab import OtherVocabularyDrafter
    from .draft_model import BatchedDrafter


@dataclass(frozen=True, kw_only=True)
class Setup:
    """What a method's proposer is built from: the models as loaded, the engine's sizes, the method's options."""

    target: LoadedModel
    draft: LoadedModel | None  # the draft model (None: none given, or the method uses none)
    cache: KVCache  # the target's KV cache (what a drafter that reads the target attends to)
    slots: int
    k: int  # the draft model's most tokens a step (--num-speculative-tokens)
    context: int  # the longest context a sequence may have (prompt + generated)
    widest: int  # the most tokens one proposal holds (Method.widest(k)): the rows past the context a slot holds
    num_blocks: int  # the blocks each paged cache has (the target's number)
    options: Mapping[str, Any] = field(default_factory=dict)  # the method's options, each given or its default

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset(self.target.tokenizer.stop_token_ids)

    @cached_property
    def model(self) -> BatchedDrafter | OtherVocabularyDrafter | None:
        """The draft model as a proposer (draft_model_proposer), made once; None where none is given."""
        return draft_model_proposer(self)


def draft_model_proposer(setup: Setup) -> BatchedDrafter | OtherVocabularyDrafter | None:
    """The draft model as a proposer (None where none is given): its own paged cache of `num_blocks` blocks, room for
    the longest context and a catch-up's padded rows, its head restricted as the draft_vocab option says. A draft
    model of another vocabulary than the target's drafts through text (cross_vocab.py)."""
    if setup.draft is None:
        return None
    if not setup.target.tokenizer.shares_vocabulary(setup.draft.tokenizer):  # its method takes one (check)
        return other_vocabulary_drafter(setup)
    from ..models.draft_head import draft_ids
    from .draft_model import CATCH_UP_WIDTH, BatchedDrafter

    model = setup.draft.model
    ids = draft_ids(setup.options.get("draft_vocab"), model.config.vocab_size, setup.stop_ids)
    return BatchedDrafter(
        model, setup.target.model.config.vocab_size, num_slots=setup.slots,
        max_len=setup.context + max(setup.k, CATCH_UP_WIDTH) + 1, head_ids=ids, num_blocks=setup.num_blocks,
    )  # fmt: skip


def other_vocabulary_drafter(setup: Setup) -> OtherVocabularyDrafter:
    """A draft model of another vocabulary than its target's as a proposer (cross_vocab.py): a BatchedDrafter over
    its own ids (its head restricted as the draft_vocab option says, its own stop tokens kept), room for twice the
    context's tokens within its positions (it may cut a text into more tokens than the target: a longer context is
    windowed), behind the translation."""
    from ..models.draft_head import draft_ids
    from .cross_vocab import OtherVocabularyDrafter, Translation
    from .draft_model import CATCH_UP_WIDTH, BatchedDrafter

    model, tokenizer = setup.draft.model, setup.draft.tokenizer
    ids = draft_ids(setup.options.get("draft_vocab"), model.config.vocab_size, frozenset(tokenizer.stop_token_ids))
    max_len = min(model.config.max_position_embeddings, 2 * setup.context + 3 * setup.k + CATCH_UP_WIDTH + 2)
    drafter = BatchedDrafter(model, model.config.vocab_size, num_slots=setup.slots, max_len=max_len, head_ids=ids,
                             num_blocks=setup.num_blocks)  # fmt: skip
    return OtherVocabularyDrafter(drafter, Translation(setup.target.tokenizer, tokenizer))
