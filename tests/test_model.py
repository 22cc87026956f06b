"""The native model's cache semantics: rollback by length, batched slots, incremental == full."""

import pytest
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


def test_a_token_tree_with_ordinary_attention_gives_each_node_its_paths_logits():
    """The PyTorch path's tree (positions from the parents, a mask of ancestors): each node's logits are a chain's
    along its path (to rounding: ordinary attention is not batch-invariant), beside a second sequence padded
    after its tree; the control: the same rows as one chain differ. The native stack's tree is tested bit for
    bit in test_stack.py."""
    model = tiny_model(tiny_config(), seed=3, scale=2.0)
    parents = [-1, 0, 1, 0, 3, 1, -1]  # two branches after the root, then a padded row
    tokens = [17, 4, 250, 9, 33, 71, 0]
    cache = model.new_cache(2, 64)
    model(torch.tensor([list(range(40, 60))]), cache, [0])
    model(torch.tensor([list(range(80, 90))]), cache, [1])
    other = [5, 6, 7, 8, 9, 10, 11]
    tree = model(torch.tensor([tokens, other]), cache, [0, 1], parents=[parents, [-1] * 7])
    assert cache.lengths == [27, 17]
    cache.set_length(0, 20)
    cache.set_length(1, 10)
    chain_other = model(torch.tensor([other]), cache, [1])[0]
    assert torch.allclose(tree[1], chain_other, atol=1e-4)
    paths = {1: [0, 1], 2: [0, 1, 2], 3: [0, 3], 4: [0, 3, 4], 5: [0, 1, 5]}
    for node, path in paths.items():
        chain = model(torch.tensor([[tokens[i] for i in path]]), cache, [0])[0, -1]
        cache.set_length(0, 20)
        assert torch.allclose(tree[0, node], chain, atol=1e-4), node
    flat = model(torch.tensor([tokens[:5]]), cache, [0])[0]
    assert not torch.allclose(flat[3], tree[0, 3], atol=1e-2)


def test_keep_path_moves_a_path_where_a_chain_holds_it():
    model = tiny_model(tiny_config(), seed=3, scale=2.0)
    parents, tokens = [-1, 0, 1, 0, 3], [17, 4, 250, 9, 33]
    cache = model.new_cache(1, 64)
    model(torch.tensor([list(range(40, 60))]), cache, [0])
    model(torch.tensor([tokens]), cache, [0], parents=[parents])
    cache.keep_path(0, 20, [0, 3, 4])
    after_tree = model(torch.tensor([[99]]), cache, [0])[0, -1]
    cache.set_length(0, 20)
    model(torch.tensor([[17, 9, 33]]), cache, [0])
    assert torch.allclose(after_tree, model(torch.tensor([[99]]), cache, [0])[0, -1], atol=1e-5)
    for bad in ([1, 2], [0, 2, 1], [0, 9]):
        with pytest.raises(ValueError):
            cache.keep_path(0, 20, bad)
