"""Qwen3.5's hybrid layers (Gated DeltaNet beside gated attention) and its MTP drafter, on a tiny random checkpoint
made by transformers (architectures.py, "qwen3.5"; MTP weights in the published layout: architectures.add_mtp).

What must hold: prefills in the chunked form and decoding in the recurrent form compute transformers' logits; a
rejected draft rolls the recurrent state back to the last accepted token exactly (a state one token off is far outside
the tolerance: the control); greedy speculative output is plain greedy output with every method, in batches, with
drafts accepted in part (an oracle that drafts the right continuation with every third token wrong); a seeded sampled
request's text is plain decoding's for that seed across those rollbacks, and is not when the rollback lands one token
off (the control); the MTP layer computes what its published layout means (a reference made of transformers' own
Qwen3.5 decoder layer and norms); what cannot work is refused in one line.
"""

from __future__ import annotations

import pytest
import torch
from test_architectures import assert_close

from verispec import SpeculativeGenerator, load_model
from verispec.decoding.sampling import SamplingParams
from verispec.engine.drafting import DraftCost, Proposal
from verispec.engine.methods import DraftModelUse, Method, register, unregister
from verispec.engine.requests import EngineRequest
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.errors import InvalidParameterError
from verispec.models.recurrent_state import RecurrentState

from architectures import add_mtp, make_model, reference_logits, save, tokens

PROMPTS = [[(37 * i + 11) % 250 for i in range(41)], [5, 6, 7, 8, 9, 10, 11, 12, 13], [3, 4, 5, 6, 7] * 6]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """(transformers' model, its folder with an MTP layer, verispec's LoadedModel of it, the MTP tensors)."""
    model = make_model("qwen3.5")
    folder = save(model, tmp_path_factory.mktemp("qwen35"))
    mtp = add_mtp(folder)
    return model, folder, load_model(folder, "float32", progress=False), mtp


def _decode(model, ids: torch.Tensor, cache, start: int, end: int) -> torch.Tensor:
    return torch.cat([model(ids[:, t : t + 1], cache, [0])[0] for t in range(start, end)])


def test_a_chunked_prefill_then_decoding_computes_what_transformers_computes(hybrid):
    """150 tokens: a prefill of 130 in the chunked form crosses two DeltaNet chunks (64), then 20 decode steps."""
    reference, _, loaded, _ = hybrid
    model, ids = loaded.model, tokens(length=150)
    expected = reference_logits(reference, ids)
    cache = model.new_cache(max_len=ids.shape[1])
    prefill = model(ids[:, :130], cache, [0], invariant=False)[0]
    assert_close(torch.cat([prefill, _decode(model, ids, cache, 130, 150)]), expected)


def _after_a_rejected_draft(model, ids: torch.Tensor, off_by_one: bool = False) -> torch.Tensor:
    """Prefill 100 tokens, verify [100, 101, three wrong drafts], keep 102 positions, decode on to 110."""
    cache = model.new_cache(max_len=160)
    model(ids[:, :100], cache, [0], invariant=False)
    model(torch.tensor([[int(ids[0, 100]), int(ids[0, 101]), 7, 8, 9]]), cache, [0])
    if off_by_one:  # the control: the state after one more token (the first wrong draft) stands at 102
        cache.recurrent.saved[0][102] = cache.recurrent.saved[0][103]
    cache.set_length(0, 102)
    return _decode(model, ids, cache, 102, 110)


def test_a_rejected_draft_rolls_the_state_back_to_the_last_accepted_token(hybrid):
    model, ids = hybrid[2].model, tokens(length=110)
    cache = model.new_cache(max_len=160)
    model(ids[:, :100], cache, [0], invariant=False)
    straight = _decode(model, ids, cache, 100, 110)[2:]
    assert_close(_after_a_rejected_draft(model, ids), straight)
    assert float((_after_a_rejected_draft(model, ids, off_by_one=True) - straight).abs().max()) > 0.1


