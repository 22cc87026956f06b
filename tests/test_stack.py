"""The native decoder stack (kernels/stack.py, csrc/vsk_stack.c): the same model as its blocks run one by one,
and each row's result the same bits whatever shares its pass, on every path this CPU runs."""

from __future__ import annotations

import pytest
import torch
from test_kernels import TYPES, random_blocks
from test_kernels import path as path  # a fixture: each test runs on every path

from verispec.kernels import native
from verispec.kernels.linear import NativeLinear
from verispec.models.gguf_native import native_stack
from verispec.testing import tiny_config, tiny_model

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels not compiled")


def _linear(k: int, parts: list[tuple[str, int]], seed: int, bias: bool = False) -> NativeLinear:
    made = [(int(TYPES[name]), torch.from_numpy(random_blocks(int(TYPES[name]), rows, k, seed + i, scale=0.002)))
            for i, (name, rows) in enumerate(parts)]  # fmt: skip
    out = sum(rows for _, rows in parts)
    return NativeLinear(k, made, torch.randn(out, generator=torch.Generator().manual_seed(seed)) if bias else None)


@pytest.fixture(scope="module")
def model():
    """A 2-block model whose products are GGUF blocks of every type, one type per matrix (dense too: all three
    activation formats, mixed within one product), with q/k/v bias."""
    config = tiny_config(hidden_size=256, num_layers=2, intermediate_size=512)  # 4 heads of 64, 2 kv heads
    model = tiny_model(config, seed=0)
    types = [  # per block: q, k, v, o, gate, up, down
        ("Q4_K", "Q5_0", "Q6_K", "Q8_0", "Q5_K", "IQ4_NL", "Q3_K"),
        ("IQ4_XS", "Q4_1", "F16", "BF16", "Q2_K", "Q4_0", "F32"),
    ]
    for i, block in enumerate(model.layers):
        q, k, v, o, gate, up, down = types[i]
        block.attn.wqkv = _linear(256, [(q, 256), (k, 128), (v, 128)], 10 * i, bias=True)
        block.attn.wo = _linear(256, [(o, 256)], 10 * i + 3)
        block.mlp.w_gate_up = _linear(256, [(gate, 512), (up, 512)], 10 * i + 4)
        block.mlp.w_down = _linear(512, [(down, 256)], 10 * i + 6)
        block.attn.batch_invariant = True
        block.attn.attend_per_query = native.attention
    stack = native_stack(config, model)
    assert stack is not None
    return model, stack


def _prefilled(model, prompts: list[list[int]]):
    cache = model.new_cache(len(prompts), 64)
    for slot, prompt in enumerate(prompts):
        model(torch.tensor([prompt]), cache, [slot], num_logits=1, invariant=False)
    return cache


def test_the_stack_computes_what_the_blocks_compute(model, path):
    model, stack = model
    prompt = list(range(40, 60))  # 20 tokens: a prefill takes the blocks one by one
    caches, logits = [], []
    for fused in (None, stack):
        model.fused_blocks = fused
        cache = _prefilled(model, [prompt])
        steps = [model(torch.tensor([[t]]), cache, [0], num_logits=1)[0, -1] for t in (7, 99, 3, 250, 12, 5)]
        caches.append(cache)
        logits.append(torch.stack(steps))
    model.fused_blocks = None
    scale = logits[0].abs().max()
    assert scale > 1.0
    assert (logits[1] - logits[0]).abs().max() < 1e-4 * scale
    for layer in range(2):  # and the keys and values it wrote, up to an activation's rounding flipped by the steps
        for kind in ("keys", "values"):  # between the products (a different order of float operations)
            blocks, stacked = (getattr(c, kind)[layer][0, :, :26] for c in caches)
            assert torch.allclose(stacked, blocks, atol=1e-3 * blocks.abs().max())


