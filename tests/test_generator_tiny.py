"""The speculative loop on tiny random models: greedy identity and sampled distribution.

The greedy reference is an independent decoder written here: it recomputes the whole sequence
without a KV cache at every step, so it shares neither the cache logic nor the loop with verispec.
"""

from collections import Counter

import pytest
import torch

from verispec import SpeculativeGenerator
from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams, keyed_draw, probs_from_logits
from verispec.engine.draft_model import BatchedDrafter
from verispec.engine.drafting import DraftCost, Proposal
from verispec.engine.prompt_lookup import ngram_lookup
from verispec.models.tokenizer import Tokenizer
from verispec.testing import EOS_TEXT, tiny_config, tiny_loaded, tiny_model, tiny_pair, truncated_copy, word_tokenizer

from distributions import total_variation

PROMPTS = ["def add(a, b):", "hello world", "x"]


def reference_greedy(model, prompt_ids, max_tokens, stop_ids) -> list[int]:
    seq, out = list(prompt_ids), []
    for _ in range(max_tokens):
        logits = model(torch.tensor([seq], device=model.device), model.new_cache(max_len=len(seq)), [0])[0, -1]
        token = int(logits.argmax())
        if token in stop_ids:
            break
        seq.append(token)
        out.append(token)
    return out


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_output_equals_plain_greedy_for_every_k(pair, k):
    target, draft = pair
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=k, adaptive=False)
    for prompt in PROMPTS:
        ids = target.tokenizer.encode(prompt)
        expected = reference_greedy(target.model, ids, 40, target.tokenizer.stop_token_ids)
        out = generator.generate(prompt, max_tokens=40)
        assert out.token_ids == expected
        assert out.stats.accepted > 0  # the draft agrees sometimes: the accept path really ran
        assert out.stats.accepted < out.stats.drafted  # and disagrees sometimes: rejections ran too


def reference_sampled(model, prompt_ids, max_tokens, stop_ids, params, seed) -> list[int]:
    """Plain sampled decoding, cache-free: the token at each position is the keyed draw (decoding/noise.py) of the
    request's seed there, from the filtered distribution of the whole sequence's last logits."""
    seq, out, noise = list(prompt_ids), [], KeyedNoise(seed, model.config.vocab_size)
    for _ in range(max_tokens):
        logits = model(torch.tensor([seq], device=model.device), model.new_cache(max_len=len(seq)), [0])[0, -1]
        token = keyed_draw(logits, params, noise, len(seq))
        if token in stop_ids:
            break
        seq.append(token)
        out.append(token)
    return out


@pytest.mark.parametrize(
    ("method", "k", "adaptive", "trees"),
    [("draft", 1, False, False), ("draft", 4, False, False), ("draft", 3, True, False), ("hybrid", 3, True, False),
     ("ngram", 5, False, False), ("suffix", 3, True, False), ("suffix", 3, False, True)],
)  # fmt: skip
def test_seeded_sampled_output_equals_plain_sampled_output_for_every_method(pair, method, k, adaptive, trees):
    """Sampled with a seed, speculative decoding emits the tokens plain decoding draws with that seed, whatever
    drafts them, how many and how many are accepted: the same text with speculation on or off, at any k. Drafts are
    accepted and rejected along the way; another seed gives another text (so the equality is not a coincidence of
    a peaked model)."""
    target, draft = pair
    generator = SpeculativeGenerator(
        target, None if method == "ngram" else draft, num_speculative_tokens=k, speculative_method=method,
        adaptive=adaptive, token_trees=trees,
    )  # fmt: skip
    params = SamplingParams(temperature=0.6, top_k=40, top_p=0.95)
    stops = target.tokenizer.stop_token_ids
    accepted = rejected = 0
    texts = set()
    for prompt, seed in zip([*PROMPTS, REPETITIVE], (2**64 - 5, -7, 3, 11), strict=True):
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=30, temperature=0.6, top_k=40, top_p=0.95, seed=seed)
        assert out.token_ids == reference_sampled(target.model, ids, 30, stops, params, seed), (prompt, seed)
        accepted, rejected = accepted + out.stats.accepted, rejected + out.stats.drafted - out.stats.accepted
        other = generator.generate(ids, max_tokens=30, temperature=0.6, top_k=40, top_p=0.95, seed=seed + 1)
        texts |= {tuple(out.token_ids), tuple(other.token_ids)}
    assert (accepted > 0 and rejected > 0) or adaptive  # the adaptive policy may find drafting does not pay here
    assert len(texts) > 4


