"""The engine's caches and its proposer, sized together: the target's paged KV cache and whatever the method's drafter
keeps per block of positions (Method.cache_bytes) come out of one budget (budget.py), and the method builds its
proposer over what is left (Method.build). Nothing here knows a method by its name."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import InvalidParameterError
from ..models.kv_cache import BLOCK_SIZE, KVCache
from ..models.loading import LoadedModel
from ..models.recurrent_state import RecurrentState
from .budget import cache_blocks
from .methods import Method
from .prefixes import PrefixBlocks
from .proposer import Proposer
from .setup import Setup

log = logging.getLogger("verispec.server")

DEFAULT_SLOT_TOKENS = 4096  # what the default KV budget holds per slot (less where the context is shorter)


@dataclass(frozen=True, kw_only=True)
class CacheSizes:
    """What the caches are sized for."""

    slots: int
    k: int
    context: int  # the longest context the models and the configuration allow
    prefill_chunk: int
    answer_reuse: bool
    kv_cache_memory: int | None  # bytes for every KV cache together; None: the default budget


@dataclass(frozen=True, kw_only=True)
class EngineCaches:
    cache: KVCache  # the target's
    prefixes: PrefixBlocks  # prompt starts reused (prefixes.py)
    proposer: Proposer | None  # None: plain decoding
    widest: int  # the most tokens a proposal holds: the rows past a context its cache keeps room for
    context: int  # the longest context a sequence may have (cut where the budget holds less)
    context_cut: bool  # the budget, not the models or the configuration, set `context`
    on_demand: bool  # blocks taken as written, a sequence preempted where none is left (a row-invariant target)


def allocate(target: LoadedModel, draft: LoadedModel | None, method: Method | None, *, sizes: CacheSizes,
             options: dict) -> EngineCaches:  # fmt: skip
    """The caches of the target and of the method's drafter, paged (models/kv_cache.py) in as many blocks each as the
    budget pays for (budget.py), and the method's proposer. A sequence may hold up to `context` positions and the
    room padded rows take past its last real one (verify rows are `widest` + 1 wide); where the budget holds fewer
    for one sequence, the context is cut to what it holds."""
    widest = method.widest(sizes.k) if method is not None else sizes.k
    block_bytes = KVCache.block_bytes(target.model.config, target.model.cache_dtype)
    if method is not None:
        block_bytes += method.cache_bytes(target, draft)
    # the default budget: each slot's DEFAULT_SLOT_TOKENS, and at least one whole context (blocks are taken as
    # written, so one long request may use what many short ones would)
    wanted = max(sizes.slots * _blocks(min(sizes.context, DEFAULT_SLOT_TOKENS) + widest + 1),
                 _blocks(sizes.context + widest + 1))  # fmt: skip
    budget = _block_budget(target, sizes, widest)
    num_blocks = cache_blocks(budget, wanted, block_bytes, target.model.device)
    context, cut = _context_held(num_blocks, block_bytes, widest, sizes)
    cache = target.model.new_cache(sizes.slots, context + widest + 1, num_blocks)
    # prefill reuse (prefixes.py): to the token where the target's passes are row-invariant (the native stack, or
    # one pass shape); none on a hybrid model (a block's keys without the recurrent state at its end are of no use)
    invariant = target.model.row_invariant
    prefixes = PrefixBlocks(
        cache,
        None if invariant else sizes.prefill_chunk,
        answers=sizes.answer_reuse,
        reuse=not target.model.config.hybrid,
    )
    proposer = None
    if method is not None:
        setup = Setup(target=target, draft=draft, cache=cache, slots=sizes.slots, k=sizes.k, context=context,
                      widest=widest, num_blocks=num_blocks, options=method.settings(options))  # fmt: skip
        proposer = method.build(setup)
    # blocks taken as they are written, a sequence preempted where none is left: where a prefill of its tokens writes
    # the bits decoding wrote (row-invariant passes), so that a resumed sequence goes on exactly; else each request
    # reserves its whole length when admitted
    return EngineCaches(cache=cache, prefixes=prefixes, proposer=proposer, widest=widest, context=context,
                        context_cut=cut, on_demand=invariant)  # fmt: skip


def _context_held(num_blocks: int, block_bytes: int, widest: int, sizes: CacheSizes) -> tuple[int, bool]:
    """The longest context `num_blocks` blocks hold for one sequence, and whether that cuts the configured one."""
    held = num_blocks * BLOCK_SIZE - widest - 1
    if held < 2:
        budget = num_blocks * block_bytes if sizes.kv_cache_memory is None else sizes.kv_cache_memory
        raise InvalidParameterError(
            f"a KV cache budget of {budget} bytes holds {num_blocks} blocks of {BLOCK_SIZE} "
            f"tokens ({block_bytes} bytes each, both models): too few for a sequence; give at least "
            f"{-(-(widest + 3) // BLOCK_SIZE) * block_bytes} bytes"
        )
    if held >= sizes.context:
        return sizes.context, False
    log.warning("the KV cache budget holds %d tokens: the context is cut from %d to %d tokens",
                num_blocks * BLOCK_SIZE, sizes.context, held)  # fmt: skip
    return held, True


def _block_budget(target: LoadedModel, sizes: CacheSizes, widest: int) -> int | None:
    """What --kv-cache-memory leaves for the KV blocks (None: the default budget): a hybrid model's recurrent state is
    taken first, for every slot at every length a verify pass keeps (models/recurrent_state.py)."""
    budget, config = sizes.kv_cache_memory, target.model.config
    if budget is None or not config.hybrid:
        return budget
    # a verify pass's rows' states in one of two tensors per slot and layer, and a prefill's last state
    states = sizes.slots * (2 * (widest + 1) + 1) * RecurrentState.slot_bytes(config)
    if budget <= states:
        raise InvalidParameterError(
            f"a KV cache budget of {budget} bytes does not hold the linear-attention state: {states} bytes for "
            f"{sizes.slots} sequences at up to {2 * (widest + 1) + 1} lengths each"
        )
    return budget - states


def _blocks(positions: int) -> int:
    return -(-positions // BLOCK_SIZE)
