"""logit_bias, presence/frequency penalties and logprobs through the engine, against their definitions.

The references here are written from OpenAI's definitions, without the engine: the whole sequence is recomputed
without a cache at every position, the penalties counted from the generated tokens with a Counter.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from speculation import METHODS, speculative_generator

from verispec import SpeculativeGenerator
from verispec.decoding.adjustments import LogitAdjustments
from verispec.decoding.sampling import SamplingParams, probs_from_logits
from verispec.errors import InvalidParameterError
from verispec.testing import tiny_config, tiny_loaded, tiny_model, tiny_pair, word_tokenizer

from distributions import total_variation

PROMPTS = ["def add(a, b):", "hello world", "x"]
ADJUSTED = {"presence_penalty": 1.2, "frequency_penalty": 0.7, "logit_bias": {5: 2.5, 17: -100.0}}


def _logits(model, seq: list[int]) -> torch.Tensor:
    return model(torch.tensor([seq], device=model.device), model.new_cache(max_len=len(seq)), [0])[0, -1].float()


def _by_definition(
    logits: torch.Tensor, generated: list[int], presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None
) -> torch.Tensor:
    adjusted = logits.clone()
    for token, bias in (logit_bias or {}).items():
        adjusted[token] += bias
    for token, count in Counter(generated).items():
        adjusted[token] -= presence_penalty + frequency_penalty * count
    return adjusted


def reference_greedy(model, prompt_ids, max_tokens, stop_ids, **adjust) -> list[int]:
    out: list[int] = []
    for _ in range(max_tokens):
        token = int(_by_definition(_logits(model, [*prompt_ids, *out]), out, **adjust).argmax())
        if token in stop_ids:
            break
        out.append(token)
    return out


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def test_each_row_sees_the_recorded_tokens_and_the_drafts_before_it():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias={3: 1.0})
    adjustments = LogitAdjustments(params, 8)
    for token in (1, 1, 2):
        adjustments.record(token)
    logits = torch.randn(4, 8)
    drafted = [2, 4, 4]
    got = adjustments.apply(logits, drafted)
    for i in range(4):  # a verification pass: row i after the recorded tokens and drafted[:i]
        expect = _by_definition(logits[i], [1, 1, 2, *drafted[:i]], 0.5, 0.25, {3: 1.0})
        torch.testing.assert_close(got[i], expect)
    one = adjustments.apply(logits[:1], drafted)  # a drafting step: one row, after all drafts so far
    torch.testing.assert_close(one[0], _by_definition(logits[0], [1, 1, 2, *drafted], 0.5, 0.25, {3: 1.0}))
    assert LogitAdjustments(SamplingParams(), 8).apply(logits, drafted) is logits  # nothing asked, nothing done


@pytest.mark.parametrize(("method", "k"), METHODS)
def test_greedy_with_penalties_and_bias_equals_plain_decoding_by_definition(pair, method, k):
    target, draft = pair
    generator = speculative_generator(target, draft, method, k)
    stops = target.tokenizer.stop_token_ids
    drafted = changed = 0
    for prompt in [*PROMPTS, "abc abc abc abc"]:
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=30, **ADJUSTED)
        assert out.token_ids == reference_greedy(target.model, ids, 30, stops, **ADJUSTED), prompt
        assert 17 not in out.token_ids
        drafted += out.stats.drafted
        changed += out.token_ids != reference_greedy(target.model, ids, 30, stops)
    assert drafted > 0
    assert changed  # the adjustments changed the text: the comparison above could fail


VOCAB = 7
RUNS = 4000
TOLERANCE = 0.06  # TV over 49 outcomes of the first two tokens; sampling noise ~0.02 at N = 4000


def _exact_first_two(model, prompt_ids, params: SamplingParams, **adjust) -> dict:
    def probs(generated):
        logits = _by_definition(_logits(model, [*prompt_ids, *generated]), generated, **adjust)
        return probs_from_logits(logits, params)

    first = probs([])
    return {(a, b): float(first[a]) * float(pb) for a in range(VOCAB) for b, pb in enumerate(probs([a]))}


@pytest.mark.parametrize("method", ["draft", pytest.param("hybrid", marks=pytest.mark.slow)])
def test_sampled_output_follows_the_adjusted_target_distribution(method):
    tokenizer = word_tokenizer(VOCAB)
    tokenizer.stop_token_ids = frozenset()  # no EOS: the first two tokens always exist
    target_model = tiny_model(tiny_config(vocab_size=VOCAB), seed=3, scale=1.0, residual_gain=0.5)
    draft_model = tiny_model(tiny_config(vocab_size=VOCAB, hidden_size=32, num_layers=1), seed=4)
    adjust = {"presence_penalty": 1.5, "frequency_penalty": 0.5, "logit_bias": {2: 1.5, 4: -1.0}}
    params = SamplingParams(temperature=0.9)
    prompt_ids = [0, 1, 2, 0, 1, 2, 0, 1] if method == "hybrid" else [0, 1, 2]
    generator = SpeculativeGenerator(
        tiny_loaded(target_model, tokenizer), tiny_loaded(draft_model, tokenizer), num_speculative_tokens=3,
        speculative_method=method, adaptive=False,
    )  # fmt: skip
    counts, accepted = Counter(), 0
    for seed in range(RUNS):
        out = generator.generate(prompt_ids, max_tokens=2, temperature=0.9, seed=seed, **adjust)
        counts[tuple(out.token_ids)] += 1
        accepted += out.stats.accepted
    assert accepted > 0  # drafted tokens were accepted: the adjusted acceptance path ran
    assert total_variation(counts, _exact_first_two(target_model, prompt_ids, params, **adjust), RUNS) < TOLERANCE
    # negative control: the unadjusted target distribution is measurably different at this sample size
    assert total_variation(counts, _exact_first_two(target_model, prompt_ids, params), RUNS) > TOLERANCE


# ---- logprobs ---------------------------------------------------------------------------------------------
LOGPROB_TOLERANCE = 1e-4  # the tiny models run PyTorch's kernels, whose sums depend on the batch's rows


def test_logprobs_are_the_raw_target_distribution_with_speculation_on_or_off(pair):
    target, draft = pair
    spec = SpeculativeGenerator(target, draft, num_speculative_tokens=3, adaptive=False)
    plain = SpeculativeGenerator(target, None)
    accepted = 0
    for prompt in PROMPTS:
        ids = target.tokenizer.encode(prompt)
        on = spec.generate(ids, max_tokens=25, logprobs=5, logit_bias={5: 2.5})
        off = plain.generate(ids, max_tokens=25, logprobs=5, logit_bias={5: 2.5})
        assert on.token_ids == off.token_ids
        accepted += on.stats.accepted
        assert [x.token_id for x in on.logprobs] == on.token_ids
        for i, (a, b) in enumerate(zip(on.logprobs, off.logprobs, strict=True)):
            assert a.logprob == pytest.approx(b.logprob, abs=LOGPROB_TOLERANCE)
            assert {t for t, _ in a.top} == {t for t, _ in b.top} and len(a.top) == 5
            # raw: before logit_bias (vLLM's raw_logprobs), by definition from a cache-free recomputation
            raw = torch.log_softmax(_logits(target.model, [*ids, *on.token_ids[:i]]), -1)
            assert a.logprob == pytest.approx(float(raw[a.token_id]), abs=LOGPROB_TOLERANCE)
            assert a.top[0][0] == int(raw.argmax())
    assert accepted > 0  # drafted tokens carried logprobs too


def test_streamed_chunks_carry_each_tokens_logprob(pair):
    target, draft = pair
    spec = SpeculativeGenerator(target, draft, num_speculative_tokens=3, adaptive=False)
    chunks = list(spec.stream("hello world", max_tokens=20, logprobs=0, stop=["zz"]))
    output = chunks[-1].output
    streamed = [c.logprob for c in chunks if c.token_id is not None]
    assert streamed == output.logprobs and all(lp.top == [] for lp in streamed)
    assert [lp.text_offset for lp in streamed] == [
        len(target.tokenizer.decode(output.token_ids[:i])) for i in range(len(output.token_ids))
    ]
    assert spec.generate("hello world", max_tokens=5).logprobs is None  # not asked, not computed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"logit_bias": {3: 101.0}}, "logit_bias values"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias keys"),
        ({"logit_bias": {10**6: 1.0}}, "logit_bias token ids"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_bad_adjustments_and_logprobs_are_refused(pair, options, message):
    target, draft = pair
    with pytest.raises(InvalidParameterError, match=message):
        SpeculativeGenerator(target, draft).generate("hello", max_tokens=3, **options)


def test_logprobs_on_the_native_kernels_are_exactly_plain_decodings(one_thread):
    """The GGUF blocks on the native kernels, whose rows are independent of the batch: drafted, corrected and
    bonus tokens carry bit-for-bit the logprobs (and top sets) of plain decoding, not merely close ones."""
    from verispec import load_model
    from verispec.kernels import native

    from real_models import smollm2_path

    if not native.available():
        pytest.skip("native kernels not compiled")
    model = load_model(str(smollm2_path()), quantization="gguf", progress=False)
    spec = SpeculativeGenerator(model, model, num_speculative_tokens=3, adaptive=False, max_seq_len=256)
    plain = SpeculativeGenerator(model, None, max_seq_len=256)
    for prompt in ("def fibonacci(n):", "The capital of France is"):
        on, off = (g.generate(prompt, max_tokens=30, logprobs=5) for g in (spec, plain))
        assert on.token_ids == off.token_ids and on.stats.accepted > 0
        assert [(x.logprob, x.top) for x in on.logprobs] == [(x.logprob, x.top) for x in off.logprobs]