def test_the_native_recurrence_computes_the_pytorch_one_with_the_same_bits_at_any_thread_count(monkeypatch):
    """vsk_delta.c against delta_net.recurrent's PyTorch loop (the same algebra, other summation orders: within 1e-5
    relative), and its bits alike at 1 and 3 threads (the pool splits the heads; a head's sums are in one order)."""
    from verispec.kernels import native
    from verispec.models import delta_net

    if not native.available():
        pytest.skip("native kernels not compiled")
    generator = torch.Generator().manual_seed(3)
    steps, heads, size = 6, 4, 32
    q, k = (delta_net.l2_normalised(torch.randn(steps, heads, size, generator=generator)) for _ in range(2))
    v = torch.randn(steps, heads, size, generator=generator)
    g, beta = -torch.rand(steps, heads, generator=generator), torch.rand(steps, heads, generator=generator)
    state = torch.randn(heads, size, size, generator=generator)
    ours = native.delta_steps(q * size**-0.5, k, v, g, beta, state)
    monkeypatch.setattr(native, "available", lambda: False)
    reference = delta_net.recurrent(q * size**-0.5, k, v, g, beta, state)
    assert float((ours[0] - reference[0]).abs().max()) < 1e-5 * float(reference[0].abs().max())
    assert float((ours[1] - torch.stack(reference[1])).abs().max()) < 1e-5 * float(state.abs().max())
    before = native.threads()
    native.set_threads(3)
    try:
        again = native.delta_steps(q * size**-0.5, k, v, g, beta, state)
    finally:
        native.set_threads(before)
    assert torch.equal(again[0], ours[0]) and torch.equal(again[1], ours[1])


def test_the_state_rolls_back_only_to_lengths_a_pass_recorded(hybrid):
    model = hybrid[2].model
    cache = model.new_cache(2, max_len=64)
    model(tokens(length=20), cache, [0], invariant=False)  # a prefill keeps its last state only
    with pytest.raises(ValueError, match="not kept at length 10"):
        cache.set_length(0, 10)
    model(tokens(length=4), cache, [0])  # a verify pass keeps one per row
    cache.set_length(0, 22)
    cache.release(0)
    assert cache.lengths[0] == 0 and torch.equal(cache.recurrent.get(0, 0, 0)[1], cache.recurrent.get(1, 0, 0)[1])
    for share in (lambda: cache.fork(1, 0, 0), lambda: cache.keep_path(0, 0, [0])):
        with pytest.raises(ValueError, match="shares no blocks"):
            share()
    assert not model.takes_trees


class Oracle:
    """Drafts the continuation a plain run gave (`truths`: each prompt's whole sequence), every third drafted token
    wrong: drafts are accepted in part, and the state rolls back into the middle of verify passes."""

    looks_up, drafter = False, None

    def __init__(self, truths: list[list[int]]):
        self.truths, self.spent = truths, DraftCost()

    def propose(self, jobs):
        self.spent = DraftCost(modelled=True)
        return [self._draft(job) for job in jobs]

    def _draft(self, job):
        n = len(job.tokens)
        truth = next((t for t in self.truths if t[:n] == job.tokens), [])
        drafted = [(t + 1) % 250 if (n + i) % 3 == 0 else t for i, t in enumerate(truth[n : n + job.k])]
        return Proposal(torch.tensor(drafted, dtype=torch.long))

    def admit(self, slot, partition): ...

    def lag(self, slot, tokens, model_tokens=None):
        return 0

    def finished(self, slot, output, partition): ...

    def forget(self, history=True, prompts=True): ...


def _run(target, requests: list[tuple[list[int], SamplingParams]], method: str, draft=None, **more) -> list:
    """The requests through one scheduler (3 slots: batched, padded passes); each one's output tokens."""
    config = SchedulerConfig(max_num_seqs=3, max_model_len=200, draft_policy="always", speculative_method=method,
                             num_speculative_tokens=3, **more)  # fmt: skip
    scheduler = Scheduler(target, draft, config)
    events: list[list] = []
    for i, (ids, params) in enumerate(requests):
        events.append([])
        request = EngineRequest(request_id=str(i), prompt_ids=ids, params=params, max_tokens=20, ignore_eos=True,
                                sink=events[-1].append)  # fmt: skip
        scheduler.submit(request)
    scheduler.run_until_idle(max_steps=2000)
    return [e[-1].output for e in events]


def _plain(loaded, ids: list[int], params: SamplingParams) -> list[int]:
    generator = SpeculativeGenerator(loaded, None, max_seq_len=200, progress=False)
    return generator.generate(ids, max_tokens=20, ignore_eos=True, temperature=params.temperature,
                              seed=params.seed).token_ids  # fmt: skip


