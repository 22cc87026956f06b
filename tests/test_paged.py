"""The paged KV cache (models/kv_cache.py) and what rests on it: memory that grows with the blocks used, reference
counts, copy on write, eviction; the native attention's bits wherever blocks lie; hashed prefix blocks outliving
their requests within a partition (engine/prefixes.py); the budget and admission (engine/budget.py)."""

from __future__ import annotations

import pytest
import torch
from test_stack import TREE_PARENTS, TREE_TOKENS, _path, _row_head
from test_stack import model as model  # a fixture: the native test model and its stack
from test_stack import path as path  # a fixture: each test runs on every path

from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams
from verispec.engine.budget import parse_memory
from verispec.engine.draft_model import BatchedDrafter
from verispec.engine.drafting import DraftJob
from verispec.engine.requests import EngineRequest, FinishEvent
from verispec.engine.scheduler import QueueFullError, Scheduler, SchedulerConfig
from verispec.errors import InvalidParameterError, PromptTooLongError
from verispec.models.kv_cache import BLOCK_SIZE, BlockRecord, CacheFullError, KVCache
from verispec.testing import tiny_config, tiny_loaded, tiny_model, truncated_copy


def _cache(model, slots: int, max_len: int, block_size: int = BLOCK_SIZE, blocks: int | None = None) -> KVCache:
    return KVCache(model.config, slots, max_len, model.cache_dtype, model.device, blocks, block_size)


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


# ---- the cache's mechanics ------------------------------------------------------------------------------------
def test_memory_grows_with_the_blocks_used_not_with_slots_times_length():
    """32 slots of 8192 positions of a 4-layer model in float32 would be 1 GiB; the pool is made untouched, and
    only the blocks handed out are written."""
    config = tiny_config(num_layers=4, hidden_size=256, num_kv_heads=2)  # 64-wide heads: 4 KiB per position
    before = _rss()
    cache = KVCache(config, 32, 8192, torch.float32, "cpu")
    assert cache.nbytes() == 32 * 8192 * 4096
    made = _rss() - before
    cache.ensure(0, 300)  # 5 blocks of 64 positions: 1.25 MiB
    used = _rss() - before
    assert cache.pool.touched == 5 and cache.used_bytes() == 5 * 64 * 4096
    assert made < 16 * 2**20 and used < 32 * 2**20, (made, used)
    cache.release(0)
    cache.ensure(1, 100)  # blocks given back are handed out before untouched ones
    assert cache.pool.touched == 5


def test_a_shared_block_is_copied_before_a_slot_writes_into_it(tiny):
    target, _ = tiny
    model = target.model
    cache = _cache(model, 2, 256, block_size=16)
    model(torch.tensor([list(range(1, 41))]), cache, [0])  # 40 positions: blocks 0, 1 full, 2 partly
    cache.fork(0, 1, 37)
    assert cache.blocks[1][:2] == cache.blocks[0][:2] and cache.blocks[1][2] != cache.blocks[0][2]
    assert [cache.pool.refs[b] for b in cache.blocks[0]] == [2, 2, 1]
    keys_0 = cache.gather(0, 0, 40)[0].clone()
    assert torch.equal(cache.gather(0, 1, 37)[0], keys_0[:, :37])  # the copied part of block 2 too
    cache.set_length(1, 20)  # back into the second shared block, then writing there
    model(torch.tensor([[200, 201, 202]]), cache, [1])
    assert cache.blocks[1][0] == cache.blocks[0][0] and cache.blocks[1][1] != cache.blocks[0][1]
    assert torch.equal(cache.gather(0, 0, 40)[0], keys_0)  # the other slot's keys untouched
    assert torch.equal(cache.gather(0, 1, 20)[0], keys_0[:, :20])