def test_plain_decoding_through_the_same_loop_matches_the_reference(pair):
    target, _ = pair
    generator = SpeculativeGenerator(target, None)
    ids = target.tokenizer.encode(PROMPTS[0])
    out = generator.generate(ids, max_tokens=30)
    assert out.token_ids == reference_greedy(target.model, ids, 30, target.tokenizer.stop_token_ids)
    assert out.stats.target_passes == 30 and out.stats.mean_accepted_length == 1.0


def test_draft_equal_to_target_accepts_everything(pair):
    target, _ = pair
    clone = tiny_loaded(truncated_copy(target.model, target.model.config.num_layers), target.tokenizer)
    out = SpeculativeGenerator(target, clone, num_speculative_tokens=5, adaptive=False).generate(
        PROMPTS[0], max_tokens=36
    )
    assert out.stats.accepted == out.stats.drafted > 0 and out.stats.rejected == 0
    assert out.stats.target_passes == 6  # 36 tokens, 6 per pass
    assert out.token_ids == reference_greedy(target.model, target.tokenizer.encode(PROMPTS[0]), 36, set())


class AlwaysWrongDrafter:
    """A proposer (engine/drafting.py) that drafts, at every position, a token the target's greedy choice is not: a
    new method is a class with these members."""

    looks_up, drafter = False, None
    spent = DraftCost(modelled=True)  # it runs a model (the target) to pick its wrong tokens

    def __init__(self, target):
        self.target = target

    def lag(self, slot, tokens, model_tokens=None):
        return 0

    def admit(self, slot, partition):
        pass

    def finished(self, slot, output, partition):
        pass

    def forget(self, history=True, prompts=True):
        pass

    def propose(self, jobs):
        return [self._wrong(job.tokens, job.k) for job in jobs]

    def _wrong(self, tokens, k):
        model = self.target.model
        seq, drafted = list(tokens), []
        for _ in range(k):
            best = int(model(torch.tensor([seq]), model.new_cache(max_len=len(seq)), [0])[0, -1].argmax())
            drafted.append((best + 1) % model.config.vocab_size)
            seq.append(best)
        return Proposal(torch.tensor(drafted))


def test_always_wrong_draft_accepts_nothing_and_changes_nothing(pair):
    target, draft = pair
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=3, adaptive=False)
    generator.engine.proposer = AlwaysWrongDrafter(target)
    out = generator.generate(PROMPTS[1], max_tokens=20)
    assert out.stats.accepted == 0 and out.stats.drafted > 0
    assert out.stats.rejected == out.stats.drafted_by_position[0]  # every round that drafted ended on a rejection
    assert out.token_ids == reference_greedy(target.model, target.tokenizer.encode(PROMPTS[1]), 20, set())