def reference_greedy(model, ids: list[int], max_tokens: int) -> list[int]:
    """Plain greedy decoding without a cache: the whole sequence again at every step."""
    seq, out = list(ids), []
    for _ in range(max_tokens):
        token = int(model(torch.tensor([seq]), model.new_cache(max_len=len(seq)), [0])[0, -1].argmax())
        seq.append(token)
        out.append(token)
    return out


@pytest.fixture
def oracle():
    """The `oracle` method, drafting each prompt's plain greedy continuation (or a given one)."""
    truths: list[list[int]] = []
    register(Method(name="oracle", summary="test", build=lambda setup: Oracle(truths),
                    draft_model=DraftModelUse.UNUSED))  # fmt: skip
    yield truths
    unregister("oracle")


@pytest.mark.parametrize("method", ["oracle", "mtp", "suffix", "ngram", "draft"])
def test_greedy_speculative_output_is_plain_greedy_output(method, hybrid, oracle, architecture):
    loaded = hybrid[2]
    expected = [reference_greedy(loaded.model, ids, 20) for ids in PROMPTS]
    oracle += [ids + out for ids, out in zip(PROMPTS, expected, strict=True)]
    draft = None
    if method == "draft":  # a Llama of the same vocabulary (a hybrid draft is refused: below)
        draft = load_model(architecture("llama")[0], "float32", progress=False)
    outputs = _run(loaded, [(ids, SamplingParams()) for ids in PROMPTS], method, draft)
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.stats.drafted for o in outputs) > 0
    if method == "oracle":  # drafts accepted in part: rollbacks inside verify passes
        assert 0 < sum(o.stats.accepted for o in outputs) < sum(o.stats.drafted for o in outputs)


def test_seeded_sampled_text_is_plain_decodings_across_rollbacks(hybrid, oracle, monkeypatch):
    """Six seeds, each sampled request drafted by the oracle from its own plain sampled text (every third token
    wrong), beside others; the control rolls the state back to the latest recorded length (one token or more off)."""
    loaded = hybrid[2]
    requests = [(PROMPTS[seed % 3], SamplingParams(temperature=1.0, seed=seed)) for seed in range(6)]
    expected = [_plain(loaded, ids, params) for ids, params in requests]
    oracle += [ids + out for (ids, _), out in zip(requests, expected, strict=True)]
    outputs = _run(loaded, requests, "oracle")
    assert [o.token_ids for o in outputs] == expected
    assert 0 < sum(o.stats.accepted for o in outputs) < sum(o.stats.drafted for o in outputs)

    def latest(self, slot, length):  # the control: whatever the pass made last, not the state at `length`
        self.saved[slot] = {length: self.saved[slot][max(self.saved[slot])]}

    monkeypatch.setattr(RecurrentState, "begin", latest)
    assert [o.token_ids for o in _run(loaded, requests, "oracle")] != expected