def test_reference_counts_never_free_a_block_in_use_and_idle_blocks_go_least_recently_used_first():
    config = tiny_config()
    cache = KVCache(config, 3, 64, torch.float32, "cpu", num_blocks=4, block_size=16)
    cache.ensure(0, 32)  # blocks 0, 1
    pool = cache.pool
    for index, block in enumerate(cache.blocks[0]):
        pool.register(block, BlockRecord(b"p%d" % index, [index] * 16, 64, b"k%d" % index))
    assert cache.share(1, pool.full[b"k0"])  # slot 1 takes block 0 too
    cache.release(0)  # block 1 turns idle; block 0 is still slot 1's
    assert list(pool.idle) == [1] and pool.refs[0] == 1
    cache.ensure(2, 48)  # 3 blocks: the 2 untouched, then block 1 evicted; never block 0
    assert sorted(cache.blocks[2]) == [1, 2, 3] and b"k1" not in pool.full and pool.full[b"k0"] == 0
    with pytest.raises(CacheFullError):
        cache.ensure(2, 64)
    cache.release(1)
    cache.release(2)  # given back last first: 3, 2, 1 (free), then block 0 idle
    assert list(pool.idle) == [0] and pool.available() == 4
    cache.ensure(1, 64)  # the free ones first, the idle one last
    assert sorted(cache.blocks[1][:3]) == [1, 2, 3] and cache.blocks[1][3] == 0 and not pool.full


def test_eviction_takes_blocks_nobody_reused_first_then_from_the_owner_keeping_the_most():
    """A flood of new prompts (registered, never taken again) once pushed a tenant's reused prompt out of one shared
    least-recently-used order; now never-reused blocks go first, and among reused ones the owner keeping the most idle
    gives first. A private owner's block is free as soon as no slot lists it."""
    cache = KVCache(tiny_config(), 3, 64, torch.float32, "cpu", num_blocks=6, block_size=16)
    pool = cache.pool

    def registered(slot: int, owner: str, count: int, keep: bool = True) -> list[int]:
        cache.ensure(slot, 16 * count)
        for block in cache.blocks[slot]:
            pool.register(block, BlockRecord(b"p", [block], 64, b"k%d" % block, owner, keep))
        return list(cache.blocks[slot])

    reused = registered(0, "a", 1)[0]
    cache.release(0)
    assert cache.share(1, reused)  # a later request takes it
    cache.release(1)
    flood = registered(2, "b", 4)  # newer, but nobody took them again
    cache.release(2)
    taken = [pool.allocate() for _ in range(5)]  # the one untouched block, then the four of the flood
    assert reused not in taken and set(flood) <= set(taken) and pool.records[reused].owner == "a"
    for block in taken:
        pool.drop(block)
    for owner, count in (("c", 1), ("d", 2)):  # reused blocks of two owners: d keeps the most idle
        blocks = registered(0, owner, count)
        cache.release(0)
        for block in blocks:
            pool.take(block)
            pool.drop(block)
    victims = {pool.records[block].owner for block in pool.idle if block in pool.reused}
    assert victims >= {"a", "c", "d"} and pool.records[pool._evict()].owner == "d"
    private = registered(2, "private", 1, keep=False)[0]
    cache.release(2)
    assert private in pool.free and private not in pool.records


def test_reserved_blocks_are_handed_to_their_slot_alone():
    cache = KVCache(tiny_config(), 2, 128, torch.float32, "cpu", num_blocks=4, block_size=16)
    assert cache.reserve(0, 3) and not cache.reserve(1, 2)
    cache.ensure(1, 16)
    with pytest.raises(CacheFullError):
        cache.ensure(1, 32)
    cache.ensure(0, 48)  # its three
    assert cache.reserved == [0, 0] and cache.pool.available() == 0
    cache.release(0)
    assert cache.pool.available() == 3


def test_memory_sizes_parse():
    assert parse_memory("4GiB") == 4 * 2**30 and parse_memory("512MiB") == 512 * 2**20
    assert parse_memory("1.5GB") == 1_500_000_000 and parse_memory("2000") == 2000 and parse_memory(7) == 7
    for bad in ("", "lots", "4 XB", "0", "-1GiB"):
        with pytest.raises(InvalidParameterError):
            parse_memory(bad)