def test_eos_inside_a_drafted_block_cuts_where_plain_decoding_does(pair):
    target, draft = pair
    prompt_ids = target.tokenizer.encode(PROMPTS[0])
    free_run = reference_greedy(target.model, prompt_ids, 40, set())
    stop_token = free_run[13]  # its first occurrence ends generation
    cut = free_run.index(stop_token)
    tokenizer = Tokenizer(target.tokenizer.raw, EOS_TEXT, extra_stop_ids=(stop_token,))
    clone = tiny_loaded(truncated_copy(target.model, 4), tokenizer)  # accepts all: EOS lands mid-block
    for drafter_model in (clone, tiny_loaded(draft.model, tokenizer)):
        generator = SpeculativeGenerator(
            tiny_loaded(target.model, tokenizer), drafter_model, num_speculative_tokens=6, adaptive=False
        )
        out = generator.generate(prompt_ids, max_tokens=40)
        assert out.token_ids == free_run[:cut]
        assert out.finish_reason == "stop"
        assert generator.engine.cache.lengths[0] <= len(prompt_ids) + cut + 1


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 11])
def test_max_tokens_cuts_exactly(pair, max_tokens):
    target, draft = pair
    clone = tiny_loaded(truncated_copy(target.model, 4), target.tokenizer)
    out = SpeculativeGenerator(target, clone, num_speculative_tokens=4, adaptive=False).generate(
        PROMPTS[2], max_tokens=max_tokens
    )
    expected = reference_greedy(target.model, target.tokenizer.encode(PROMPTS[2]), max_tokens, set())
    assert out.token_ids == expected and out.finish_reason == "length"


def test_stop_string_inside_a_drafted_block(pair):
    target, _ = pair
    clone = tiny_loaded(truncated_copy(target.model, 4), target.tokenizer)
    plain = SpeculativeGenerator(target, None).generate(PROMPTS[0], max_tokens=30)
    stop = plain.text[9:11]
    spec = SpeculativeGenerator(target, clone, num_speculative_tokens=6, adaptive=False).generate(
        PROMPTS[0], max_tokens=30, stop=[stop]
    )
    plain_stopped = SpeculativeGenerator(target, None).generate(PROMPTS[0], max_tokens=30, stop=[stop])
    assert spec.text == plain_stopped.text == plain.text[: plain.text.index(stop)]
    assert spec.token_ids == plain_stopped.token_ids and spec.finish_reason == "stop"


def test_streamed_text_concatenates_to_the_final_text(pair):
    target, draft = pair
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=3, adaptive=False)
    chunks = list(generator.stream(PROMPTS[0], max_tokens=25))
    assert "".join(c.text for c in chunks) == chunks[-1].output.text
    assert [c.token_id for c in chunks if c.token_id is not None] == chunks[-1].output.token_ids


# ---- sampled decoding: distribution of the first tokens ------------------------------------------------------
VOCAB = 7
RUNS = 4000
TOLERANCE = 0.06  # TV over 49 outcomes of the first two tokens; sampling noise ~0.02 at N = 4000


def _exact_first_two(model, prompt_ids, params) -> dict:
    def probs(seq):
        logits = model(torch.tensor([seq], device=model.device), model.new_cache(max_len=len(seq)), [0])[0, -1]
        return probs_from_logits(logits, params)

    first = probs(prompt_ids)
    return {(a, b): float(first[a]) * float(pb) for a in range(VOCAB) for b, pb in enumerate(probs([*prompt_ids, a]))}


