"""The restricted draft head: the same logits for the ids it keeps, and output still equal to plain decoding."""

import pytest
import torch
from test_generator_tiny import PROMPTS, reference_greedy

from verispec import SpeculativeGenerator
from verispec.models.draft_head import DraftHead, frequent_ids, restricted_head
from verispec.models.quantize import quantize_model
from verispec.testing import tiny_pair


@pytest.mark.parametrize("mode", ["none", "int4-all", "int8"])
def test_restricted_head_gives_the_full_heads_logits_for_its_ids(mode):
    _, draft = tiny_pair()
    model = draft.model if mode == "none" else quantize_model(draft.model, mode)
    ids = torch.tensor([0, 5, 17, 18, 100, 255, 3])  # any order, not a multiple of 16
    tokens = torch.tensor([[1, 2, 3, 4]])
    full = model(tokens, model.new_cache(max_len=8), [0])
    small = model(tokens, model.new_cache(max_len=8), [0], head=restricted_head(model, ids))
    assert small.shape[-1] == len(ids)
    # Quantized kernels compute each row on its own: bit-exact. A dense float32 GEMM may pick another kernel
    # for 7 rows than for 256 (it does with AVX2), so only rounding may differ there.
    exact = mode != "none"
    torch.testing.assert_close(small, full[..., ids], rtol=0 if exact else 1e-5, atol=0 if exact else 1e-5)


def test_draft_head_spreads_its_logits_over_the_target_vocabulary():
    _, draft = tiny_pair()
    rows = draft.model.config.vocab_size
    logits = torch.randn(2, 3, rows)
    full = DraftHead(draft.model, rows + 5).over_vocab(logits)  # a target with 5 more (padding) rows
    torch.testing.assert_close(full[..., :rows], logits, rtol=0, atol=0)
    assert torch.isneginf(full[..., rows:]).all()
    ids = torch.tensor([7, 0, 3, rows + 2])  # an id past the target's vocabulary is dropped
    head = DraftHead(draft.model, rows - 1 if rows - 1 > 7 else rows, ids)
    small = torch.randn(2, 3)
    spread = head.over_vocab(small)
    assert spread.shape == (2, head.size)
    torch.testing.assert_close(spread[:, [0, 3, 7]], small, rtol=0, atol=0)  # the head's rows: ascending ids
    assert torch.isneginf(spread).sum() == 2 * (head.size - 3)
    run = DraftHead(draft.model, rows, torch.tensor([0, 1, 2, 5]))  # a leading run 0, 1, 2 and an extra id
    spread = run.over_vocab(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    assert spread[0, [0, 1, 2, 5]].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert torch.isneginf(spread).sum() == rows - 4


def test_the_heads_argmax_is_the_argmax_over_the_vocabulary_lowest_id_on_ties():
    _, draft = tiny_pair()
    rows = draft.model.config.vocab_size
    for ids in (None, torch.tensor([5, 0, 1, 2, rows - 1]), torch.tensor([9, 4])):
        head = DraftHead(draft.model, rows, ids)
        width = rows if ids is None else len(head.ids)
        for seed in range(20):
            logits = torch.randint(0, 3, (width,), generator=torch.Generator().manual_seed(seed)).float()  # ties
            assert head.argmax(logits) == int(head.over_vocab(logits).argmax()), (ids, seed)


def test_frequent_ids_keep_the_first_ids_and_the_stop_tokens():
    ids = frequent_ids(4, 300, frozenset({2, 290, 400}))
    assert ids.tolist() == [0, 1, 2, 3, 290]


@pytest.mark.parametrize("method", ["draft", "hybrid"])
def test_greedy_output_with_a_restricted_draft_head_equals_plain_greedy(method):
    target, draft = tiny_pair()
    generator = SpeculativeGenerator(
        target, draft, num_speculative_tokens=4, speculative_method=method, adaptive=False, draft_vocab=100
    )
    emitted = set()
    for prompt in PROMPTS:
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=40)
        assert out.token_ids == reference_greedy(target.model, ids, 40, target.tokenizer.stop_token_ids)
        assert out.stats.accepted > 0
        emitted |= set(out.token_ids)
    assert any(t >= 100 for t in emitted)  # the target produced tokens the draft could not propose
