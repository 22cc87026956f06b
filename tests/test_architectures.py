"""Each architecture against transformers' own implementation: tiny random models made by transformers from a seed
(architectures.py), loaded by verispec from their Hugging Face folders, and from GGUF files llama.cpp's converter
made of such models (fixtures/architectures/, with transformers' logits beside each).

Tolerance: float32 logits within 1e-4 of transformers' where the largest is 10 (scaled with the largest: 1e-5 of
it), and the same argmax at every position. Both sides compute in float32 in different orders (fused q/k/v and
gate/up products, the native stack's fixed 16-lane sums and its exp polynomial, rotary tables from float64 angles
where transformers rounds its angles to float32 first): each logit differs by a few float32 roundings of its
terms, 1e-6 to 4e-6 of the largest logit here. What the tests must catch is far above: Llama 3.1's rope scaling
left out moves these logits by 1e-2 and more (test_leaving_out_rope_scaling_is_caught), a missing soft-cap or
window by as much.

The native stack is compared with a float32 KV cache (the same keys transformers attends to); with its default
float16 cache (keys and values rounded to halves: 5e-4 relative) the logits stay within 3e-3 of the largest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_kernels import path as path  # a fixture: the tests that take it run on every path

from verispec import load_model
from verispec.kernels import native
from verispec.models.gguf_native import native_from_dense

from architectures import NAMES, PYTORCH_ONLY, tokens

FIXTURES = Path(__file__).parent / "fixtures" / "architectures"
GGUF_NAMES = sorted(path.stem for path in FIXTURES.glob("*.gguf"))
needs_native = pytest.mark.skipif(not native.available(), reason="native kernels not compiled")


def assert_close(got: torch.Tensor, expected: torch.Tensor, relative: float = 1e-5) -> None:
    scale = max(10.0, float(expected.abs().max()))
    assert got.shape == expected.shape
    assert float((got - expected).abs().max()) <= relative * scale, float((got - expected).abs().max())
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def _prefill_then_decode(model, ids: torch.Tensor, prefill: int = 20) -> torch.Tensor:
    """Logits of every position: the first `prefill` in one pass, then one token per pass (the cache's path)."""
    cache = model.new_cache(max_len=ids.shape[1])
    out = [model(ids[:, :prefill], cache, [0])[0]]
    out += [model(ids[:, t : t + 1], cache, [0])[0] for t in range(prefill, ids.shape[1])]
    return torch.cat(out)


@pytest.mark.parametrize("name", NAMES)
def test_the_pytorch_path_computes_what_transformers_computes(name, architecture):
    folder, expected = architecture(name)
    model = load_model(folder, "float32", progress=False).model
    ids = tokens()
    assert_close(model(ids, model.new_cache(max_len=ids.shape[1]), [0])[0], expected)
    assert_close(_prefill_then_decode(model, ids), expected)


NATIVE = [name for name in NAMES if name not in PYTORCH_ONLY]  # no linear attention, sinks or biased experts there


@needs_native
@pytest.mark.parametrize("name", NATIVE)
def test_the_native_stack_computes_what_transformers_computes(name, architecture, monkeypatch):
    """Dense float32 weights on the stack; the prefill cut into chunks of 7 rows, so that chunks cross the sliding
    windows (8) too."""
    import verispec.models.model

    folder, expected = architecture(name)
    model = native_from_dense(load_model(folder, "float32", progress=False).model)
    assert model.fused_blocks is not None
    monkeypatch.setattr(verispec.models.model, "FUSED_CHUNK_ROWS", 7)
    model.kv_dtype = torch.float32
    assert_close(_prefill_then_decode(model, tokens()), expected)
    model.kv_dtype = torch.float16
    got = _prefill_then_decode(model, tokens())
    assert float((got - expected).abs().max()) <= 3e-3 * float(expected.abs().max())


@needs_native
@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_every_native_path_computes_what_transformers_computes(name, architecture, path):
    """The portable C, AVX2 and AVX-512 attention (windows, soft-caps) and per-row steps alike."""
    folder, expected = architecture(name)
    model = native_from_dense(load_model(folder, "float32", progress=False).model)
    model.kv_dtype = torch.float32
    assert_close(_prefill_then_decode(model, tokens()), expected)


def test_a_gemma3_config_with_attention_soft_capping_is_read_as_transformers_reads_it(tmp_path):
    """Gemma 3 configs may carry attn_logit_softcapping; transformers' Gemma 3 (and llama.cpp's gemma3) never apply it.
    Capping by it (what verispec did) moved these logits by 1e-3 where every other family is within 5e-7."""
    from architectures import make_model, reference_logits, save

    model = make_model("gemma3", attn_logit_softcapping=0.5, final_logit_softcapping=10.0)
    expected, ids = reference_logits(model, tokens()), tokens()
    ours = load_model(save(model, tmp_path / "capped"), "float32", progress=False).model
    assert ours.config.attn_softcap == 0.0 and ours.config.final_softcap == 10.0
    assert_close(ours(ids, ours.new_cache(max_len=ids.shape[1]), [0])[0], expected)


def test_leaving_out_rope_scaling_is_caught(architecture, tmp_path):
    """The control for the tolerance: the llama3 model read as if its config had no rope scaling (what verispec did
    before) is far outside it."""
    folder, expected = architecture("llama3")
    plain = tmp_path / "plain"
    plain.mkdir()
    for item in folder.iterdir():
        (plain / item.name).symlink_to(item)
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_scaling", None)
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": config["rope_parameters"]["rope_theta"]}
    (plain / "config.json").unlink()
    (plain / "config.json").write_text(json.dumps(config))
    model = load_model(plain, "float32", progress=False).model
    ids = tokens()
    wrong = model(ids, model.new_cache(max_len=ids.shape[1]), [0])[0]
    assert float((wrong - expected).abs().max()) > 1e-2


@pytest.mark.parametrize("name", GGUF_NAMES)
def test_gguf_files_compute_what_transformers_computes(name, tmp_path, monkeypatch):
    """llama.cpp's conversion of a tiny model (F16: its weights are float16 values) on the PyTorch path and on the
    native stack (float32 cache), against transformers' logits of the model it was made from."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))  # conversions go to a cache of the test's own
    expected = torch.from_numpy(np.load(FIXTURES / f"{name}.logits.npy"))
    ids = tokens()
    model = load_model(FIXTURES / f"{name}.gguf", "float32", progress=False).model
    assert_close(model(ids, model.new_cache(max_len=ids.shape[1]), [0])[0], expected)
    if native.available():
        model = load_model(FIXTURES / f"{name}.gguf", "float32", progress=False, quantization="gguf").model
        if name in PYTORCH_ONLY:  # not on the native stack: the matrices on the kernels, the blocks on PyTorch
            assert model.fused_blocks is None
            assert type(model.lm_head).__name__ == "NativeLinear"
            assert_close(_prefill_then_decode(model, ids), expected)
            return
        assert model.fused_blocks is not None
        model.kv_dtype = torch.float32
        assert_close(_prefill_then_decode(model, ids), expected)


@needs_native
@pytest.mark.parametrize("name", PYTORCH_ONLY)
def test_what_the_native_stack_lacks_is_refused_in_one_line(name, architecture):
    from verispec.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="runs on PyTorch"):
        native_from_dense(load_model(architecture(name)[0], "float32", progress=False).model)
