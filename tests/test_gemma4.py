"""Gemma 4 (gemma4_text) and its assistant (gemma4_assistant) on tiny random checkpoints made by transformers
(architectures.py: "gemma4", make_assistant). The target's logits are transformers' (test_architectures.py); here,
what each of its parts changes (the controls), the assistant's drafts against transformers' own assistant fed the
target's keys, values and hidden state, and the output of speculative decoding on it: greedy output is plain greedy
output with every method (the assistant among them), seeded sampled text is plain sampling's."""

from __future__ import annotations

import pytest
import torch
from test_architecture_invariants import reference_greedy
from test_architectures import assert_close

from verispec import SpeculativeGenerator, load_model

from architectures import make_assistant, save, tokens

PROMPTS = [[(37 * i + 11) % 250 for i in range(41)], [3, 4, 5, 6, 7] * 6]


@pytest.fixture(scope="module")
def gemma4(architecture):
    folder, expected = architecture("gemma4")
    return load_model(folder, "float32", progress=False), expected, folder


@pytest.fixture(scope="module")
def assistant(tmp_path_factory):
    """(transformers' assistant, its folder) with ordered embeddings."""
    model = make_assistant()
    return model, save(model, tmp_path_factory.mktemp("assistant"))


def _logits(model) -> torch.Tensor:
    ids = tokens()
    return model(ids, model.new_cache(max_len=ids.shape[1]), [0])[0]


def test_its_parts_each_move_the_logits(gemma4):
    """Without its layer scalars, its values' norm, or its per-layer inputs the logits leave the tolerance."""
    loaded, expected, _ = gemma4
    model = loaded.model
    assert_close(_logits(model), expected)
    for part in ("scalar", "v_norm", "per_layer"):
        saved = [(layer, layer.scalar, layer.attn.v_norm, layer.per_layer) for layer in model.layers]
        try:
            for layer in model.layers:
                if part == "v_norm":
                    layer.attn.v_norm = False
                else:
                    setattr(layer, part, None)
            assert float((_logits(model) - expected).abs().max()) > 1e-2, part
        finally:
            for layer, scalar, v_norm, per_layer in saved:
                layer.scalar, layer.attn.v_norm, layer.per_layer = scalar, v_norm, per_layer
    assert_close(_logits(model), expected)