# ---- the native stack through the table ------------------------------------------------------------------------
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
def test_where_blocks_lie_changes_no_bit(model, path, kv_dtype):
    """A prompt prefilled, then decoded and verified, in caches of blocks of 64, 5 and 32 positions, the latter two
    holding its blocks out of order (another sequence's given back in between): the logits and every key and value
    are the same bits (a tile of the attention crosses blocks of 5; keys are taken in position order wherever they
    lie)."""
    model, stack = model
    model.fused_blocks, model.kv_dtype = stack, kv_dtype
    prompt, drafted = [(37 * i + 11) % 256 for i in range(70)], [17, 4, 250, 9, 33]
    try:
        runs = []
        for block_size, scattered in ((64, False), (5, True), (32, True)):
            cache = _cache(model, 2, 128, block_size)
            if scattered:  # slot 1's blocks, given back, come between slot 0's
                model(torch.tensor([[5] * 30]), cache, [1], num_logits=1, invariant=False)
                model(torch.tensor([prompt[:13]]), cache, [0], num_logits=1, invariant=False)
                cache.release(1)
                for begin, end in ((13, 40), (40, 70)):
                    model(torch.tensor([prompt[begin:end]]), cache, [0], num_logits=1, invariant=False)
                assert cache.blocks[0] != sorted(cache.blocks[0])
            else:
                model(torch.tensor([prompt]), cache, [0], num_logits=1, invariant=False)
            decoded = model(torch.tensor([[3]]), cache, [0])[0, -1]
            verified = model(torch.tensor([drafted]), cache, [0])[0]
            runs.append((cache, decoded, verified))
        cache, decoded, verified = runs[0]
        for other, other_decoded, other_verified in runs[1:]:
            assert torch.equal(other_decoded, decoded) and torch.equal(other_verified, verified)
            for layer in range(2):
                for a, b in zip(other.gather(layer, 0, 76), cache.gather(layer, 0, 76), strict=True):
                    assert torch.equal(a, b)
    finally:
        model.fused_blocks, model.kv_dtype = None, None


@pytest.mark.parametrize("native_stack", [True, False], ids=["native", "torch"])
def test_a_kept_tree_path_across_block_boundaries_continues_as_the_chain_would(model, native_stack):
    """A token tree stored over three blocks of 4 positions: after keep_path, the next step is the same bits as
    after a chain pass along the path (on the native stack), or as close as ordinary attention's rounding allows."""
    model, stack = model
    model.fused_blocks = stack if native_stack else None
    batch_invariant = [block.attn.batch_invariant for block in model.layers]
    for block in model.layers:  # the per-query attention takes no trees: ordinary attention does
        block.attn.batch_invariant = native_stack and block.attn.batch_invariant
    try:
        cache = _cache(model, 1, 128, block_size=4)
        model(torch.tensor([list(range(30, 71))]), cache, [0], num_logits=1, invariant=False)  # 41: mid-block
        start = cache.lengths[0]
        path = _path(8)  # [0, 6, 7, 8]: stored at start + 0, 6, 7, 8, over three blocks
        model(torch.tensor([TREE_TOKENS]), cache, [0], parents=[TREE_PARENTS])
        cache.keep_path(0, start, path)
        after_tree = model(torch.tensor([[99]]), cache, [0], head=_row_head(model))[0, -1]
        cache.set_length(0, start)
        model(torch.tensor([[TREE_TOKENS[i] for i in path]]), cache, [0])
        after_chain = model(torch.tensor([[99]]), cache, [0], head=_row_head(model))[0, -1]
    finally:
        model.fused_blocks = None
        for block, invariant in zip(model.layers, batch_invariant, strict=True):
            block.attn.batch_invariant = invariant
    if native_stack:
        assert torch.equal(after_tree, after_chain)
    else:
        torch.testing.assert_close(after_tree, after_chain, atol=1e-4, rtol=1e-4)


# ---- prefix blocks in the engine --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def long_pair():
    """The tiny pair with a context long enough for a 2k-token prefix."""
    config = tiny_config(num_layers=4, max_position_embeddings=4096)
    target = tiny_model(config, seed=0, scale=2.0, residual_gain=0.3)
    return tiny_loaded(target), tiny_loaded(truncated_copy(target, 1), name="tiny-draft")


def _run(scheduler: Scheduler, prompt: list[int], partition: str = "", max_tokens: int = 8, **options):
    """One request through `scheduler`; (its output, the prompt tokens it reused)."""
    done, before = [], scheduler.metrics.prefill_reused_tokens._value.get()
    sink = lambda event: done.append(event) if isinstance(event, FinishEvent) else None  # noqa: E731
    request = EngineRequest(
        request_id="r",
        prompt_ids=prompt,
        params=SamplingParams(),
        max_tokens=max_tokens,
        sink=sink,
        partition=partition,
        **options,
    )
    scheduler.submit(request)
    scheduler.run_until_idle()
    return done[0].output, scheduler.metrics.prefill_reused_tokens._value.get() - before


def _config(**overrides) -> SchedulerConfig:
    return SchedulerConfig(**{"max_num_seqs": 1, "max_model_len": 2400, "prefill_chunk": 128, **overrides})


