"""The target serving a drafter its hidden states (Transformer.serve_hidden, models/hidden_states.py): the inputs of
named layers side by side, as transformers' hidden_states gives them, on PyTorch and on the native stack (run in layer
ranges), with the pass's logits unchanged."""

from __future__ import annotations

import pytest
import torch

from verispec import load_model
from verispec.models.gguf_native import native_from_dense

from architectures import make_model, save


@pytest.mark.parametrize("name", ["llama", "qwen3", "gpt-oss"])
def test_the_target_serves_the_inputs_of_named_layers(tmp_path, name):
    """The residual stream entering each named layer, side by side, as transformers' hidden_states gives it (PyTorch;
    the native stack where the family runs on it, within its 8-bit activations' rounding); the pass's logits are
    the same bits served or not, and run in layer ranges or whole."""
    types = {"layer_types": ["sliding_attention", "full_attention"] * 2} if name == "gpt-oss" else {}
    hf = make_model(name, num_hidden_layers=4, **types)
    model = load_model(save(hf, tmp_path / name), "float32", progress=False).model
    tokens = torch.randint(0, 250, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        states = hf(tokens, output_hidden_states=True).hidden_states
    layers = (1, 3, 2, 4)
    expected = torch.cat([states[layer] for layer in layers[:3]], dim=-1)
    models = [model] if name == "gpt-oss" else [model, native_from_dense(load_model(tmp_path / name, "float32",
                                                                                    progress=False).model)]  # fmt: skip
    for m in models:
        served: list[torch.Tensor] = []
        plain = m(tokens, m.new_cache(2, 64), [0, 1])
        m.serve_hidden(lambda slots, starts, hidden, kept=served: kept.append(hidden), layers=layers)
        try:
            logits = m(tokens, m.new_cache(2, 64), [0, 1])
        finally:
            m.serve_hidden(None)
        assert torch.equal(logits, plain)
        got = served[0][..., : expected.shape[-1]]
        tolerance = 1e-4 if m.fused_blocks is None else 2e-2
        assert torch.allclose(got, expected, atol=tolerance * expected.abs().max(), rtol=0)
        if m.fused_blocks is not None:  # a verify pass holding token trees, laid end to end, in ranges: the same bits
            rows, parents = [[5, 6, 7, 8], [9, 10, 11]], [[-1, -1, 1, 1], None]
            prefix = [tokens[0].tolist(), tokens[1].tolist()]
            logits = []
            for serve in (False, True):
                m.serve_hidden((lambda slots, starts, hidden: None) if serve else None, layers=layers)
                cache = m.new_cache(2, 64)
                m.forward_rows(prefix, cache, [0, 1])
                logits.append(m.forward_rows(rows, cache, [0, 1], parents=parents))
            m.serve_hidden(None)
            assert torch.equal(logits[0], logits[1])
