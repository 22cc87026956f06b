"""docs/architecture.md, "Adding a drafter", executed: a drafter with a checkpoint of its own and a need for the
target's hidden states (tests/toy_drafter.py) is one module and one `register`; it is served end to end, from its
checkpoint's path, by the Python API and through the HTTP server, and its output is plain decoding's."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from verispec import SpeculativeGenerator
from verispec.engine.methods import method_names, unregister
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.errors import InvalidParameterError
from verispec.server.app import ServerState, create_app
from verispec.testing import tiny_pair

import toy_drafter

PROMPTS = ["hello world", "The quick brown fox", "abc abc abc"]


@pytest.fixture(scope="module")
def head(tmp_path_factory) -> str:
    """A checkpoint of the toy head for the tiny target: its own random matrix."""
    target, _ = tiny_pair()
    config = target.model.config
    path = tmp_path_factory.mktemp("toy-head") / "head.safetensors"
    weight = torch.randn(config.vocab_size, config.hidden_size, generator=torch.Generator().manual_seed(3))
    save_file({"head.weight": weight}, str(path))
    return str(path)


def test_the_drafter_is_one_register_away_from_every_front_end():
    assert toy_drafter.NAME in method_names()


def test_greedy_and_seeded_output_with_the_drafter_is_plain_decodings(one_thread, head):
    target, _ = tiny_pair()
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    spec = SpeculativeGenerator(target, head, speculative_method=toy_drafter.NAME, max_seq_len=256, adaptive=False,
                                progress=False)  # fmt: skip
    drafted = 0
    for prompt in PROMPTS:
        out = spec.generate(prompt, max_tokens=24, ignore_eos=True, temperature=0)
        assert out.token_ids == plain.generate(prompt, max_tokens=24, ignore_eos=True, temperature=0).token_ids
        drafted += out.stats.drafted
        sampled = spec.generate(prompt, max_tokens=24, ignore_eos=True, temperature=0.9, seed=5).token_ids
        assert sampled == plain.generate(prompt, max_tokens=24, ignore_eos=True, temperature=0.9, seed=5).token_ids
    assert drafted > 0  # the head drafted: it read the target's hidden states


def test_the_drafter_is_served_over_http_and_answers_as_plain_decoding(one_thread, head):
    from fastapi.testclient import TestClient

    from verispec.engine.methods import get_method, load_models

    target, head_weights = load_models(get_method(toy_drafter.NAME), tiny_pair()[0], head)
    config = SchedulerConfig(max_num_seqs=2, max_model_len=256, speculative_method=toy_drafter.NAME,
                             draft_policy="always")  # fmt: skip
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    with TestClient(create_app(ServerState(Scheduler(target, head_weights, config), "tiny"))) as client:
        for prompt in PROMPTS:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
            reply = client.post("/v1/completions", json=body).json()
            assert reply["choices"][0]["text"] == plain.generate(prompt, max_tokens=16, ignore_eos=True).text
            assert reply["verispec"]["drafted"] > 0


def test_a_head_for_another_target_is_refused_in_one_line(tmp_path):
    target, _ = tiny_pair()
    path = tmp_path / "wide.safetensors"
    save_file({"head.weight": torch.zeros(target.model.config.vocab_size, target.model.config.hidden_size + 8)},
              str(path))  # fmt: skip
    with pytest.raises(InvalidParameterError, match="this head reads hidden states of"):
        SpeculativeGenerator(target, str(path), speculative_method=toy_drafter.NAME, progress=False)


def test_unregistered_it_is_no_choice_any_more():
    method = toy_drafter.NAME
    try:
        unregister(method)
        with pytest.raises(InvalidParameterError, match="unknown speculative method"):
            SchedulerConfig(speculative_method=method)
    finally:
        import importlib

        importlib.reload(toy_drafter)  # registers it again
    assert method in method_names()
