"""The acceptance rule against its definition, on vocabularies small enough to compute exactly.

Each check draws N samples with a fixed seed and bounds the total-variation distance between the
empirical and the exact distribution. For N = 20000 over <= 16 outcomes the sampling noise is about
0.5 * sum sqrt(p(1-p)/N) * 0.8 <= 0.012; the bound 0.03 is 2.5x that. The negative controls show
that plausible mistakes exceed the bound, so the tests can fail.
"""

from collections import Counter

import pytest
import torch

from verispec.decoding.acceptance import verify_greedy, verify_sampled, verify_tree
from verispec.decoding.sampling import SamplingParams, probs_from_logits, sample

from distributions import random_distribution, total_variation

SAMPLES = 20_000
TOLERANCE = 0.03
VOCAB = 12


def _emitted_first_token(draft, q, p, rng) -> int:
    n, token = verify_sampled(draft, q, p, rng)
    return int(draft[0]) if n >= 1 else token


def _run(k: int, p: torch.Tensor, q: torch.Tensor | None, seed: int, rule=verify_sampled):
    rng = torch.Generator().manual_seed(seed)
    firsts, outcomes = Counter(), Counter()
    for _ in range(SAMPLES):
        draft = sample(q, rng) if q is not None else torch.full((k,), 3)
        n, token = rule(draft, q, p, rng)
        outcomes[(n, token)] += 1
        firsts[int(draft[0]) if n >= 1 else token] += 1
    return firsts, outcomes


def _exact_outcomes(k: int, p: torch.Tensor, q: torch.Tensor) -> dict:
    """P(n accepted, next token): accept position i w.p. alpha_i, then residual or bonus."""
    exact, reach = {}, 1.0
    for i in range(k):
        alpha = float(torch.minimum(p[i], q[i]).sum())
        residual = (p[i] - q[i]).clamp_min(0)
        residual = residual / residual.sum()
        for token in range(p.shape[1]):
            exact[(i, token)] = reach * (1 - alpha) * float(residual[token])
        reach *= alpha
    for token in range(p.shape[1]):
        exact[(k, token)] = reach * float(p[k, token])
    return exact


def _random_pq(k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    p = torch.stack([random_distribution(VOCAB, g) for _ in range(k + 1)])
    q = torch.stack([random_distribution(VOCAB, g) for _ in range(k)])
    return p, q


@pytest.mark.parametrize("k", [1, 2, 3])
def test_emitted_token_and_accept_count_follow_the_exact_distribution(k):
    p, q = _random_pq(k, seed=k)
    firsts, outcomes = _run(k, p, q, seed=100 + k)
    assert total_variation(firsts, dict(enumerate(p[0].tolist())), SAMPLES) < TOLERANCE
    assert total_variation(outcomes, _exact_outcomes(k, p, q), SAMPLES) < TOLERANCE


def test_point_mass_drafter_still_gives_the_target_distribution():
    p, _ = _random_pq(2, seed=7)
    firsts, _ = _run(2, p, None, seed=8)
    assert total_variation(firsts, dict(enumerate(p[0].tolist())), SAMPLES) < TOLERANCE


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=4),
        SamplingParams(top_p=0.8, temperature=1),
    ],
)
def test_filtered_target_distribution_is_reproduced(params):
    g = torch.Generator().manual_seed(11)
    target_logits, draft_logits = torch.randn(3, VOCAB, generator=g) * 2, torch.randn(2, VOCAB, generator=g) * 2
    p, q = probs_from_logits(target_logits, params), probs_from_logits(draft_logits, params)
    firsts, outcomes = _run(2, p, q, seed=12)
    assert total_variation(firsts, dict(enumerate(p[0].tolist())), SAMPLES) < TOLERANCE
    assert total_variation(outcomes, _exact_outcomes(2, p, q), SAMPLES) < TOLERANCE


def _wrong_rule_resample_from_p(draft, q, p, rng):
    """A plausible bug: on rejection sample from p instead of norm(max(0, p - q))."""
    n, _ = verify_sampled(draft, q, p, rng)
    return n, int(sample(p[n], rng))


def test_negative_control_a_wrong_rule_is_detected():
    p, q = _random_pq(1, seed=3)
    firsts, _ = _run(1, p, q, seed=4, rule=_wrong_rule_resample_from_p)
    assert total_variation(firsts, dict(enumerate(p[0].tolist())), SAMPLES) > TOLERANCE


