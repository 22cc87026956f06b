"""Greedy draft steps in one native call (kernels/greedy.py, csrc/vsk_greedy.c): the tokens that the same steps
driven from Python choose, for each sequence of a call, and the drafter's proposals unchanged by taking them."""

from __future__ import annotations

import pytest
import torch
from test_kernels import TYPES, random_blocks
from test_kernels import path as path  # a fixture: each test runs on every path
from test_stack import _linear

from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams
from verispec.engine.draft_model import BatchedDrafter
from verispec.engine.drafting import DraftJob
from verispec.kernels import native
from verispec.kernels.greedy import GreedySteps
from verispec.kernels.linear import GGUFEmbedding, NativeLinear, NativeRMSNorm
from verispec.models.gguf_native import native_stack
from verispec.testing import tiny_config, tiny_model

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels not compiled")

VOCAB, HIDDEN = 300, 256


@pytest.fixture(scope="module", params=["Q8_0", "Q3_K"])
def model(request):
    """A 2-block model native end to end: Q8_0 or Q3_K embeddings, the stack (the second block of the types of
    Q5_K_M, Q3_K_M, Q2_K and IQ4 files), the native final norm, a Q4_0 head."""
    config = tiny_config(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=2, intermediate_size=512)
    model = tiny_model(config, seed=0)
    types = [("Q4_K", "Q5_0", "Q8_0", "Q8_0", "Q4_K", "Q6_K"), ("Q5_K", "Q3_K", "IQ4_NL", "Q2_K", "IQ4_XS", "Q5_K")]
    for i, block in enumerate(model.layers):
        q, k, v, o, gate_up, down = types[i]
        block.attn.wqkv = _linear(HIDDEN, [(q, 256), (k, 128), (v, 128)], 10 * i, bias=True)
        block.attn.wo = _linear(HIDDEN, [(o, 256)], 10 * i + 3)
        block.mlp.w_gate_up = _linear(HIDDEN, [(gate_up, 1024)], 10 * i + 4)
        block.mlp.w_down = _linear(512, [(down, 256)], 10 * i + 6)
        block.attn.batch_invariant = True
        block.attn.attend_per_query = native.attention
    embed, q4_0 = int(TYPES[request.param]), int(TYPES["Q4_0"])
    model.embed = GGUFEmbedding(embed, torch.from_numpy(random_blocks(embed, VOCAB, HIDDEN, seed=1, scale=0.5)), HIDDEN)
    head = torch.from_numpy(random_blocks(q4_0, VOCAB, HIDDEN, seed=2, scale=0.5))
    model.lm_head = NativeLinear(HIDDEN, [(q4_0, head)])
    model.norm = NativeRMSNorm(model.norm.weight.data, config.rms_norm_eps)
    model.fused_blocks = native_stack(config, model)
    return model


IDS = torch.cat([torch.arange(0, 200, 2), torch.tensor([299])])  # a restricted head's tokens, not its row indices


def _prefilled(model, prompts: list[list[int]]):
    cache = model.new_cache(len(prompts), 64)
    for slot, prompt in enumerate(prompts):
        model(torch.tensor([prompt]), cache, [slot], num_logits=1, invariant=False)
    return cache


def _step_by_step(model, head, cache, slot: int, feed: list[int], steps: int) -> list[int]:
    """Greedy steps as Python drives them: a forward with the head, its argmax, that token fed next."""
    chosen = []
    for _ in range(steps):
        logits = model(torch.tensor([feed]), cache, [slot], num_logits=1, invariant=False, head=head)[0, -1]
        chosen.append(int(IDS[int(logits.argmax())]))
        feed = chosen[-1:]
    return chosen


def test_one_call_chooses_what_steps_driven_from_python_choose(model, path):
    head = model.lm_head.select_rows(IDS)
    greedy = GreedySteps(model, head, IDS, len(IDS))
    prompts = [list(range(30, 42)), list(range(200, 209)), list(range(5, 25))]
    feeds = [[17], [4, 250, 9], [33, 71]]  # catch-ups of different lengths share the first pass
    cache = _prefilled(model, prompts)
    expected = [_step_by_step(model, head, cache, slot, feed, 5) for slot, feed in enumerate(feeds)]
    assert len({token for tokens in expected for token in tokens}) > 3  # the steps do not just repeat a token
    for slot, prompt in enumerate(prompts):
        cache.set_length(slot, len(prompt))
    assert greedy(cache, [0, 1, 2], feeds, 5) == expected
    assert cache.lengths[:3] == [len(p) + len(f) + 4 for p, f in zip(prompts, feeds, strict=True)]
    for slot, prompt in enumerate(prompts):  # each sequence alone: the same tokens (its rows are its own)
        cache.set_length(slot, len(prompt))
        assert greedy(cache, [slot], [feeds[slot]], 5) == [expected[slot]]