def test_a_long_shared_prefix_is_reused_after_its_slot_served_another_request(long_pair):
    """A 2k-token prefix outlives the request that prefilled it: after another request took the one slot (and left
    it), a request of the same partition reuses the prefix (to the last chunk both prompts end alike: this model's
    passes are not row-invariant) and decodes as it does alone; another partition reuses nothing (the control)."""
    target, draft = long_pair
    prefix = [(7 * i + 3) % 250 for i in range(2048)]
    first, other, second = prefix + [1, 2, 3], [(11 * i) % 250 for i in range(300)], prefix + [9, 8, 7, 6]
    scheduler = Scheduler(target, draft, _config())
    assert _run(scheduler, first, "tenant")[1] == 0
    assert _run(scheduler, other, "tenant")[1] == 0  # the slot's next request: nothing shared
    output, reused = _run(scheduler, second, "tenant")
    assert reused == 2048  # every full chunk of the prefix (the rest, in its last chunk, differs)
    alone = _run(Scheduler(target, draft, _config()), second, "tenant")[0]
    assert output.token_ids == alone.token_ids
    assert _run(scheduler, second, "tenant")[1] == len(second) - 1  # all of it, the same prompt
    assert _run(scheduler, second, "other tenant")[1] == 0


def test_a_row_invariant_prefix_is_reused_to_the_token_after_its_slot_served_another_request(model):
    """On the native stack prefix blocks are shared whole and the rest copied to the token."""
    from verispec.testing import tiny_loaded

    model, stack = model
    model.fused_blocks = stack
    try:
        target = tiny_loaded(model)
        start = [(37 * i + 11) % 256 for i in range(150)]  # two full blocks and 22 positions
        config = SchedulerConfig(max_num_seqs=1, max_model_len=256, draft_policy="never", prefill_chunk=32)
        shared = Scheduler(target, None, config)
        _run(shared, start + [5, 9, 77, 3])
        _run(shared, [(5 * i) % 256 for i in range(100)])
        after, reused = _run(shared, start + [200, 14, 8])
        assert reused == len(start)
        assert shared.cache.pool.refs[shared.cache.pool.full[shared.prefixes.prompt(start + [1]).keys[0]]] == 0
        alone = _run(Scheduler(target, None, config), start + [200, 14, 8])[0]
        assert after.token_ids == alone.token_ids
    finally:
        model.fused_blocks = None


def test_evicted_prefixes_recompute_to_the_same_bits(long_pair):
    """Under a budget of a few blocks, a third prompt evicts the first's idle blocks (least recently used first):
    the first, sent again, reuses only what is left, and prefills the rest to the same bits as before (chunks of
    a block: this model's reuse ends where chunks end)."""
    target, _ = long_pair
    block_bytes = KVCache.block_bytes(target.model.config, target.model.cache_dtype)
    config = _config(max_model_len=600, kv_cache_memory=12 * block_bytes, draft_policy="never", prefill_chunk=64)
    scheduler = Scheduler(target, None, config)
    assert scheduler.cache.num_blocks == 12
    prompts = [[(a * i + 1) % 250 for i in range(320)] for a in (3, 5, 7)]  # 5 blocks of prefill each
    keys = scheduler.prefixes.prompt(prompts[0]).keys
    first = _run(scheduler, prompts[0])[0]
    blocks = [scheduler.cache.pool.full[key] for key in keys]
    held = [(scheduler.cache.keys[0][b].clone(), scheduler.cache.values[1][b].clone()) for b in blocks]
    _run(scheduler, prompts[1])
    assert all(key in scheduler.cache.pool.full for key in keys)  # 10 of 12 blocks prefilled: nothing evicted yet
    _run(scheduler, prompts[2])
    left = [key in scheduler.cache.pool.full for key in keys]
    assert left[0] and not all(left)  # the first prompt's end went first, its start stays
    again, reused = _run(scheduler, prompts[0])
    assert 0 < reused < len(prompts[0]) - 1 and again.token_ids == first.token_ids
    for key, (k, v) in zip(keys, held, strict=True):
        block = scheduler.cache.pool.full[key]
        assert torch.equal(scheduler.cache.keys[0][block], k) and torch.equal(scheduler.cache.values[1][block], v)


