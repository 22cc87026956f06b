"""A draft's weights requantized to Q4_0 (`--speculative-quantization q4_0`): the layers' wider matrices become Q4_0
once, cached beside the prepared files; the embeddings and the head stay as stored; and the output of speculative
decoding with such a draft is the target's own, greedy and sampled (the draft's form changes which tokens it
proposes, never which are kept)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from test_generator_tiny import reference_greedy, reference_sampled

from verispec import SpeculativeGenerator, load_model
from verispec.arguments import add_model_arguments
from verispec.decoding.sampling import SamplingParams
from verispec.kernels import native

from architectures import tokens

FIXTURE = Path(__file__).parent / "fixtures" / "architectures" / "llama3.gguf"  # F16 matrices: all coarsened
pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels not compiled")
Q4_0_TILE = native.TILE_OF[native.Q4_0]


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    return tmp_path


def _logits(model) -> torch.Tensor:
    ids = tokens()
    return model(ids, model.new_cache(max_len=ids.shape[1]), [0])[0]


def _kernel_types(model) -> dict[str, set[int]]:
    layers = {kind for block in model.layers for linear in (block.attn.wqkv, block.attn.wo, block.mlp.w_gate_up,
              block.mlp.w_down) for kind, _ in linear.kernels}  # fmt: skip
    return {"layers": layers, "head": {kind for kind, _ in model.lm_head.kernels}, "embed": {model.embed.qtype}}


def _matrices(model) -> list:
    return [linear for block in model.layers for linear in (block.attn.wqkv, block.attn.wo, block.mlp.w_gate_up,
            block.mlp.w_down)]  # fmt: skip


def test_a_coarse_draft_holds_its_layers_in_q4_0_and_its_embeddings_and_head_as_stored(own_cache):
    """Each layer matrix is the `gguf` package's own Q4_0 quantization of the stored values (ggml's reference
    rounding), to the byte."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    stored = load_model(FIXTURE, "float32", progress=False, quantization="gguf").model
    coarse = load_model(FIXTURE, "float32", progress=False, quantization="q4_0").model
    assert _kernel_types(coarse) == {"layers": {Q4_0_TILE}, "head": {1}, "embed": {1}}  # 1: F16, as stored
    assert Q4_0_TILE not in _kernel_types(stored)["layers"]
    for exact, rough in zip(_matrices(stored), _matrices(coarse), strict=True):
        for (qtype, rows), (coarse_type, coarse_rows) in zip(exact.source, rough.source, strict=True):
            values = native.rows_to_floats(qtype, rows, torch.arange(rows.shape[0]), exact.in_features)
            assert coarse_type == native.Q4_0
            assert (quantize(values.numpy(), GGMLQuantizationType.Q4_0) == coarse_rows.numpy()).all()
    assert not torch.equal(_logits(stored), _logits(coarse))


def test_the_coarse_form_is_made_once_and_read_from_the_cache(own_cache, monkeypatch):
    first = _logits(load_model(FIXTURE, "float32", progress=False, quantization="q4_0").model)

    def refuse(*args, **kwargs):
        raise AssertionError("requantized again")

    monkeypatch.setattr(native, "requantize_q4_0", refuse)
    again = _logits(load_model(FIXTURE, "float32", progress=False, quantization="q4_0").model)
    assert torch.equal(first, again)
    assert [p.name for p in (own_cache / "converted").iterdir() if "q4_0" in p.name]


def test_a_hugging_face_folder_draft_is_coarsened_on_the_native_kernels(architecture):
    folder, expected = architecture("llama3")
    coarse = load_model(folder, "float32", progress=False, quantization="q4_0").model
    assert coarse.fused_blocks is not None
    assert _kernel_types(coarse)["layers"] == {Q4_0_TILE}
    assert _kernel_types(coarse)["head"] == {0}  # F32, as read
    dense = load_model(folder, "float32", progress=False).model
    weight = dense.layers[0].mlp.w_down.weight.detach()
    step = weight.reshape(weight.shape[0], -1, 32).abs().amax(-1, keepdim=True) / 8  # a Q4_0 block's step
    (_, rows), *_ = coarse.layers[0].mlp.w_down.source
    back = native.rows_to_floats(native.Q4_0, rows, torch.arange(rows.shape[0]), weight.shape[1])
    error = (back - weight).reshape(step.shape[0], -1, 32).abs()
    assert bool((error <= step + 1e-6).all()) and float(error.max()) > 0  # one step: Q4_0 clips at 7 of 8
    assert float((_logits(coarse) - expected).abs().max()) > 0


