"""gpt-oss (model_type gpt_oss) on a tiny random checkpoint made by transformers (architectures.py, "gpt-oss": sinks,
biases, four experts with the clamped SwiGLU, a sliding layer then a global one, yarn): its logits are transformers'
(test_architectures.py); here, what each of its parts changes (a model read without its sinks, or without the
clamp, is far outside the tolerance: the controls), and the output of speculative decoding on it: greedy output is
plain greedy output with a draft model and with lookups, seeded sampled text is plain sampling's."""

from __future__ import annotations

import pytest
import torch
from test_architecture_invariants import reference_greedy
from test_architectures import assert_close

from verispec import SpeculativeGenerator, load_model
from verispec.testing import tiny_loaded, truncated_copy

from architectures import tokens

PROMPTS = [[(37 * i + 11) % 250 for i in range(41)], [3, 4, 5, 6, 7] * 6]


@pytest.fixture(scope="module")
def gpt_oss(architecture):
    folder, expected = architecture("gpt-oss")
    return load_model(folder, "float32", progress=False), expected


def _logits(model) -> torch.Tensor:
    ids = tokens()
    return model(ids, model.new_cache(max_len=ids.shape[1]), [0])[0]


def test_its_parts_each_move_the_logits(gpt_oss):
    """Sinks off, or the clamp lifted, and the logits leave the tolerance (the tests would catch either missing)."""
    loaded, expected = gpt_oss
    model = loaded.model
    assert_close(_logits(model), expected)
    assert model.config.attn_sinks and model.config.activation == "swiglu_oai" and model.config.router_softmax_topk
    sinks = [layer.attn.sinks.data.clone() for layer in model.layers]
    experts = [expert for layer in model.layers for expert in layer.mlp.experts]
    try:
        for layer in model.layers:
            layer.attn.sinks.data.fill_(-1e9)  # a sink no query attends to: plain attention
        assert float((_logits(model) - expected).abs().max()) > 1e-2
        for layer, saved in zip(model.layers, sinks, strict=True):
            layer.attn.sinks.data.copy_(saved)
        for expert in experts:
            expert.limit = 1e9
        assert float((_logits(model) - expected).abs().max()) > 1e-2
    finally:
        for layer, saved in zip(model.layers, sinks, strict=True):
            layer.attn.sinks.data.copy_(saved)
        for expert in experts:
            expert.limit = model.config.swiglu_limit
    assert_close(_logits(model), expected)


@pytest.mark.parametrize("method", ["draft", "suffix", "ngram"])
def test_greedy_speculative_output_is_plain_greedy_output(method, gpt_oss):
    loaded, _ = gpt_oss
    model = loaded.model
    draft = tiny_loaded(truncated_copy(model, 1), loaded.tokenizer) if method == "draft" else None
    generator = SpeculativeGenerator(loaded, draft, num_speculative_tokens=3, speculative_method=method,
                                     adaptive=False, progress=False)  # fmt: skip
    drafted = 0
    for ids in PROMPTS:
        out = generator.generate(ids, max_tokens=20, ignore_eos=True)
        assert out.token_ids == reference_greedy(model, ids, 20, set()), ids
        drafted += out.stats.drafted
    assert drafted > 0


def test_seeded_sampled_text_is_plain_decodings(gpt_oss):
    loaded, _ = gpt_oss
    draft = tiny_loaded(truncated_copy(loaded.model, 1), loaded.tokenizer)
    plain = SpeculativeGenerator(loaded, None, progress=False)
    spec = SpeculativeGenerator(loaded, draft, num_speculative_tokens=3, speculative_method="draft", adaptive=False,
                                progress=False)  # fmt: skip
    for seed in range(4):
        expected = plain.generate(PROMPTS[0], max_tokens=20, ignore_eos=True, temperature=1.0, seed=seed).token_ids
        got = spec.generate(PROMPTS[0], max_tokens=20, ignore_eos=True, temperature=1.0, seed=seed)
        assert got.token_ids == expected and got.stats.drafted > 0


def test_a_harmony_vocabulary_ends_generation_at_return_and_call_not_at_end():
    """gpt-oss writes its reasoning, ends it with <|end|> and goes on to its answer: <|end|> stops nothing there, while
    <|return|> and <|call|> do; a vocabulary without the harmony tokens keeps <|end|> (Phi-3's end of turn)."""
    from tokenizers import Tokenizer as Raw
    from tokenizers import models

    from verispec.models.tokenizer import Tokenizer

    def stops(*specials: str) -> set[str]:
        raw = Raw(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
        raw.add_special_tokens(list(specials))
        tokenizer = Tokenizer(raw, eos_token="<|endoftext|>")
        return {raw.id_to_token(i) for i in tokenizer.stop_token_ids}

    harmony = ("<|endoftext|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")
    assert stops(*harmony) == {"<|endoftext|>", "<|return|>", "<|call|>"}
    assert stops("<|endoftext|>", "<|end|>") == {"<|endoftext|>", "<|end|>"}


def test_an_mxfp4_file_on_the_native_kernels_decodes_as_plain_greedy(tmp_path, monkeypatch):
    """llama.cpp's MXFP4_MOE file of a tiny gpt-oss (its logits against llama.cpp's own: test_llamacpp_reference.py)
    with its MXFP4 experts on the native kernels: greedy speculative output with lookups is plain greedy output."""
    from pathlib import Path

    from verispec.kernels import native

    if not native.available():
        pytest.skip("native kernels not compiled")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    path = Path(__file__).parent / "fixtures" / "llamacpp" / "gpt-oss-mxfp4_moe.gguf"
    loaded = load_model(path, "float32", progress=False, quantization="gguf")
    assert loaded.model.layers[0].mlp.experts[0].w_down.kernels[0][0] == 39  # MXFP4 rows, as stored
    for method in ("suffix", "ngram"):
        generator = SpeculativeGenerator(loaded, None, num_speculative_tokens=3, speculative_method=method,
                                         adaptive=False, progress=False)  # fmt: skip
        for ids in ([5, 9, 7, 11, 5, 9, 7, 11, 5, 9], PROMPTS[0][:20]):
            out = generator.generate(ids, max_tokens=16, ignore_eos=True)
            assert out.token_ids == reference_greedy(loaded.model, ids, 16, set()), (method, ids)
