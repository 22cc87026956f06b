"""Adaptive k: the choice follows the measured costs, and whatever it chooses, the output is plain decoding's."""

import pytest
from test_generator_tiny import PROMPTS, reference_greedy

from verispec import SpeculativeGenerator
from verispec.adaptive import AdaptiveK
from verispec.drafters import DraftModelDrafter, Proposal
from verispec.testing import tiny_pair


def measured(k_max: int, target: dict[int, float], draft: float, accepted_of: tuple[int, int]) -> AdaptiveK:
    """An AdaptiveK that has seen each pass size in `target` 60 times; rounds that draft
    accepted_of[1] tokens accept accepted_of[0] of them."""
    adaptive = AdaptiveK(k_max)
    for _ in range(60):
        for n, seconds in target.items():
            drafted = n - 1
            adaptive.record(drafted, min(drafted, accepted_of[0]), draft * drafted, seconds)
    return adaptive


def test_first_rounds_measure_plain_decoding_then_the_longest_draft():
    adaptive = AdaptiveK(4)
    assert adaptive.choose() == 0
    adaptive.record(0, 0, 0.0, 0.1)
    assert adaptive.choose() == 4
    adaptive.record(4, 4, 0.04, 0.2)
    assert adaptive.choose() in range(5)


def test_cheap_draft_and_verify_with_high_acceptance_drafts_the_most():
    adaptive = measured(4, {1: 0.100, 5: 0.110}, draft=0.005, accepted_of=(4, 4))
    assert adaptive.acceptance > 0.95
    assert adaptive.choose() == 4


def test_nothing_accepted_means_plain_decoding():
    adaptive = measured(4, {1: 0.100, 5: 0.110}, draft=0.005, accepted_of=(0, 4))
    assert adaptive.acceptance < 0.1
    assert adaptive.choose() == 0


def test_a_draft_as_slow_as_the_target_never_pays():
    adaptive = measured(4, {1: 0.100, 5: 0.300}, draft=0.100, accepted_of=(3, 4))
    assert adaptive.choose() == 0


def test_an_expensive_verify_pass_shortens_the_draft():
    # verify cost grows fast past 3 tokens: k = 2 beats k = 4 at this acceptance
    adaptive = measured(4, {1: 0.100, 3: 0.120, 5: 0.400}, draft=0.01, accepted_of=(2, 2))
    assert adaptive.choose() == 2


def test_unmeasured_pass_sizes_are_interpolated():
    adaptive = measured(4, {1: 0.100, 5: 0.300}, draft=0.01, accepted_of=(1, 4))
    assert adaptive.target(3) == pytest.approx(0.200)
    assert adaptive.target(1) == pytest.approx(0.100)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.parametrize("method", ["draft", "hybrid"])
def test_adaptive_greedy_output_equals_plain_greedy(pair, method):
    target, draft = pair
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=5, speculative_method=method)
    chosen = set()
    original = generator.adaptive.choose

    def spy():
        k = original()
        chosen.add(k)
        return k

    generator.adaptive.choose = spy
    for prompt in [*PROMPTS, "abc abc abc abc abd abc ab"]:
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=40)
        assert out.token_ids == reference_greedy(target.model, ids, 40, target.tokenizer.stop_token_ids)
    assert 0 in chosen and len(chosen) >= 2  # it really varied k, plain rounds included


class WrongModelDrafter(DraftModelDrafter):
    """Runs the draft model (so drafting costs what it really costs) and proposes other tokens."""

    def propose(self, tokens, k, params, rng) -> Proposal:
        proposal = super().propose(tokens, k, params, rng)
        return Proposal((proposal.tokens + 1) % self.head.size, None)


def test_a_draft_that_is_always_wrong_is_soon_switched_off(pair):
    target, draft = pair
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=4)
    generator.drafter = WrongModelDrafter(draft.model, target.model.config.vocab_size, generator.max_seq_len)
    out = generator.generate(PROMPTS[1], max_tokens=120)
    assert out.stats.accepted == 0 and out.stats.drafted > 0
    assert out.token_ids == reference_greedy(target.model, target.tokenizer.encode(PROMPTS[1]), 120, set())
    # after the first rounds nearly every round is a plain step (fixed k = 4 would draft 4 per round)
    assert out.stats.drafted < 0.5 * out.stats.target_passes
