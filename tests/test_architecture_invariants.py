"""The invariants of docs/architecture.md on every architecture (tiny models of architectures.py): on the native stack
each row's result is the same bits whatever shares its pass (1 to 16 rows of a sequence, beside another sequence,
at another thread count), a token tree's node is the bits of a chain pass along its path, and greedy speculative
output is plain greedy output, drafted by a model or by lookups in token trees; on the PyTorch path too for the
drafted case. The prompts cross the sliding windows (8 positions) and the attention's tiles (32)."""

from __future__ import annotations

import pytest
import torch
from test_kernels import path as path  # a fixture: the tests that take it run on every path

from verispec import SpeculativeGenerator, load_model
from verispec.kernels import native
from verispec.models.gguf_native import native_from_dense
from verispec.testing import truncated_copy

from architectures import NAMES, PYTORCH_ONLY

NAMES = [name for name in NAMES if name not in PYTORCH_ONLY]  # on the native stack; the others: test_hybrid.py,
# test_gpt_oss.py

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels not compiled")

PROMPTS = [[(37 * i + 11) % 250 for i in range(41)], [5, 6, 7, 8, 9, 10, 11, 12, 13]]
DRAFTED = [17, 4, 250, 9, 33, 71, 2, 140, 5, 6, 7, 8, 9, 10, 11, 12]
TREE_PARENTS = [-1, 0, 1, 2, 1, 4, 0, 6, 7, 4, 0, 3]  # branches whose nodes are not stored beside their ancestors
TREE_TOKENS = [17, 4, 250, 9, 33, 71, 2, 140, 5, 6, 7, 8]


def _native(folder, layers: int | None = None):
    loaded = load_model(folder, "float32", progress=False)
    model = loaded.model if layers is None else truncated_copy(loaded.model, layers)
    return native_from_dense(model), loaded.tokenizer


def _prefilled(model, prompts: list[list[int]]):
    cache = model.new_cache(len(prompts), 96)
    for slot, prompt in enumerate(prompts):
        model(torch.tensor([prompt]), cache, [slot], num_logits=1)
    return cache


def _run(model, cache, rows: list[tuple[int, int, int]], parents: list[int] | None = None) -> torch.Tensor:
    """rows (slot, position, token) through the stack alone: the hidden states, bit for bit."""
    cos, sin = model.rope_tables(cache.max_len)
    x = model.embed(torch.tensor([t for _, _, t in rows])).float().contiguous()
    model.fused_blocks(x, cache, cos, sin, [s for s, _, _ in rows], [p for _, p, _ in rows], parents)
    return x


# on every path this CPU runs (portable C, AVX2, AVX-512): what the attention's windows and soft-caps change
EVERY_PATH = ["gemma2", "gemma3"]


@pytest.mark.parametrize("name", NAMES)
def test_each_row_is_the_same_bits_whatever_shares_its_pass(name, architecture):
    _check_rows(_native(architecture(name)[0])[0])


@pytest.mark.parametrize("name", EVERY_PATH)
def test_each_row_is_the_same_bits_on_every_path(name, architecture, path):
    _check_rows(_native(architecture(name)[0])[0])


def _check_rows(model) -> None:
    cache = _prefilled(model, PROMPTS)
    start = len(PROMPTS[0])
    alone = [_run(model, cache, [(0, start + i, t)])[0] for i, t in enumerate(DRAFTED)]
    for n in (2, 5, 16):
        together = _run(model, cache, [(0, start + i, t) for i, t in enumerate(DRAFTED[:n])])
        assert all(torch.equal(together[i], alone[i]) for i in range(n)), n
    others = [(1, 9 + i, t) for i, t in enumerate([5, 6, 7, 8])]
    native.set_threads(3)
    try:
        mixed = _run(model, cache, others[:2] + [(0, start + i, t) for i, t in enumerate(DRAFTED)] + others[2:])
    finally:
        native.set_threads(torch.get_num_threads())
    assert all(torch.equal(mixed[2 + i], alone[i]) for i in range(len(DRAFTED)))
    assert torch.equal(mixed[0], _run(model, cache, [others[0]])[0]) and not torch.equal(mixed[0], mixed[2])