@pytest.mark.parametrize("method", ["draft", "suffix"])
def test_speculation_with_a_coarse_draft_keeps_the_target_s_greedy_and_sampled_output(own_cache, method):
    target = load_model(FIXTURE, "float32", progress=False, quantization="gguf")
    draft = load_model(FIXTURE, "float32", progress=False, quantization="q4_0")
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=3, speculative_method=method,
                                     adaptive=False)  # fmt: skip
    params = SamplingParams(temperature=0.8, top_k=40)
    drafted = accepted = 0
    for start in range(0, 40, 10):
        ids = [int(t) for t in tokens()[0, start : start + 8]]
        out = generator.generate(ids, max_tokens=24, ignore_eos=True)
        assert out.token_ids == reference_greedy(target.model, ids, 24, [])
        sampled = generator.generate(ids, max_tokens=24, temperature=0.8, top_k=40, seed=start, ignore_eos=True)
        assert sampled.token_ids == reference_sampled(target.model, ids, 24, [], params, start)
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert 0 < accepted < drafted  # the coarse draft's proposals were both kept and refused


def test_only_the_draft_takes_the_coarse_form():
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert parser.parse_args(["--speculative-quantization", "q4_0"]).speculative_quantization == "q4_0"
    with pytest.raises(SystemExit):
        parser.parse_args(["--quantization", "q4_0"])


@pytest.mark.parametrize(("coarse_ms", "chosen"), [(7.0, "q4_0"), (9.9, "gguf"), (12.0, "gguf")])
def test_auto_keeps_the_form_that_drafts_fastest_here_and_remembers_it(own_cache, monkeypatch, coarse_ms, chosen):
    """The stored form's step takes 10 ms: a coarse form is kept only when it saves more than MARGIN of it."""
    from verispec.models import draft_forms
    from verispec.models.loading import choose_draft_form, load_pair

    def timed(model) -> float:
        coarse = Q4_0_TILE in _kernel_types(model)["layers"]
        return (coarse_ms if coarse else 10.0) / 1e3

    monkeypatch.setattr(draft_forms, "_step_seconds", timed)
    assert choose_draft_form(str(FIXTURE), progress=False) == chosen
    monkeypatch.setattr(draft_forms, "_measure", lambda *args: pytest.fail("measured again"))
    _, draft = load_pair(FIXTURE, FIXTURE, progress=False, quantization="gguf")  # the default: auto
    assert (Q4_0_TILE in _kernel_types(draft.model)["layers"]) == (chosen == "q4_0")


def test_the_api_refuses_a_coarse_target_and_names_the_forms_it_takes():
    from verispec.errors import InvalidParameterError
    from verispec.models.loading import load_pair

    with pytest.raises(InvalidParameterError, match="drafts"):
        load_pair(FIXTURE, None, progress=False, quantization="q4_0")
    with pytest.raises(InvalidParameterError, match="q4_0"):
        load_model(FIXTURE, progress=False, quantization="q5_0")


def test_a_cache_entry_out_of_shape_is_measured_again(own_cache, monkeypatch):
    import json

    from verispec.models import draft_forms
    from verispec.models.loading import choose_draft_form

    monkeypatch.setattr(draft_forms, "_step_seconds", lambda model: 0.01)
    choose_draft_form(str(FIXTURE), progress=False)
    cache = own_cache / "draft-forms.json"
    known = json.loads(cache.read_text())
    (key,) = known
    cache.write_text(json.dumps({key: {"form": "q3_k"}}))  # edited by hand
    assert choose_draft_form(str(FIXTURE), progress=False) == "gguf"  # level timings: the file as stored
    assert json.loads(cache.read_text())[key]["form"] == "gguf"
    cache.write_text("{not json")
    assert choose_draft_form(str(FIXTURE), progress=False) == "gguf"