def test_requests_that_do_not_fit_wait_then_complete_as_alone(long_pair):
    """Three requests, three slots, blocks for about one and a half: the second waits (and the third behind it)
    until the first gives its blocks back; each decodes as it does alone. A full queue is still refused."""
    target, draft = long_pair
    block_bytes = KVCache.block_bytes(target.model.config, target.model.cache_dtype) + KVCache.block_bytes(
        draft.model.config, draft.model.cache_dtype
    )
    config = _config(max_num_seqs=3, max_queue=0, max_model_len=400, kv_cache_memory=8 * block_bytes)
    scheduler = Scheduler(target, draft, config)
    prompts = [[(a * i + 2) % 250 for i in range(200)] for a in (3, 5, 7)]
    outputs = {}
    for i, prompt in enumerate(prompts):  # each needs 200 + 60 + room: 5 blocks
        sink = lambda event, i=i: outputs.update({i: event.output}) if isinstance(event, FinishEvent) else None  # noqa: E731
        scheduler.submit(
            EngineRequest(
                request_id=str(i), prompt_ids=prompt, params=SamplingParams(), max_tokens=60, sink=sink, ignore_eos=True
            )
        )
    with pytest.raises(QueueFullError):
        scheduler.submit(
            EngineRequest(
                request_id="3", prompt_ids=prompts[0], params=SamplingParams(), max_tokens=60, sink=lambda event: None
            )
        )
    scheduler.step()
    assert len(scheduler.running) == 1 and scheduler.admitter.waiting_for_blocks and len(scheduler.waiting) == 2
    assert sorted(scheduler.free_slots) == [1, 2]
    scheduler.run_until_idle()
    for i, prompt in enumerate(prompts):
        alone = _run(Scheduler(target, draft, _config(max_model_len=400)), prompt, max_tokens=60, ignore_eos=True)[0]
        assert outputs[i].token_ids == alone.token_ids, i
    assert scheduler.cache.pool.reserved == 0 and scheduler.cache.pool.in_use() == 0