def test_bad_tokens_and_overlong_sequences_are_refused_before_anything_runs(model):
    greedy = GreedySteps(model, model.lm_head, None, VOCAB)
    cache = _prefilled(model, [list(range(10))])
    with pytest.raises(IndexError):
        greedy(cache, [0], [[VOCAB]], 2)
    with pytest.raises(ValueError):
        greedy(cache, [0], [[1]], 64 - 10 + 1)
    assert cache.lengths[0] == 10
    assert len(greedy(cache, [0], [[1]], 64 - 10)[0]) == 54  # the cache's last position is usable


def test_the_drafter_proposes_the_same_drafts_in_one_call(model):
    """Two drafters on one model, one taking its greedy drafts in one native call: the same proposals over
    rounds of acceptances and rejections (its record of what each slot holds stays right)."""
    fast = BatchedDrafter(model, VOCAB, num_slots=2, max_len=128, head_ids=IDS)
    slow = BatchedDrafter(model, VOCAB, num_slots=2, max_len=128, head_ids=IDS)
    assert fast.greedy_steps is not None
    slow.greedy_steps = None
    greedy = SamplingParams(temperature=0.0)
    histories = [list(range(40, 52)), list(range(90, 97))]
    for round_ in range(10):
        ks = [3, 1 + round_ % 4]
        jobs = [
            DraftJob(slot=slot, tokens=histories[slot], k=ks[slot], params=greedy, noise=KeyedNoise(0, VOCAB))
            for slot in range(2)
        ]
        got, want = fast.propose(jobs), slow.propose(jobs)
        for a, b, k in zip(got, want, ks, strict=True):
            assert a.tokens.tolist() == b.tokens.tolist() and len(a.tokens) == k
        for i, proposal in enumerate(got):  # accept a prefix, then a token of the "target's" own
            kept = proposal.tokens.tolist()[: round_ % 5]  # none, some, or all of the draft
            histories[i] = histories[i] + kept + [(7 * round_ + i) % VOCAB]


def test_inactive_adjustments_take_the_one_call_and_active_ones_do_not(model):
    """The engine gives every sequence a LogitAdjustments; only one that changes logits (logit_bias, penalties)
    needs the draft's logits in Python."""
    from verispec.decoding.adjustments import LogitAdjustments

    drafter = BatchedDrafter(model, VOCAB, num_slots=1, max_len=128, head_ids=None)
    calls = []
    one_call = drafter.greedy_steps
    drafter.greedy_steps = lambda *args: calls.append(args) or one_call(*args)
    history = list(range(40, 52))
    for bias, one_call_used in ((None, True), ({123: 100.0}, False)):
        params = SamplingParams(temperature=0.0, logit_bias=bias or {})
        job = DraftJob(
            slot=0,
            tokens=history,
            k=3,
            params=params,
            noise=KeyedNoise(0, VOCAB),
            adjustments=LogitAdjustments(params, VOCAB),
        )
        calls.clear()
        tokens = drafter.propose([job])[0].tokens.tolist()
        assert bool(calls) == one_call_used
        assert (123 in tokens) == (bias is not None)  # the bias reached the draft


def test_a_short_draft_at_the_end_of_its_cache_beside_a_long_one(model):
    """One call feeds every sequence as far as the longest draft; a sequence with no room for that (the end of
    its context) must not overflow its cache: the propose falls back to steps driven from Python."""
    fast = BatchedDrafter(model, VOCAB, num_slots=2, max_len=32, head_ids=None)
    slow = BatchedDrafter(model, VOCAB, num_slots=2, max_len=32, head_ids=None)
    slow.greedy_steps = None
    greedy = SamplingParams(temperature=0.0)
    histories = [list(range(40, 71)), list(range(90, 97))]  # the first: 31 of 32 positions, room for one draft
    jobs = [
        DraftJob(slot=0, tokens=histories[0], k=1, params=greedy, noise=KeyedNoise(0, VOCAB)),
        DraftJob(slot=1, tokens=histories[1], k=3, params=greedy, noise=KeyedNoise(0, VOCAB)),
    ]
    got, want = fast.propose(jobs), slow.propose(jobs)
    assert [p.tokens.tolist() for p in got] == [p.tokens.tolist() for p in want]
    assert [len(p.tokens) for p in got] == [1, 3]