def test_the_mtp_layer_computes_its_published_layout(hybrid):
    """verispec's MTP layer against one made of transformers' Qwen3.5 modules with the same tensors: the target's
    final hidden states (transformers') and the next tokens in, the head's logits out, at every position."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import (
        Qwen3_5DecoderLayer,
        Qwen3_5RMSNorm,
        Qwen3_5TextRotaryEmbedding,
    )

    reference, _, loaded, mtp = hybrid
    config = reference.config
    ids = tokens(length=30)
    with torch.inference_mode():
        hidden = reference.model(input_ids=ids).last_hidden_state  # after the final norm
        layer = Qwen3_5DecoderLayer(config, config.layer_types.index("full_attention")).eval()
        layer.load_state_dict({k.removeprefix("mtp.layers.0."): v for k, v in mtp.items() if ".layers.0." in k})
        norms = {}
        for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            norms[name] = Qwen3_5RMSNorm(config.hidden_size, config.rms_norm_eps)
            norms[name].weight.copy_(mtp[f"mtp.{name}.weight"])
        embedded = reference.model.embed_tokens(ids[:, 1:])
        x = torch.cat([norms["pre_fc_norm_embedding"](embedded), norms["pre_fc_norm_hidden"](hidden[:, :-1])], -1)
        x = x @ mtp["mtp.fc.weight"].T
        positions = torch.arange(x.shape[1])[None]
        rotary = Qwen3_5TextRotaryEmbedding(config)(x, positions)
        mask = torch.full((x.shape[1], x.shape[1]), float("-inf")).triu(1)[None, None]
        x = layer(x, position_embeddings=rotary, attention_mask=mask, position_ids=positions)
        expected = reference.lm_head(norms["norm"](x))[0]
    model = loaded.model
    cache = model.mtp.new_cache(max_len=32)
    got = model.head_logits(model.mtp.draft(model, ids[:, 1:], hidden[:, :-1], cache, [0]))[0]
    assert_close(got, expected)


def test_the_mtp_head_is_restricted_as_draft_vocab_says_and_the_output_stays_the_targets(hybrid):
    """By default the MTP drafter reads the first MTP_HEAD_ROWS rows of a large vocabulary's head (and the stop
    tokens), all of a small one's; --draft-vocab N sets N, 0 the whole head. Greedy output is plain greedy output with
    a head of 100 rows (the tiny vocabulary's 258), sampled output plain sampling's for its seed."""
    from verispec.engine.mtp import MTP_HEAD_ROWS, mtp_head_rows

    assert mtp_head_rows(None, 248320) == MTP_HEAD_ROWS and mtp_head_rows(None, 258) is None
    assert mtp_head_rows(0, 248320) is None and mtp_head_rows(1000, 248320) == 1000
    loaded = hybrid[2]
    requests = [(ids, SamplingParams()) for ids in PROMPTS] + [(PROMPTS[0], SamplingParams(temperature=1.0, seed=4))]
    expected = [_plain(loaded, ids, params) for ids, params in requests]
    outputs = _run(loaded, requests, "mtp", method_options={"draft_vocab": 100})
    assert [o.token_ids for o in outputs] == expected
    assert sum(o.stats.drafted for o in outputs) > 0


def test_a_long_prompt_catches_up_alone_and_the_output_stays_the_targets(hybrid, monkeypatch):
    """A 150-token prompt's MTP catch-up (fed alone, here 64 rows a pass: hidden_proposer.FEED_ROWS) beside short
    sequences: greedy output is plain greedy output, and a finished request's MTP blocks are given back at once."""
    from verispec.engine import hidden_proposer

    monkeypatch.setattr(hidden_proposer, "FEED_ROWS", 64)
    loaded = hybrid[2]
    long = [(13 * i + 5) % 250 for i in range(150)]
    requests = [(long, SamplingParams()), (PROMPTS[1], SamplingParams()), (PROMPTS[2], SamplingParams())]
    config = SchedulerConfig(max_num_seqs=3, max_model_len=200, draft_policy="always", speculative_method="mtp",
                             num_speculative_tokens=3)  # fmt: skip
    scheduler = Scheduler(loaded, None, config)
    events: list[list] = []
    for i, (ids, params) in enumerate(requests):
        events.append([])
        scheduler.submit(EngineRequest(request_id=str(i), prompt_ids=ids, params=params, max_tokens=12,
                                       ignore_eos=True, sink=events[-1].append))  # fmt: skip
    scheduler.run_until_idle(max_steps=2000)
    for (ids, params), got in zip(requests, events, strict=True):
        assert got[-1].output.token_ids == _plain(loaded, ids, params)[:12]
    assert all(got[-1].output.stats.drafted > 0 for got in events)
    assert scheduler.proposer.cache.pool.in_use() == 0  # every finished request's blocks given back


def test_the_mtp_method_reads_the_target_hidden_states_it_was_given(hybrid):
    """The MTP drafter's first draft is the layer's argmax over what the target's passes handed it."""
    loaded = hybrid[2]
    model, ids = loaded.model, PROMPTS[0]
    outputs = _run(loaded, [(ids, SamplingParams())], "mtp")
    assert outputs[0].stats.drafted > 0
    cache = model.new_cache(max_len=64)
    hidden = []
    model.serve_hidden(lambda slots, starts, h: hidden.append(h))
    try:
        model(torch.tensor([ids]), cache, [0], invariant=False)
    finally:
        model.serve_hidden(None)
    assert hidden[0].shape == (1, len(ids), model.config.hidden_size)


def test_a_gguf_file_from_llamacpps_converter_holds_the_same_mtp_layer(tmp_path, monkeypatch):
    """The fixture (tests/fixtures/architectures/qwen3.5.gguf: llama.cpp's converter wrote the MTP layer as its last
    block, norms as 1 + w, value heads in its tiled order) gives the MTP layer the Hugging Face folder it was made from
    gives; the model's logits are test_architectures.py's."""
    from test_architectures import FIXTURES

    from architectures import TINY

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    folder = save(make_model("qwen3.5", dims=TINY, half_exact=True), tmp_path / "hf")
    add_mtp(folder, half_exact=True)
    gguf = FIXTURES / "qwen3.5.gguf"
    ours = [load_model(source, "float32", progress=False, quantization=form).model
            for source, form in ((folder, "none"), (gguf, "none"), (gguf, "gguf"))]  # fmt: skip
    assert ours[1].config.mtp_layers == 1 and ours[1].config.norm_offset == 0.0  # the file's norms hold 1 + w
    ids, hidden = tokens(length=12), torch.randn(1, 11, ours[0].config.hidden_size, generator=torch.Generator())
    got = [m.head_logits(m.mtp.draft(m, ids[:, 1:], hidden, m.mtp.new_cache(max_len=16), [0]))[0] for m in ours]
    assert_close(got[1], got[0])
    assert_close(got[2], got[0])  # with the MTP layer's matrices on the native kernels


def check_the_gguf_fixture_on(
    device: str, truths: list[list[int]], name: str = "qwen3.5", quantization: str = "none"
) -> None:
    """A Qwen3.5 GGUF fixture (llama.cpp's conversion, with its MTP layer) on `device`: transformers' logits (a
    prefill, then steps), greedy output with the MTP drafter and with the oracle (`truths`: its list) equal to plain
    greedy decoding, seeded sampled text equal to plain sampling's (test_cuda.py runs it on a GPU)."""
    import numpy as np
    from test_architectures import FIXTURES, _prefill_then_decode

    loaded = load_model(FIXTURES / f"{name}.gguf", "float32", device=device, progress=False, quantization=quantization)
    expected = torch.from_numpy(np.load(FIXTURES / f"{name}.logits.npy"))
    assert_close(_prefill_then_decode(loaded.model, tokens().to(device)).cpu(), expected)
    greedy = [(ids, SamplingParams()) for ids in PROMPTS]
    sampled = [(PROMPTS[seed % 3], SamplingParams(temperature=1.0, seed=seed)) for seed in range(3)]
    expected = [_plain(loaded, ids, params) for ids, params in greedy + sampled]
    truths += [ids + out for (ids, _), out in zip(greedy + sampled, expected, strict=True)]
    for method in ("mtp", "oracle"):
        outputs = _run(loaded, greedy + sampled, method)
        assert [o.token_ids for o in outputs] == expected, method
        assert sum(o.stats.drafted for o in outputs) > 0
    assert 0 < sum(o.stats.accepted for o in outputs) < sum(o.stats.drafted for o in outputs)


@pytest.mark.parametrize("name", ["qwen3.5", "qwen3.5-moe"])
@pytest.mark.parametrize("quantization", ["none", "gguf"])
def test_the_gguf_fixture_drafts_and_keeps_the_output(name, quantization, oracle, tmp_path, monkeypatch):
    """Dequantized on PyTorch (none), and with every matrix on the native kernels as the file stores it (gguf: the
    CPU default; the blocks one by one, the native stack having no linear attention)."""
    from verispec.kernels import native

    if quantization == "gguf" and not native.available():
        pytest.skip("native kernels not compiled")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    check_the_gguf_fixture_on("cpu", oracle, name, quantization)


def test_what_cannot_work_is_refused_in_one_line(hybrid, tmp_path):
    loaded = hybrid[2]
    with pytest.raises(InvalidParameterError, match="linear-attention layers"):
        Scheduler(loaded, loaded, SchedulerConfig(speculative_method="draft"))
    plain = load_model(save(make_model("qwen3.5"), tmp_path / "plain"), "float32", progress=False)
    assert plain.model.mtp is None
    with pytest.raises(InvalidParameterError, match="multi-token-prediction layer"):
        Scheduler(plain, None, SchedulerConfig(speculative_method="mtp"))
    with pytest.raises(InvalidParameterError, match="linear-attention state"):
        Scheduler(loaded, None, SchedulerConfig(speculative_method="mtp", kv_cache_memory=4096))