def test_a_request_larger_than_the_budget_is_refused_and_the_context_cut_to_it(long_pair):
    target, _ = long_pair
    block_bytes = KVCache.block_bytes(target.model.config, target.model.cache_dtype)
    scheduler = Scheduler(target, None, _config(kv_cache_memory=4 * block_bytes))
    assert scheduler.max_model_len == 4 * BLOCK_SIZE - scheduler.widest - 1
    with pytest.raises(PromptTooLongError, match="KV cache budget"):
        scheduler.submit(
            EngineRequest(
                request_id="big",
                prompt_ids=list(range(200)),
                params=SamplingParams(),
                max_tokens=100,
                sink=lambda event: None,
            )
        )
    with pytest.raises(PromptTooLongError, match="KV cache budget"):
        scheduler.check_prompt([1] * 300)
    assert _run(scheduler, list(range(100)), max_tokens=100)[0].token_ids  # what fits runs
    too_small = rf"of {block_bytes // 2} bytes .* too few .* at least {block_bytes}"  # the budget given, the least
    with pytest.raises(InvalidParameterError, match=too_small):
        Scheduler(target, None, _config(kv_cache_memory=block_bytes // 2))


def test_the_draft_cache_gives_way_and_a_job_without_room_drafts_nothing(long_pair):
    """The draft model's cache is best effort: a job short of blocks takes those of slots not drafting now, and
    where none are left it drafts nothing (its sequence decodes plainly that step) instead of failing."""
    target, draft = long_pair
    vocab = target.model.config.vocab_size
    drafter = BatchedDrafter(draft.model, vocab, 3, 512, None, num_blocks=6)

    def job(slot: int, tokens: list[int]) -> DraftJob:
        return DraftJob(slot=slot, tokens=tokens, k=2, params=SamplingParams(), noise=KeyedNoise(0, vocab))

    a, b, c = ([(n * i + n) % 250 for i in range(length)] for n, length in ((3, 150), (5, 150), (7, 180)))
    assert drafter.propose([job(0, a)])[0].tokens.numel() == 2  # 3 blocks
    assert drafter.propose([job(1, b)])[0].tokens.numel() == 2  # 3 more: all six
    assert drafter.propose([job(2, c)])[0].tokens.numel() == 2  # 3: slot 0 (least recently used) gives way
    assert not drafter.fed[0] and drafter.fed[1]
    proposals = drafter.propose([job(2, c + [1] * 10), job(0, b)])  # slot 2 takes slot 1's; slot 0 finds none
    assert [p.tokens.numel() for p in proposals] == [2, 0] and not drafter.fed[1]


# ---- blocks taken as written, preemption, answers kept, tenants served fairly (a row-invariant target) ------------
@pytest.fixture
def invariant(model):
    """The native test model on its stack (row-invariant: decoding writes a prefill's bits), as a loaded target."""
    model, stack = model
    model.fused_blocks = stack
    yield tiny_loaded(model)
    model.fused_blocks = None


def _invariant_config(**overrides) -> SchedulerConfig:
    values = {"max_num_seqs": 3, "max_model_len": 480, "prefill_chunk": 32, "speculative_method": "suffix",
              "draft_policy": "always"}  # fmt: skip
    return SchedulerConfig(**(values | overrides))


def _submit(scheduler: Scheduler, name: str, prompt: list[int], max_tokens: int, outputs: dict, **options) -> None:
    sink = lambda event: outputs.update({name: event.output}) if isinstance(event, FinishEvent) else None  # noqa: E731
    params = SamplingParams(**options.pop("params", {}))
    scheduler.submit(EngineRequest(request_id=name, prompt_ids=prompt, params=params, max_tokens=max_tokens, sink=sink,
                                   ignore_eos=True, **options))  # fmt: skip


def _alone(target, prompt: list[int], max_tokens: int, **params) -> list[int]:
    outputs: dict = {}
    scheduler = Scheduler(target, None, _invariant_config(max_num_seqs=1))
    _submit(scheduler, "alone", prompt, max_tokens, outputs, params=params)
    scheduler.run_until_idle()
    return outputs["alone"].token_ids


def test_a_request_reserves_its_prompt_not_its_max_tokens(invariant):
    """A request that may write to the end of the context (a chat without max_tokens) once reserved all of it, and the
    next request waited for it to end; now each takes blocks as it writes, and both run together."""
    block_bytes = KVCache.block_bytes(invariant.model.config, invariant.model.cache_dtype)
    scheduler = Scheduler(invariant, None, _invariant_config(kv_cache_memory=10 * block_bytes))
    assert scheduler.on_demand
    long, short = [(3 * i + 1) % 250 for i in range(70)], [(5 * i + 2) % 250 for i in range(30)]
    outputs: dict = {}
    _submit(scheduler, "long", long, scheduler.max_model_len - len(long), outputs)
    _submit(scheduler, "short", short, 16, outputs)
    scheduler.step()
    assert len(scheduler.running) == 2 and scheduler.cache.pool.reserved <= 4
    while "short" not in outputs:
        scheduler.step()
    assert "long" not in outputs and outputs["short"].token_ids == _alone(invariant, short, 16)
    scheduler.run_until_idle()
    assert outputs["long"].token_ids == _alone(invariant, long, len(outputs["long"].token_ids))


@pytest.mark.parametrize("params", [{}, {"temperature": 0.9, "seed": 7}], ids=["greedy", "sampled"])
def test_a_sequence_preempted_for_blocks_resumes_to_the_output_it_has_alone(invariant, params):
    """Three sequences that need more blocks than the budget holds: the youngest gives its blocks back whenever one
    runs out, and resumes later, prefilling what it lost (what it decoded stays registered); every output is the one
    it has alone, greedy or sampled with a seed. The control: the budget fits them all, and nothing is preempted."""
    block_bytes = KVCache.block_bytes(invariant.model.config, invariant.model.cache_dtype)
    prompts = [[(a * i + 2) % 250 for i in range(90)] for a in (3, 5, 7)]
    for blocks, preempted in ((9, True), (40, False)):
        scheduler = Scheduler(invariant, None, _invariant_config(kv_cache_memory=blocks * block_bytes))
        outputs: dict = {}
        for i, prompt in enumerate(prompts):
            _submit(scheduler, str(i), prompt, 150, outputs, params=params)
        scheduler.run_until_idle()
        assert (scheduler.metrics.preemptions._value.get() > 0) == preempted
        for i, prompt in enumerate(prompts):
            assert outputs[str(i)].token_ids == _alone(invariant, prompt, 150, **params), (blocks, i)
        assert scheduler.cache.pool.reserved == 0 and scheduler.cache.pool.in_use() == 0


def test_an_answer_is_reused_by_the_next_turn_and_decodes_as_a_fresh_engine(invariant):
    """The blocks decoding filled are registered: a next turn whose prompt holds the answer prefills only what is new,
    to the bits a fresh engine computes (its output the same); the answer's blocks are not another partition's."""
    scheduler = Scheduler(invariant, None, _invariant_config(max_num_seqs=1))
    prompt = [(7 * i + 3) % 250 for i in range(40)]
    first = _run(scheduler, prompt, "tenant", max_tokens=150, ignore_eos=True)[0]
    turn = prompt + first.token_ids + [11, 12, 13]
    second, reused = _run(scheduler, turn, "tenant", max_tokens=20, ignore_eos=True)
    assert reused >= (len(prompt) + len(first.token_ids)) // BLOCK_SIZE * BLOCK_SIZE  # what decoding filled
    assert second.stats.cached_tokens == reused
    fresh = _run(Scheduler(invariant, None, _invariant_config(max_num_seqs=1)), turn, max_tokens=20, ignore_eos=True)
    assert second.token_ids == fresh[0].token_ids
    assert _run(scheduler, turn, "other tenant", max_tokens=1)[1] == 0


def _burst_beside_one_request(invariant, members: list[str]) -> None:
    """Tenant a fills every slot and queues more (its requests under `members`); tenant b's one request is admitted
    next (the youngest of a's is preempted) and ends long before a's burst; every output is the one it has alone."""
    scheduler = Scheduler(invariant, None, _invariant_config(max_num_seqs=2))
    prompts = [[(a * i + 1) % 250 for i in range(60)] for a in range(3, 9)]
    outputs: dict = {}
    finished: list[str] = []
    for i, (prompt, member) in enumerate(zip(prompts, members, strict=True)):
        _submit(scheduler, f"a{i}", prompt, 40, outputs, tenant="a", member=member)
    scheduler.step()
    _submit(scheduler, "b", prompts[0][::-1], 8, outputs, tenant="b")
    scheduler.step()
    assert {seq.request.tenant for seq in scheduler.running.values()} == {"a", "b"}
    while scheduler.step():
        finished += [name for name in outputs if name not in finished]
    assert finished.index("b") <= 1
    assert outputs["b"].token_ids == _alone(invariant, prompts[0][::-1], 8)
    for i, prompt in enumerate(prompts):
        assert outputs[f"a{i}"].token_ids == _alone(invariant, prompt, 40)


def test_one_tenants_burst_does_not_hold_another_tenants_request(invariant):
    _burst_beside_one_request(invariant, [""] * 6)


def test_a_tenant_naming_a_new_user_per_request_gets_no_more_than_its_share(invariant):
    """The burst's requests each under a new `user` (a member of tenant a): b's request is still admitted next. When
    every user counted as a tenant of its own, a's six users each ran one sequence, b's request ran none, and it
    waited for a's burst (171 s in a probe)."""
    _burst_beside_one_request(invariant, [f"u{i}" for i in range(6)])


def test_within_a_tenant_its_members_take_turns():
    """Admission ranks tenants first, then the members within one: u1's request goes before u0's second."""
    from verispec.engine.admission import WaitingQueue, fairness_victim

    queue: WaitingQueue[str] = WaitingQueue()
    queue.append("u0-second", ("a", "u0"), 1.0)
    queue.append("u1-first", ("a", "u1"), 2.0)
    queue.append("b-first", ("b", ""), 3.0)
    running = {("a", "u0"): 1}
    assert queue.first(running) == ("b-first", "b")  # the tenant running none first, though it came last
    queue.remove("b-first")
    assert queue.first(running) == ("u1-first", "a")  # then, within a, the member running none
    many = {("a", f"u{i}"): 1 for i in range(6)}
    assert fairness_victim("b", many) == "a"  # six members of one tenant are six of its sequences
    assert fairness_victim("b", {("a", "u0"): 1}) is None


def _paced(scheduler: Scheduler, chunk_seconds: float, step_seconds: float) -> list[str]:
    """The scheduler's prefill pacing told that every chunk costs `chunk_seconds` and every decode step
    `step_seconds` (as test_policy injects pass costs): what it does is then a function of the rules alone. Returns
    the log of chunks computed ('chunk:<request>') and steps run."""
    events: list[str] = []
    prefilled, decoded = scheduler.pacer.prefilled, scheduler.pacer.decoded
    compute = scheduler.prefill.compute_chunk

    def chunk(seq, contended):
        events.append(f"chunk:{seq.request.request_id}")
        compute(seq, contended)

    scheduler.prefill.compute_chunk = chunk
    scheduler.pacer.prefilled = lambda seconds, tokens, contended: prefilled(chunk_seconds, tokens, contended)
    scheduler.pacer.decoded = lambda seconds: (events.append("step"), decoded(step_seconds))[1]
    return events


def test_a_long_prefill_gives_another_tenants_decoding_half_the_loop(invariant):
    """Tenant a's long prompt prefills while tenant b decodes: each chunk of a's (cut to SLICE_SECONDS at the
    measured rate on this row-invariant target) is paid back by b's decode steps before the next one runs, so b's
    tokens are no longer paced one chunk each (a 9-token answer took 28-42x its time alone beside a 3,524-token
    prefill). Every output is the one it has alone, though a's chunks were cut where they would not be alone."""
    from verispec.engine.prefill_pacing import MIN_SLICE_TOKENS

    scheduler = Scheduler(invariant, None, _invariant_config(max_num_seqs=2, prefill_chunk=32, max_model_len=480))
    events = _paced(scheduler, chunk_seconds=0.04, step_seconds=0.01)
    scheduler.pacer.rates.extend([0.2 / MIN_SLICE_TOKENS] * 2)  # a slice holds MIN_SLICE_TOKENS tokens
    short, long = [(5 * i + 2) % 250 for i in range(20)], [(3 * i + 1) % 250 for i in range(400)]
    outputs: dict = {}
    _submit(scheduler, "b", short, 24, outputs, tenant="b")
    while not any(seq.request.request_id == "b" and not seq.prefilling for seq in scheduler.running.values()):
        scheduler.step()
    _submit(scheduler, "a", long, 4, outputs, tenant="a")
    while "b" not in outputs:
        scheduler.step()
    while_b = events[events.index("step") :]
    chunks = while_b.count("chunk:a")
    assert chunks <= 1 + while_b.count("step") * 0.01 / 0.04 + 1e-9, while_b  # half the loop at most
    assert chunks >= 2  # and a's prefill went on meanwhile
    scheduler.run_until_idle()
    assert outputs["b"].token_ids == _alone(invariant, short, 24)
    assert outputs["a"].token_ids == _alone(invariant, long, 4)


def test_without_another_tenant_decoding_a_prefill_runs_whole_chunks_back_to_back(invariant):
    """One tenant alone: chunks of prefill_chunk tokens, one every step, nothing owed (the control of the test
    above: the same costs, b's request of the same tenant as a's)."""
    scheduler = Scheduler(invariant, None, _invariant_config(max_num_seqs=2, prefill_chunk=32, max_model_len=480))
    events = _paced(scheduler, chunk_seconds=0.04, step_seconds=0.01)
    short, long = [(5 * i + 2) % 250 for i in range(20)], [(3 * i + 1) % 250 for i in range(400)]
    outputs: dict = {}
    _submit(scheduler, "b", short, 24, outputs, tenant="a")
    while not any(not seq.prefilling for seq in scheduler.running.values()):
        scheduler.step()
    _submit(scheduler, "a", long, 4, outputs, tenant="a")
    steps = 0
    while "a" not in outputs:
        scheduler.step()
        steps += 1
    assert events.count("chunk:a") == -(-(len(long) - 1) // 32)  # whole chunks
    assert events.count("chunk:a") + 4 >= steps  # one every step, but for a's own 4 decode steps
    assert scheduler.pacer.owed == 0.0


def test_chunks_stay_short_a_while_after_another_owner_last_decoded(monkeypatch):
    """A client that sends its next short request as soon as the last one ends found a whole chunk under way each
    time (3.3x its time alone beside a 3,500-token prompt): chunks stay cut to a slice for RECENT_SECONDS after
    another owner last decoded, then grow back to whole chunks."""
    import verispec.engine.prefill_pacing as pacing

    now = [100.0]
    monkeypatch.setattr(pacing.time, "perf_counter", lambda: now[0])
    pacer = pacing.PrefillPacer(128, resizable=True)
    pacer.prefilled(0.64, 128, contended=False)  # 5 ms a token: a slice holds 40 tokens
    assert pacer.tokens(contended=False) == 128  # nobody else has decoded yet
    assert not pacer.waits(contended=True) and pacer.tokens(contended=True) == 40
    now[0] += pacing.RECENT_SECONDS / 2
    assert not pacer.waits(contended=False) and pacer.tokens(contended=False) == 40  # the other just finished
    now[0] += pacing.RECENT_SECONDS
    assert pacer.tokens(contended=False) == 128
    assert pacing.PrefillPacer(128, resizable=False).tokens(contended=True) == 128  # where cuts would change bits