@torch.inference_mode()
def _transformers_drafts(target, helper, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """transformers' assistant chained `steps` times after the target read ids[:-1]: its logits per step."""
    out = target(input_ids=ids[:, :-1], output_hidden_states=True, return_shared_kv_states=True)
    kv, hidden = out.shared_kv_states, out.hidden_states[-1][:, -1:]
    token, position = ids[:, -1:], torch.tensor([[ids.shape[1] - 1]])
    logits = []
    for _ in range(steps):
        embedded = torch.cat([target.model.embed_tokens(token), hidden], dim=-1)
        step = helper(inputs_embeds=embedded, position_ids=position, shared_kv_states=kv)
        logits.append(step.logits[0, -1].float())
        token, hidden = step.logits.argmax(-1), step.last_hidden_state
    return logits


def _read_but_the_last(model, ids: torch.Tensor):
    """The target's cache after ids[:-1], the last token, and the target's final hidden state before it: what an
    assistant's first draft reads."""
    kept = {}
    model.serve_hidden(lambda slots, starts, hidden: kept.update(last=hidden[0, -1]))
    try:
        cache = model.new_cache(max_len=64)
        model(ids[:, :-1], cache, [0])
    finally:
        model.serve_hidden(None)
    return cache, [int(ids[0, -1])], kept["last"][None]


@pytest.mark.parametrize("length", [6, 30])  # inside the sliding window (8), and past it
def test_the_assistant_drafts_what_transformers_assistant_drafts(gemma4, assistant, length):
    from architectures import make_model

    loaded, _, folder = gemma4
    helper, helper_folder = assistant
    drafter = load_model(helper_folder, "float32", progress=False).model
    drafter.bind(loaded.model)
    ids = tokens(seed=3, length=length)
    expected = _transformers_drafts(make_model("gemma4"), helper, ids, steps=3)
    model = loaded.model
    cache, token, hidden = _read_but_the_last(model, ids)
    for want in expected:
        logits, hidden = drafter.step(model, token, hidden, cache=cache, slots=[0])
        assert_close(logits[0], want)
        token = [int(want.argmax())]


@pytest.fixture(scope="module")
def drafters(architecture):
    """A draft model of the same tokenizer: the tiny llama."""
    return load_model(architecture("llama")[0], "float32", progress=False)


@pytest.mark.parametrize("method", ["assistant", "draft", "suffix", "ngram"])
def test_greedy_speculative_output_is_plain_greedy_output(method, gemma4, assistant, drafters):
    loaded, _, _ = gemma4
    draft = {"assistant": str(assistant[1]), "draft": drafters}.get(method)
    generator = SpeculativeGenerator(loaded, draft, num_speculative_tokens=3, speculative_method=method,
                                     adaptive=False, progress=False)  # fmt: skip
    drafted = accepted = 0
    for ids in PROMPTS:
        out = generator.generate(ids, max_tokens=20, ignore_eos=True)
        assert out.token_ids == reference_greedy(loaded.model, ids, 20, set()), ids
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert drafted > 0


def test_seeded_sampled_text_is_plain_decodings_with_the_assistant(gemma4, assistant):
    loaded, _, _ = gemma4
    plain = SpeculativeGenerator(loaded, None, progress=False)
    spec = SpeculativeGenerator(loaded, str(assistant[1]), num_speculative_tokens=3, speculative_method="assistant",
                                adaptive=False, progress=False)  # fmt: skip
    for seed in range(4):
        expected = plain.generate(PROMPTS[0], max_tokens=20, ignore_eos=True, temperature=1.0, seed=seed).token_ids
        got = spec.generate(PROMPTS[0], max_tokens=20, ignore_eos=True, temperature=1.0, seed=seed)
        assert got.token_ids == expected and got.stats.drafted > 0


def test_an_assistant_drafts_by_its_method_only_and_for_a_target_it_fits(gemma4, assistant, drafters, architecture):
    """One line each: an assistant given to another method, the assistant method without an assistant, an assistant
    for a target of other shapes."""
    from verispec.errors import InvalidParameterError

    loaded, _, _ = gemma4
    given_to_another_method = "drafts by reading its target: draft with it by --speculative-method assistant"
    with pytest.raises(InvalidParameterError, match=given_to_another_method):
        SpeculativeGenerator(loaded, str(assistant[1]), speculative_method="draft", progress=False)
    with pytest.raises(InvalidParameterError, match="needs a Gemma 4 assistant checkpoint"):
        SpeculativeGenerator(loaded, drafters, speculative_method="assistant", progress=False)
    other = load_model(architecture("gemma3")[0], "float32", progress=False)
    with pytest.raises(InvalidParameterError, match="does not fit this target"):
        SpeculativeGenerator(other, str(assistant[1]), speculative_method="assistant", progress=False)


def test_the_mixture_beside_the_mlp_counts_and_speculation_on_it_is_plain_decoding(architecture, drafters):
    """Gemma 4's 26B-A4B form ("gemma4-moe": its logits are transformers', test_architectures.py): without the experts'
    own scales, or without the mixture, the logits leave the tolerance; greedy output with a draft model and with
    lookups is plain greedy output."""
    folder, expected = architecture("gemma4-moe")
    loaded = load_model(folder, "float32", progress=False)
    model = loaded.model
    assert_close(_logits(model), expected)
    saved = [(layer.beside, layer.beside.expert_scale.data.clone()) for layer in model.layers]
    try:
        for layer in model.layers:
            layer.beside.expert_scale.data.fill_(1.0)
        assert float((_logits(model) - expected).abs().max()) > 1e-2
        for layer in model.layers:
            layer.beside = None
        assert float((_logits(model) - expected).abs().max()) > 1e-2
    finally:
        for layer, (beside, scale) in zip(model.layers, saved, strict=True):
            layer.beside = beside
            beside.expert_scale.data.copy_(scale)
    for method, draft in (("draft", drafters), ("ngram", None)):
        generator = SpeculativeGenerator(loaded, draft, num_speculative_tokens=3, speculative_method=method,
                                         adaptive=False, progress=False)  # fmt: skip
        for ids in PROMPTS:
            out = generator.generate(ids, max_tokens=16, ignore_eos=True)
            assert out.token_ids == reference_greedy(model, ids, 16, set()), (method, ids)


def test_a_gguf_file_on_the_native_kernels_decodes_as_plain_greedy(tmp_path, monkeypatch):
    """llama.cpp's conversion of the tiny spec (its logits: test_architectures.py) with its matrices on the native
    kernels and its blocks on PyTorch: greedy speculative output with lookups is plain greedy output."""
    from pathlib import Path

    from verispec.kernels import native

    if not native.available():
        pytest.skip("native kernels not compiled")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    path = Path(__file__).parent / "fixtures" / "architectures" / "gemma4.gguf"
    loaded = load_model(path, "float32", progress=False, quantization="gguf")
    assert type(loaded.model.lm_head).__name__ == "NativeLinear"
    for method in ("suffix", "ngram"):
        generator = SpeculativeGenerator(loaded, None, num_speculative_tokens=3, speculative_method=method,
                                         adaptive=False, progress=False)  # fmt: skip
        for ids in PROMPTS:
            out = generator.generate(ids, max_tokens=16, ignore_eos=True)
            assert out.token_ids == reference_greedy(loaded.model, ids, 16, set()), (method, ids)


def test_the_assistant_on_the_native_kernels_drafts_what_it_drafts_on_pytorch(gemma4, assistant):
    """Beside a target on the native kernels the drafter puts the assistant's matrices there (float16) and its chosen
    clusters' products too: its logits within float16's rounding of its PyTorch ones, the same argmax."""
    from verispec.kernels import native
    from verispec.models.gguf_native import linears_on_the_kernels

    if not native.available():
        pytest.skip("native kernels not compiled")
    loaded, _, _ = gemma4
    drafter = load_model(assistant[1], "float32", progress=False).model
    drafter.bind(loaded.model)
    model = loaded.model
    cache, token, hidden = _read_but_the_last(model, tokens(seed=4, length=20))
    expected = drafter.step(model, token, hidden, cache=cache, slots=[0])[0]
    linears_on_the_kernels(drafter)
    drafter.native_head()
    got = drafter.step(model, token, hidden, cache=cache, slots=[0])[0]
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert float((got - expected).abs().max()) <= 1e-2 * float(expected.abs().max())


def test_int4_and_int8_keep_matrices_too_narrow_for_pytorchs_products_dense(gemma4):
    """The CPU default for a Hugging Face folder quantizes its linears; PyTorch's int8 product reads past rows that
    are not 16 wide (NaN, or a crash): the per-layer inputs' 8-wide matrices stay dense, and the logits are finite and
    near the float ones."""
    _, expected, folder = gemma4
    for mode in ("int4", "int8"):
        model = load_model(folder, "float32", progress=False, quantization=mode).model
        assert type(model.layers[0].per_layer.up).__name__ == "Linear"  # 8 wide: dense
        assert type(model.layers[0].per_layer.gate).__name__ == "QuantizedLinear"
        got = _logits(model).float()
        assert torch.isfinite(got).all()
        assert float((got - expected).abs().max()) < 0.1 * float(expected.abs().max())