# the default run checks each way of drafting once, unfiltered; the filtered law of each, the draft's window, the
# policy's k beside lookups and token trees (each 8-42 s on two cores) run with the slow set
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), pytest.param(SamplingParams(temperature=0.8, top_k=3, top_p=0.9), marks=SLOW)],
)
@pytest.mark.parametrize(
    "method, adaptive, prompt_ids, window",
    [
        ("draft", False, [0, 1, 2], 0),
        ("hybrid", True, [0, 1, 2, 0, 1, 2, 0, 1], 0),  # hybrid: the prompt repeats
        # the draft reads 4 + 2 of the 11 prompt tokens
        pytest.param("draft", False, [5, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3], 2, marks=SLOW),
        ("suffix", False, [0, 1, 2, 0, 1, 2, 0, 1], 0),  # lookups in the repeating prompt, the draft elsewhere
        # the policy's k for the draft; lookups even at k = 0
        pytest.param("suffix", True, [0, 1, 2, 0, 1, 2, 0, 1], 0, marks=SLOW),
        # "5 0 1" went on two ways: token trees, the lookups alone (the draft model would win a 50:50 lookup)
        pytest.param("suffix-trees", False, [5, 0, 1, 2, 5, 0, 1, 3, 5, 0, 1], 0, marks=SLOW),
    ],
)
def test_sampled_speculative_decoding_follows_the_target_distribution(params, method, adaptive, prompt_ids, window):
    tokenizer = word_tokenizer(VOCAB)
    config = tiny_config(vocab_size=VOCAB)
    target_model = tiny_model(config, seed=3, scale=1.0, residual_gain=0.5)
    draft_model = tiny_model(tiny_config(vocab_size=VOCAB, hidden_size=32, num_layers=1), seed=4)
    tokenizer.stop_token_ids = frozenset()  # no EOS: the first two tokens always exist
    target = tiny_loaded(target_model, tokenizer)
    exact = _exact_first_two(target_model, prompt_ids, params)
    trees_on = method.endswith("-trees")
    if trees_on and params.top_k:
        pytest.skip("a filtered distribution takes the same tree walk; one sampled tree case bounds the suite's time")
    draft = None if trees_on else tiny_loaded(draft_model, tokenizer)
    generator = SpeculativeGenerator(
        target, draft, num_speculative_tokens=3,
        speculative_method=method.removesuffix("-trees"), adaptive=adaptive, draft_window=window,
        token_trees=trees_on,
    )  # fmt: skip
    trees, settle = [], generator.engine.verifier.settle  # a round whose verdict has a path verified a tree
    generator.engine.verifier.settle = lambda *args: (args[-1][2] is not None and trees.append(1)) or settle(*args)
    counts, accepted, drafted = Counter(), 0, 0
    for seed in range(RUNS):
        # more tokens leave a lookup rows for branches past its chain (of 2 x the match); the first two are counted
        out = generator.generate(prompt_ids, max_tokens=10 if trees_on else 2, temperature=params.temperature,
                                 top_k=params.top_k, top_p=params.top_p, seed=seed)  # fmt: skip
        counts[tuple(out.token_ids[:2])] += 1
        accepted, drafted = accepted + out.stats.accepted, drafted + out.stats.drafted
    assert drafted > 0 and bool(trees) == trees_on
    # a looked-up token may be one the target rarely draws (or, under top-k, never), and the adaptive policy soon
    # stops drafting where little is accepted: only the draft model's coupled drafts must be accepted here
    assert accepted > 0 or method != "draft"
    assert total_variation(counts, exact, RUNS) < TOLERANCE
    # the test can fail: the draft's own distribution is measurably different at this sample size
    assert total_variation(counts, _exact_first_two(draft_model, prompt_ids, params), RUNS) > TOLERANCE


def _exact_third(model, prompt_ids, params) -> dict:
    """The exact marginal of the third generated token: sum over the first two of p(a) p(b | a) p(c | a, b)."""

    def probs(seq):
        logits = model(torch.tensor([seq], device=model.device), model.new_cache(max_len=len(seq)), [0])[0, -1]
        return probs_from_logits(logits, params)

    third: dict[int, float] = {}
    first = probs(prompt_ids)
    for a in range(VOCAB):
        second = probs([*prompt_ids, a])
        for b in range(VOCAB):
            for c, pc in enumerate(probs([*prompt_ids, a, b])):
                third[c] = third.get(c, 0.0) + float(first[a]) * float(second[b]) * float(pc)
    return third


