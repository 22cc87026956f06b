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
    """A 2-block model whose products are GGUF blocks of several types (tiled and not, dense too: all three
    activation formats, mixed within one product), with q/k/v bias."""
    config = tiny_config(hidden_size=256, num_layers=2, intermediate_size=512)  # 4 heads of 64, 2 kv heads
    model = tiny_model(config, seed=0)
    for i, block in enumerate(model.layers):
        v = ("Q6_K", "F16")[i]
        block.attn.wqkv = _linear(256, [("Q4_K", 256), ("Q5_0", 128), (v, 128)], 10 * i, bias=True)
        block.attn.wo = _linear(256, [(("Q8_0", "BF16")[i], 256)], 10 * i + 3)
        block.mlp.w_gate_up = _linear(256, [("Q4_K", 512), ("Q5_0", 512)], 10 * i + 4)
        block.mlp.w_down = _linear(512, [(("Q6_K", "F32")[i], 256)], 10 * i + 6)
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
    for layer in range(2):  # and the keys and values it wrote
        assert torch.allclose(caches[1].keys[layer][0, :, :26], caches[0].keys[layer][0, :, :26], atol=1e-4)
        assert torch.allclose(caches[1].values[layer][0, :, :26], caches[0].values[layer][0, :, :26], atol=1e-4)


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