def _run(model, stack, cache, rows: list[tuple[int, int, int]]) -> torch.Tensor:
    """rows (slot, position, token) through the stack alone: the hidden states, bit for bit."""
    cos, sin = model.rope_tables(cache.max_len)
    x = model.embed(torch.tensor([t for _, _, t in rows])).float().contiguous()
    stack(x, cache, cos, sin, [s for s, _, _ in rows], [p for _, p, _ in rows])
    return x


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
def test_each_row_is_the_same_bits_alone_in_a_verify_pass_and_beside_other_sequences(model, path, kv_dtype):
    """With the cache in halves (the native models' default) and in float32, and prompts long enough that the
    attention's tiles of 32 positions and its blocks of 16 rows are crossed."""
    model, stack = model
    prompts = [list(range(30, 72)), list(range(200, 209))]
    drafted = [17, 4, 250, 9, 33, 71, 2, 140, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    model.kv_dtype = kv_dtype
    try:
        cache = _prefilled(model, prompts)
    finally:
        model.kv_dtype = None
    assert cache.keys[0].dtype == kv_dtype
    start = len(prompts[0])
    alone = [_run(model, stack, cache, [(0, start + i, t)])[0] for i, t in enumerate(drafted)]  # decode steps
    for n in range(2, len(drafted) + 1):  # a verify pass of n rows
        together = _run(model, stack, cache, [(0, start + i, t) for i, t in enumerate(drafted[:n])])
        for i in range(n):
            assert torch.equal(together[i], alone[i]), (n, i)
    others = [(1, 9 + i, t) for i, t in enumerate([5, 6, 7, 8, 9, 10, 11, 12])]
    mixed = _run(model, stack, cache, others[:4] + [(0, start + i, t) for i, t in enumerate(drafted)] + others[4:])
    for i in range(len(drafted)):
        assert torch.equal(mixed[4 + i], alone[i]), i
    # the rows of the other sequence are what they are alone too, and differ from the first's (a live check)
    assert torch.equal(mixed[0], _run(model, stack, cache, [others[0]])[0])
    assert not torch.equal(mixed[0], mixed[4])


def test_a_prefill_cut_into_calls_is_the_same_bits_as_one_call(model, monkeypatch):
    """Long passes go to the stack in chunks of rows (bounded scratch); each row sees the keys and values the
    chunks before it wrote, so where the cuts fall changes nothing."""
    import verispec.models.model

    model, stack = model
    model.fused_blocks = stack
    prompts = [list(range(50, 90)), list(range(120, 151))]
    try:
        whole = model(torch.tensor([prompts[0][:31], prompts[1]]), model.new_cache(2, 64), [0, 1])
        monkeypatch.setattr(verispec.models.model, "FUSED_CHUNK_ROWS", 7)
        cut = model(torch.tensor([prompts[0][:31], prompts[1]]), model.new_cache(2, 64), [0, 1])
    finally:
        model.fused_blocks = None
    assert torch.equal(whole, cut)


def test_no_stack_for_a_head_size_its_attention_cannot_take():
    """The attention runs 8 lanes along the head dimension: other head sizes keep the blocks one by one."""
    config = tiny_config(hidden_size=256, num_layers=1, intermediate_size=512, num_heads=20, num_kv_heads=4)
    model = tiny_model(config)  # head size 256 / 20 = 12
    block = model.layers[0]
    block.attn.wqkv = _linear(256, [("Q4_K", 240), ("Q5_0", 48), ("Q6_K", 48)], 0, bias=True)
    block.attn.wo = _linear(240, [("Q8_0", 256)], 3)
    block.mlp.w_gate_up = _linear(256, [("Q4_K", 1024)], 4)
    block.mlp.w_down = _linear(512, [("Q6_K", 256)], 6)
    assert config.head_size == 12 and native_stack(config, model) is None


# A token tree of 12 nodes: the root (the last accepted token), then branches of depth up to 4 whose nodes are not
# stored side by side with their ancestors (nodes 4, 6, 9, 10 begin new branches).
TREE_PARENTS = [-1, 0, 1, 2, 1, 4, 0, 6, 7, 4, 0, 3]
TREE_TOKENS = [17, 4, 250, 9, 33, 71, 2, 140, 5, 6, 7, 8]


def _row_head(model):
    """The model's output head one row at a time (PyTorch's own product may round a row differently beside
    others; the native heads do not)."""
    weight = model.embed.weight if model.lm_head is None else model.lm_head.weight
    return lambda x: torch.cat([torch.nn.functional.linear(x[:, i : i + 1], weight) for i in range(x.shape[1])], 1)


def _path(node: int) -> list[int]:
    path = [node]
    while TREE_PARENTS[path[0]] >= 0:
        path.insert(0, TREE_PARENTS[path[0]])
    return path


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
def test_a_token_tree_pass_gives_each_node_the_bits_of_a_chain_along_its_path(model, path, kv_dtype):
    """Each node attends to its ancestors only (tree mask), at its depth's position (rotary), stored where its
    siblings are not: its logits are a chain pass's along its root-to-node path, bit for bit. The prompt crosses
    the attention's tiles of 32 positions. The control: the same rows as one chain differ (a mask that let
    siblings see each other would pass for one)."""
    model, stack = model
    model.kv_dtype = kv_dtype
    try:
        cache = _prefilled(model, [list(range(30, 72))])
    finally:
        model.kv_dtype = None
    start = cache.lengths[0]
    model.fused_blocks = stack
    try:
        head = _row_head(model)
        tree = model(torch.tensor([TREE_TOKENS]), cache, [0], parents=[TREE_PARENTS], head=head)[0]
        assert cache.lengths[0] == start + len(TREE_TOKENS)
        cache.set_length(0, start)
        for node in range(len(TREE_TOKENS)):
            chain = model(torch.tensor([[TREE_TOKENS[i] for i in _path(node)]]), cache, [0], head=head)[0, -1]
            cache.set_length(0, start)
            assert torch.equal(tree[node], chain), node
        flat = model(torch.tensor([TREE_TOKENS]), cache, [0], head=head)[0]
        cache.set_length(0, start)
    finally:
        model.fused_blocks = None
    assert torch.equal(flat[:4], tree[:4])  # nodes 0-3 are a chain stored in place
    assert not torch.equal(flat[4], tree[4])


def test_the_kept_path_of_a_tree_continues_as_the_chain_would(model):
    """After a tree's pass, `keep_path` moves one accepted path's keys and values where a chain holds them: the
    next step is the same bits as after a chain pass along that path."""
    model, stack = model
    model.fused_blocks = stack
    try:
        cache = _prefilled(model, [list(range(30, 72))])
        start = cache.lengths[0]
        path = _path(8)  # [0, 6, 7, 8]: stored at start + 0, 6, 7, 8
        model(torch.tensor([TREE_TOKENS]), cache, [0], parents=[TREE_PARENTS])
        cache.keep_path(0, start, path)
        assert cache.lengths[0] == start + len(path)
        after_tree = model(torch.tensor([[99]]), cache, [0], head=_row_head(model))[0, -1]
        cache.set_length(0, start)
        model(torch.tensor([[TREE_TOKENS[i] for i in path]]), cache, [0])
        after_chain = model(torch.tensor([[99]]), cache, [0], head=_row_head(model))[0, -1]
        cache.set_length(0, start)
        model(torch.tensor([TREE_TOKENS]), cache, [0], parents=[TREE_PARENTS])
        cache.set_length(0, start + len(path))  # the control: the path left where the tree stored it
        stale = model(torch.tensor([[99]]), cache, [0], head=_row_head(model))[0, -1]
    finally:
        model.fused_blocks = None
    assert torch.equal(after_tree, after_chain)
    assert not torch.equal(stale, after_chain)


def test_tree_rows_beside_another_sequence_are_the_same_bits(model, path):
    """A pass may hold a tree and other sequences' rows: each row's result depends on that row alone."""
    model, stack = model
    cache = _prefilled(model, [list(range(30, 72)), list(range(200, 209))])
    start = cache.lengths[0]
    cos, sin = model.rope_tables(cache.max_len)
    depths = [len(_path(i)) - 1 for i in range(len(TREE_TOKENS))]

    def run(rows: list[tuple[int, int, int, int]]) -> torch.Tensor:  # (slot, position, token, parent)
        x = model.embed(torch.tensor([t for _, _, t, _ in rows])).float().contiguous()
        stack(x, cache, cos, sin, [s for s, *_ in rows], [p for _, p, _, _ in rows], [q for *_, q in rows])
        return x

    tree = [(0, start + d, t, p) for d, t, p in zip(depths, TREE_TOKENS, TREE_PARENTS, strict=True)]
    alone = run(tree)
    other = [(1, 9, 5, -1), (1, 10, 6, 0)]
    mixed = run(other + [(s, pos, t, p if p < 0 else p + 2) for s, pos, t, p in tree])
    assert torch.equal(mixed[2:], alone)
    assert torch.equal(mixed[:2], run(other))


def test_rows_without_padding_are_the_bits_of_the_padded_pass(model, path):
    """`forward_rows` lays the rows of a verify pass end to end (a chain of 3, one token, a token tree) where
    `forward` pads them to the widest: every row's logits are the same bits, and so is the step after it (the
    keys and values it wrote). Each row depends on its own tokens alone: changing one row's token changes that
    row's logits, and no other's."""
    model, stack = model
    weight = model.embed.weight if model.lm_head is None else model.lm_head.weight

    def head(x: torch.Tensor) -> torch.Tensor:  # a row at a time, as the native heads compute
        flat = x.reshape(-1, x.shape[-1])
        rows = torch.cat([torch.nn.functional.linear(flat[i : i + 1], weight) for i in range(flat.shape[0])])
        return rows.reshape(*x.shape[:-1], -1)

    rows = [[5, 6, 7], [8], list(TREE_TOKENS)]
    trees = [None, None, list(TREE_PARENTS)]
    width = max(map(len, rows))
    cache = _prefilled(model, [list(range(30, 72)), list(range(200, 209)), list(range(100, 133))])
    starts = list(cache.lengths[:3])
    model.fused_blocks = stack
    try:
        padded = model(
            torch.tensor([row + [0] * (width - len(row)) for row in rows]), cache, [0, 1, 2], head=head,
            parents=[[-1] * width if t is None else t + [-1] * (width - len(t)) for t in trees],
        )  # fmt: skip
        for slot, row in enumerate(rows[:2]):
            cache.set_length(slot, starts[slot] + len(row))
        after_padded = model(torch.tensor([[99], [98]]), cache, [0, 1], head=head)
        for slot in range(3):
            cache.set_length(slot, starts[slot])
        ragged = model.forward_rows(rows, cache, [0, 1, 2], parents=trees, head=head)
        assert [cache.lengths[slot] - starts[slot] for slot in range(3)] == [3, 1, len(TREE_TOKENS)]
        after_ragged = model(torch.tensor([[99], [98]]), cache, [0, 1], head=head)
        for slot in range(3):
            cache.set_length(slot, starts[slot])
        changed = model.forward_rows([[5, 6, 7], [9], list(TREE_TOKENS)], cache, [0, 1, 2], parents=trees, head=head)
    finally:
        model.fused_blocks = None
    offsets = [0, 3, 4]
    for n, row in enumerate(rows):
        assert torch.equal(ragged[offsets[n] : offsets[n] + len(row)], padded[n, : len(row)]), n
    assert torch.equal(after_ragged, after_padded)
    assert not torch.equal(changed[3], ragged[3])
    assert torch.equal(changed[:3], ragged[:3]) and torch.equal(changed[4:], ragged[4:])


@pytest.mark.parametrize(
    "parents",
    [[-1, 2, 0], [-1, 0, 0, 5], [0, -1], [-1, *range(16)]],
    ids=["parent-after", "parent-past-the-end", "root-with-a-parent", "17-nodes"],
)
def test_parents_that_make_no_tree_are_refused(model, parents):
    model, stack = model
    model.fused_blocks = stack
    try:
        cache = _prefilled(model, [list(range(30, 40))])
        with pytest.raises(ValueError):
            model(torch.tensor([[5] * len(parents)]), cache, [0], parents=[parents])
        cos, sin = model.rope_tables(cache.max_len)  # the stack itself refuses them too
        x = model.embed(torch.tensor([5] * len(parents))).float().contiguous()
        positions = [10] + [11] * (len(parents) - 1)
        with pytest.raises(ValueError):
            stack(x, cache, cos, sin, [0] * len(parents), positions, parents)
    finally:
        model.fused_blocks = None


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
def test_a_prompt_cut_anywhere_is_prefilled_to_the_same_bits(model, path, kv_dtype):
    """Prefill reuse to the token (engine/prefixes.py) rests on this: whatever passes a prompt is prefilled in,
    each position's keys and values, and the last position's logits, are the same bits."""
    model, stack = model
    model.fused_blocks, model.kv_dtype = stack, kv_dtype
    try:
        prompt = [(37 * i + 11) % 256 for i in range(40)]
        runs = []
        for cuts in ((), (13, 27), (1, 2, 3, 30), (39,)):
            cache = model.new_cache(1, 64)
            edges = [0, *cuts, len(prompt)]
            for begin, end in zip(edges, edges[1:], strict=False):
                logits = model(torch.tensor([prompt[begin:end]]), cache, [0], num_logits=1, invariant=False)
            runs.append((cache, logits))
        cache, logits = runs[0]
        for other, other_logits in runs[1:]:
            assert torch.equal(other_logits, logits)
            for layer in range(2):
                assert torch.equal(other.keys[layer][0, :, :40], cache.keys[layer][0, :, :40])
                assert torch.equal(other.values[layer][0, :, :40], cache.values[layer][0, :, :40])
        assert cache.keys[0].dtype == kv_dtype
    finally:
        model.fused_blocks, model.kv_dtype = None, None


def test_prompts_sharing_a_start_shorter_than_a_chunk_reuse_it_and_decode_as_alone(model):
    """On the native stack prefill is reused to the token: a second request sharing 21 tokens with the first
    (less than a prefill chunk) prefills only the rest, and decodes exactly as in an engine of its own."""
    from verispec.decoding.sampling import SamplingParams
    from verispec.engine.requests import EngineRequest, FinishEvent
    from verispec.engine.scheduler import Scheduler, SchedulerConfig
    from verispec.testing import tiny_loaded

    model, stack = model
    model.fused_blocks = stack
    try:
        target = tiny_loaded(model)
        start = [(37 * i + 11) % 256 for i in range(21)]
        first, second = start + [5, 9, 77, 3], start + [200, 14, 8]
        config = SchedulerConfig(max_num_seqs=1, max_model_len=64, draft_policy="never", prefill_chunk=32)

        def run(scheduler, prompt):
            done = []
            sink = lambda event: done.append(event) if isinstance(event, FinishEvent) else None  # noqa: E731
            scheduler.submit(
                EngineRequest(request_id="r", prompt_ids=prompt, params=SamplingParams(), max_tokens=10, sink=sink)
            )
            scheduler.run_until_idle()
            return done[0].output

        shared = Scheduler(target, None, config)
        run(shared, first)
        after = run(shared, second)
        assert shared.metrics.prefill_reused_tokens._value.get() == len(start)
        alone = run(Scheduler(target, None, config), second)
        assert after.token_ids == alone.token_ids and len(set(alone.token_ids)) > 2
        shared.forget_prompts()  # as a fresh engine: nothing reused
        assert run(shared, second).token_ids == alone.token_ids
        assert shared.metrics.prefill_reused_tokens._value.get() == len(start)
    finally:
        model.fused_blocks = None