@SLOW
def test_the_third_token_of_a_three_token_draft_follows_the_target_distribution():
    """Every round drafts k = 3 (max_tokens 4 leaves room for it), so the third token is the last drafted one of
    the first round whenever the first two were accepted: its marginal checks acceptance deep in a draft."""
    runs, tolerance = 3000, 0.05  # TV over 7 outcomes; sampling noise ~0.02 at N = 3000
    tokenizer = word_tokenizer(VOCAB)
    tokenizer.stop_token_ids = frozenset()
    target_model = tiny_model(tiny_config(vocab_size=VOCAB), seed=3, scale=1.0, residual_gain=0.5)
    draft_model = tiny_model(tiny_config(vocab_size=VOCAB, hidden_size=32, num_layers=1), seed=4)
    params = SamplingParams(temperature=1.0)
    generator = SpeculativeGenerator(
        tiny_loaded(target_model, tokenizer), tiny_loaded(draft_model, tokenizer), num_speculative_tokens=3,
        adaptive=False, speculative_method="draft",
    )  # fmt: skip
    prompt_ids = [0, 1, 2]
    counts, deep = Counter(), 0
    for seed in range(runs):
        out = generator.generate(prompt_ids, max_tokens=4, temperature=1.0, seed=seed)
        counts[out.token_ids[2]] += 1
        deep += out.stats.accepted_by_position[2] if len(out.stats.accepted_by_position) > 2 else 0
    assert deep > runs // 10  # the third drafted token was accepted often: the deep path really ran
    assert total_variation(counts, _exact_third(target_model, prompt_ids, params), runs) < tolerance
    # the test can fail: the draft's own third-token marginal is measurably different
    assert total_variation(counts, _exact_third(draft_model, prompt_ids, params), runs) > tolerance


# ---- prompt lookup (n-gram) drafter: a point-mass drafter through the same rule -------------------------------
REPETITIVE = "abc abc abc abc abd abc ab"


@pytest.mark.parametrize("k", [1, 3, 6])
def test_ngram_greedy_output_equals_plain_greedy(pair, k):
    target, _ = pair
    generator = SpeculativeGenerator(target, None, num_speculative_tokens=k, speculative_method="ngram", adaptive=False)
    drafted = 0
    for prompt in [*PROMPTS, REPETITIVE]:
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=40)
        assert out.token_ids == reference_greedy(target.model, ids, 40, target.tokenizer.stop_token_ids)
        drafted += out.stats.drafted
    assert drafted > 0


def test_ngram_lookup_proposes_what_followed_the_latest_match():
    assert ngram_lookup([1, 2, 3, 4, 1, 2, 5, 9, 1, 2], 3, max_ngram=2) == [5, 9, 1]
    assert ngram_lookup([7, 8, 9], 3, max_ngram=2) == []
    assert ngram_lookup([4, 5, 6, 4], 2, max_ngram=2) == [5, 6]  # falls back to n = 1


def test_hybrid_uses_lookup_where_the_context_repeats_and_the_model_elsewhere(pair, monkeypatch):
    target, draft = pair
    generator = SpeculativeGenerator(
        target, draft, num_speculative_tokens=4, speculative_method="hybrid", adaptive=False
    )
    used = Counter()
    model_propose = BatchedDrafter.propose

    def counting(self, *args):
        used["model"] += len(args[0])
        return model_propose(self, *args)

    monkeypatch.setattr(BatchedDrafter, "propose", counting)
    for prompt in [REPETITIVE, PROMPTS[0]]:
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=40)
        assert out.token_ids == reference_greedy(target.model, ids, 40, target.tokenizer.stop_token_ids)
        used["rounds"] += out.stats.target_passes
    assert 0 < used["model"] < used["rounds"]  # both the model and the free lookup drafted


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"draft_vocab": -1}, "draft_vocab must be >= 0"),
        ({"speculative_method": "bogus"}, "unknown speculative method"),
    ],
)
def test_bad_options_are_refused_before_any_model_loads(options, message):
    from verispec.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match=message):  # not ModelLoadError: the files are never opened
        SpeculativeGenerator("no-such-target.gguf", "no-such-draft.gguf", progress=False, **options)