def _path(node: int) -> list[int]:
    path = [node]
    while TREE_PARENTS[path[0]] >= 0:
        path.insert(0, TREE_PARENTS[path[0]])
    return path


@pytest.mark.parametrize("name", NAMES)
def test_a_token_tree_node_is_the_bits_of_a_chain_along_its_path(name, architecture):
    _check_tree(_native(architecture(name)[0])[0])


@pytest.mark.parametrize("name", EVERY_PATH)
def test_a_token_tree_node_is_the_bits_of_a_chain_on_every_path(name, architecture, path):
    _check_tree(_native(architecture(name)[0])[0])


def _check_tree(model) -> None:
    assert model.takes_trees
    cache = _prefilled(model, PROMPTS[:1])
    start = len(PROMPTS[0])
    depths = [len(_path(i)) - 1 for i in range(len(TREE_TOKENS))]
    tree = _run(model, cache, [(0, start + d, t) for d, t in zip(depths, TREE_TOKENS, strict=True)], TREE_PARENTS)
    for node in range(len(TREE_TOKENS)):
        chain = _run(model, cache, [(0, start + i, TREE_TOKENS[n]) for i, n in enumerate(_path(node))])
        assert torch.equal(tree[node], chain[-1]), node


def reference_greedy(model, ids: list[int], max_tokens: int, stop_ids) -> list[int]:
    """Plain greedy decoding without a cache: the whole sequence again at every step."""
    seq, out = list(ids), []
    for _ in range(max_tokens):
        token = int(model(torch.tensor([seq]), model.new_cache(max_len=len(seq)), [0])[0, -1].argmax())
        if token in stop_ids:
            break
        seq.append(token)
        out.append(token)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_greedy_speculative_output_is_plain_greedy_output(name, architecture):
    """On the native stack, drafted by the model's first layer (greedy draft steps in one native call) and by
    lookups in token trees; on the PyTorch path, drafted by the first layer; with int8 weights (PyTorch's kernels,
    attention per query in verify passes), drafted by prompt lookup."""
    from verispec.testing import tiny_loaded

    folder = architecture(name)[0]
    target, tokenizer = _native(folder)
    draft, _ = _native(folder, layers=1)
    stops = tokenizer.stop_token_ids
    repetitive = [3, 4, 5, 6, 7] * 6
    runs = [
        (target, SpeculativeGenerator(tiny_loaded(target, tokenizer), tiny_loaded(draft, tokenizer),
                                      num_speculative_tokens=4, adaptive=False)),
        (target, SpeculativeGenerator(tiny_loaded(target, tokenizer), None, num_speculative_tokens=4,
                                      speculative_method="suffix", token_trees=True, adaptive=False)),
    ]  # fmt: skip
    plain = load_model(folder, "float32", progress=False).model
    runs.append((plain, SpeculativeGenerator(tiny_loaded(plain, tokenizer), tiny_loaded(truncated_copy(plain, 1),
                tokenizer), num_speculative_tokens=3, adaptive=False)))  # fmt: skip
    quantized = load_model(folder, "float32", progress=False, quantization="int8").model  # per-query attention
    assert quantized.layers[0].attn.batch_invariant
    runs.append((quantized, SpeculativeGenerator(tiny_loaded(quantized, tokenizer), None, num_speculative_tokens=3,
                                                 speculative_method="ngram", adaptive=False)))  # fmt: skip
    for model, generator in runs:
        drafted = 0
        for ids in (PROMPTS[1], repetitive):
            out = generator.generate(ids, max_tokens=20, ignore_eos=True)
            assert out.token_ids == reference_greedy(model, ids, 20, set()), ids
            drafted += out.stats.drafted
        assert drafted > 0
    assert stops