def test_greedy_accepts_the_matching_prefix_then_the_target_argmax():
    logits = torch.full((4, VOCAB), -1.0)
    logits[0, 5] = logits[1, 2] = logits[2, 9] = logits[3, 1] = 3.0
    assert verify_greedy(torch.tensor([5, 2, 9]), logits) == (3, 1)
    assert verify_greedy(torch.tensor([5, 7, 9]), logits) == (1, 2)
    assert verify_greedy(torch.tensor([0, 2, 9]), logits) == (0, 5)
    assert verify_greedy(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 5)


def test_greedy_is_the_one_hot_case_of_the_sampled_rule():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, VOCAB, generator=g)
    params = SamplingParams(temperature=0)
    p = probs_from_logits(logits, params)
    for draft in ([int(logits[0].argmax()), 0, 0], [1, 2, 3], logits[:3].argmax(-1).tolist()):
        d = torch.tensor(draft)
        q = torch.nn.functional.one_hot(d, VOCAB).float()
        assert verify_sampled(d, q, p, g) == verify_greedy(d, logits)


# A token tree over a vocabulary of 6: after the context, nodes 0 (token 1) and 1 (token 3); node 2 (token 2)
# after node 0; node 3 (token 4) after node 2; node 4 (token 1) after node 1. Rows: 0 the context, i + 1 node i.
TREE_TOKENS, TREE_PARENTS = [1, 3, 2, 4, 1], [-1, -1, 0, 2, 1]


def _tree_samples(p: torch.Tensor, choose_rule) -> Counter:
    """The first two emitted tokens of SAMPLES walks of the tree (a walk that stops emits one more token)."""
    generator = torch.Generator().manual_seed(7)
    pairs: Counter = Counter()
    for _ in range(SAMPLES):
        path, next_token = verify_tree(TREE_TOKENS, TREE_PARENTS, lambda row: choose_rule(p, row, generator))
        emitted = [TREE_TOKENS[row - 1] for row in path] + [next_token]
        pairs[tuple(emitted[:2])] += 1  # one token where the walk stopped at once
    return pairs


def _exact_pairs(p: torch.Tensor) -> dict:
    """The target's own law of the first two tokens (the second only where the first was drafted: else the walk
    stops after one)."""
    exact = {}
    for first in range(p.shape[1]):
        child = {1: 1, 3: 2}.get(first)  # the row after the first token, where the tree continues
        if child is None:
            exact[(first,)] = float(p[0, first])
            continue
        for second in range(p.shape[1]):
            exact[(first, second)] = float(p[0, first] * p[child, second])
    return exact


def test_a_token_tree_walk_gives_the_target_distribution():
    """Sampling the target's token at each node and following the matching child: the first two tokens follow the
    target's law exactly (within TOLERANCE over SAMPLES walks)."""
    generator = torch.Generator().manual_seed(3)
    p = torch.stack([random_distribution(6, generator) for _ in range(len(TREE_TOKENS) + 1)])
    pairs = _tree_samples(p, lambda p, row, g: int(sample(p[row], g)))
    assert total_variation(pairs, _exact_pairs(p), SAMPLES) < TOLERANCE


def test_negative_control_a_tree_walk_that_favours_drafted_children_is_detected():
    """A wrong rule, taking the first drafted child (token 1) outright half the time, is far from the target's
    law."""
    generator = torch.Generator().manual_seed(3)
    p = torch.stack([random_distribution(6, generator) for _ in range(len(TREE_TOKENS) + 1)])

    def biased(p, row, g):
        if row == 0 and torch.rand(1, generator=g).item() < 0.5:
            return TREE_TOKENS[0]
        return int(sample(p[row], g))

    pairs = _tree_samples(p, biased)
    assert total_variation(pairs, _exact_pairs(p), SAMPLES) > TOLERANCE


def test_a_greedy_tree_walk_follows_the_argmax_through_the_tree():
    choices = {0: 3, 2: 1, 5: 9}  # row -> the target's argmax there
    path, next_token = verify_tree(TREE_TOKENS, TREE_PARENTS, lambda row: choices[row])
    assert path == [2, 5] and next_token == 9  # node 1 (token 3), node 4 (token 1), then the target's 9
    path, next_token = verify_tree(TREE_TOKENS, TREE_PARENTS, lambda row: 0)
    assert path == [] and next_token == 0
    path, next_token = verify_tree([], [], lambda row: 5)
    assert path == [] and next_token == 5
