"""The native model's cache semantics: rollback by length, batched slots, incremental == full."""

import torch

from verispec.testing import tiny_config, tiny_model


def _full(model, ids):
    return model(torch.tensor([ids]), model.new_cache(max_len=64), [0])[0]


def test_incremental_decoding_matches_a_full_forward():
    model = tiny_model(tiny_config(), seed=1)
    ids = [5, 17, 99, 3, 42, 7, 250, 1]
    cache = model.new_cache(max_len=64)
    pieces = [model(torch.tensor([ids[:3]]), cache, [0])[0]]
    pieces += [model(torch.tensor([[t]]), cache, [0])[0] for t in ids[3:5]]
    pieces.append(model(torch.tensor([ids[5:]]), cache, [0])[0])
    torch.testing.assert_close(torch.cat(pieces), _full(model, ids), atol=1e-5, rtol=1e-5)


def test_rolling_back_is_setting_a_length():
    model = tiny_model(tiny_config(), seed=1)
    cache = model.new_cache(max_len=64)
    model(torch.tensor([[5, 17, 99]]), cache, [0])
    model(torch.tensor([[1, 2, 3, 4]]), cache, [0])  # rejected tokens
    cache.set_length(0, 3)
    after = model(torch.tensor([[8, 9]]), cache, [0])[0]
    torch.testing.assert_close(after, _full(model, [5, 17, 99, 8, 9])[3:], atol=1e-5, rtol=1e-5)


def test_batched_slots_at_different_lengths_match_single_runs():
    model = tiny_model(tiny_config(), seed=2)
    cache = model.new_cache(num_slots=3, max_len=64)
    model(torch.tensor([[1, 2, 3, 4, 5]]), cache, [2])
    model(torch.tensor([[9, 8]]), cache, [0])
    batched = model(torch.tensor([[10, 11], [12, 13]]), cache, [2, 0])
    torch.testing.assert_close(batched[0], _full(model, [1, 2, 3, 4, 5, 10, 11])[5:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched[1], _full(model, [9, 8, 12, 13])[2:], atol=1e-5, rtol=1e-5)
    assert cache.lengths == [4, 0, 7]


def test_num_logits_returns_only_the_last_positions():
    model = tiny_model(tiny_config(), seed=3)
    last = model(torch.tensor([[4, 5, 6, 7]]), model.new_cache(max_len=16), [0], num_logits=2)[0]
    torch.testing.assert_close(last, _full(model, [4, 5, 6, 7])[2:])
