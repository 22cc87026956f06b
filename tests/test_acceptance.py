"""The acceptance rule against its definition, on vocabularies small enough to compute exactly.

Each check draws N samples with a fixed seed and bounds the total-variation distance between the
empirical and the exact distribution. For N = 20000 over <= 16 outcomes the sampling noise is about
0.5 * sum sqrt(p(1-p)/N) * 0.8 <= 0.012; the bound 0.03 is 2.5x that. The negative controls show
that plausible mistakes exceed the bound, so the tests can fail.
"""

import math
from collections import Counter

import pytest
import torch

from verispec.decoding.acceptance import verify_chain, verify_greedy, verify_tree
from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams, keyed_draw, probs_from_logits

from distributions import random_distribution, total_variation

SAMPLES = 20_000
TOLERANCE = 0.03
VOCAB = 12


def _keyed_rounds(p: torch.Tensor, q: torch.Tensor | None, rule=verify_chain):
    """SAMPLES rounds, one per seed: k drafts (the draft's keyed draws from q, racing the same noise as the target,
    or the point mass 3 without q), verified against the target's keyed draws from p's rows. Returns the counts of
    the first two emitted tokens and of how many drafts were accepted, and how often the emitted tokens differ
    from plain decoding's (k = 0, one token a round) with the same seed."""
    k = p.shape[0] - 1
    pairs, accepted, differs = Counter(), Counter(), 0
    for seed in range(SAMPLES):
        noise = KeyedNoise(seed, VOCAB)
        draft = [noise.choose(q[i], i) if q is not None else 3 for i in range(k)]
        n, token = rule(draft, lambda row, noise=noise: noise.choose(p[row], row))
        emitted = [*draft[:n], token]
        pairs[tuple(emitted[:2])] += 1
        accepted[n] += 1
        differs += emitted != [noise.choose(p[i], i) for i in range(n + 1)]
    return pairs, accepted, differs


def _random_pq(k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    p = torch.stack([random_distribution(VOCAB, g) for _ in range(k + 1)])
    q = torch.stack([random_distribution(VOCAB, g) for _ in range(k)])
    return p, q


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=4),
        SamplingParams(top_p=0.8, temperature=1),
    ],
)
def test_a_keyed_draw_follows_its_distribution(params):
    g = torch.Generator().manual_seed(1)
    p = probs_from_logits(torch.randn(VOCAB, generator=g) * 2, params)
    counts = Counter(KeyedNoise(seed, VOCAB).choose(p, 7) for seed in range(SAMPLES))
    assert total_variation(counts, dict(enumerate(p.tolist())), SAMPLES) < TOLERANCE
    # the same (seed, position) gives the same draw; another position is another draw
    assert KeyedNoise(5, VOCAB).choose(p, 7) == KeyedNoise(5, VOCAB).choose(p, 7)
    assert len({KeyedNoise(5, VOCAB).choose(p, position) for position in range(50)}) > 1


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=4),
        SamplingParams(top_p=0.8, temperature=1),
    ],
)
def test_the_draw_from_logits_follows_the_filtered_distribution(params):
    """What decoding runs (keyed_draw: the race over the filtered logits, temperature scaling the noise, no
    softmax) follows the distribution probs_from_logits gives, and is the race over those probabilities with the
    same noise (up to float rounding between the two forms)."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(VOCAB, generator=g) * 2
    p = probs_from_logits(logits, params)
    draws = [keyed_draw(logits, params, KeyedNoise(seed, VOCAB), 7) for seed in range(SAMPLES)]
    assert total_variation(Counter(draws), dict(enumerate(p.tolist())), SAMPLES) < TOLERANCE
    same = sum(draw == KeyedNoise(seed, VOCAB).choose(p, 7) for seed, draw in enumerate(draws))
    assert same >= SAMPLES - 2
    assert not {draw for draw in draws if p[draw] == 0}  # never a token the filters dropped


def test_the_noise_is_finite_and_exponential_over_a_large_vocabulary():
    """Every key's log E is finite (a uniform of exactly 0 or 1 would give an infinite key), and E's moments and
    median are Exp(1)'s."""
    noise = KeyedNoise(11, 151_936)
    logs = torch.cat([noise.log_exponentials(position) for position in range(8)])
    assert torch.isfinite(logs).all()
    draws = logs.double().exp()
    assert abs(float(draws.mean()) - 1) < 0.005 and abs(float(draws.std()) - 1) < 0.005
    assert abs(float(draws.median()) - math.log(2)) < 0.005


def test_negative_control_a_uniform_race_is_detected():
    """Racing p against uniforms instead of exponentials (argmax p / U) is a plausible bug far from p's law."""
    g = torch.Generator().manual_seed(1)
    p = random_distribution(VOCAB, g)
    counts = Counter()
    for seed in range(SAMPLES):
        uniforms = torch.rand(VOCAB, generator=torch.Generator().manual_seed(seed))
        counts[int((p / uniforms).argmax())] += 1
    assert total_variation(counts, dict(enumerate(p.tolist())), SAMPLES) > TOLERANCE


@pytest.mark.parametrize("k", [1, 2, 3])
def test_keyed_verification_emits_the_targets_law_and_plain_decodings_tokens(k):
    """Whatever the draft (its own keyed draws, or a fixed token), the first two emitted tokens follow the target's
    rows exactly, and every round emits exactly the tokens plain decoding draws with that seed."""
    p, q = _random_pq(k, seed=k)
    for drafts in (q, None):
        pairs, accepted, differs = _keyed_rounds(p, drafts)
        two = Counter({pair: n for pair, n in pairs.items() if len(pair) == 2})
        ones = SAMPLES - sum(two.values())
        firsts = Counter()
        for pair, n in pairs.items():
            firsts[pair[0]] += n
        assert total_variation(firsts, dict(enumerate(p[0].tolist())), SAMPLES) < TOLERANCE
        if ones < SAMPLES * 3 // 4:  # the second token, where the first was accepted, follows p[1] (rows independent)
            seconds = Counter()
            for pair, n in two.items():
                seconds[pair[1]] += n
            assert total_variation(seconds, dict(enumerate(p[1].tolist())), SAMPLES - ones) < 2 * TOLERANCE
        assert differs == 0


def test_coupled_drafts_are_accepted_about_as_often_as_by_the_rejection_rule():
    """A draft racing the target's noise is accepted with a chance close to sum min(p, q) (Leviathan et al.'s, the
    most any rule can accept), far above the sum p q of a draft drawn with other noise."""
    p, q = _random_pq(1, seed=21)
    _, accepted, _ = _keyed_rounds(p, q)
    coupled = accepted[1] / SAMPLES
    best, independent = float(torch.minimum(p[0], q[0]).sum()), float((p[0] * q[0]).sum())
    assert coupled <= best + TOLERANCE
    assert coupled > independent + 0.1 and coupled > best - 0.15


def _wrong_rule_accepts_likely_drafts(draft, choose):
    """A plausible bug: a draft is also kept where the target's draw differs but falls in the first half of the
    vocabulary (a "close enough" rule)."""
    n = 0
    while n < len(draft) and (draft[n] == choose(n) or choose(n) < VOCAB // 2):
        n += 1
    return n, choose(n)


def test_negative_control_a_wrong_keyed_rule_is_detected():
    p, q = _random_pq(1, seed=3)
    pairs, _, differs = _keyed_rounds(p, q, rule=_wrong_rule_accepts_likely_drafts)
    firsts = Counter()
    for pair, n in pairs.items():
        firsts[pair[0]] += n
    assert total_variation(firsts, dict(enumerate(p[0].tolist())), SAMPLES) > TOLERANCE and differs > 0


def test_greedy_accepts_the_matching_prefix_then_the_target_argmax():
    logits = torch.full((4, VOCAB), -1.0)
    logits[0, 5] = logits[1, 2] = logits[2, 9] = logits[3, 1] = 3.0
    assert verify_greedy(torch.tensor([5, 2, 9]), logits) == (3, 1)
    assert verify_greedy(torch.tensor([5, 7, 9]), logits) == (1, 2)
    assert verify_greedy(torch.tensor([0, 2, 9]), logits) == (0, 5)
    assert verify_greedy(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 5)


def test_greedy_is_the_chain_rule_with_the_argmax():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, VOCAB, generator=g)
    for draft in ([int(logits[0].argmax()), 0, 0], [1, 2, 3], logits[:3].argmax(-1).tolist()):
        expected = verify_greedy(torch.tensor(draft), logits)
        assert verify_chain(draft, lambda row: int(logits[row].argmax())) == expected


# A token tree over a vocabulary of 6: after the context, nodes 0 (token 1) and 1 (token 3); node 2 (token 2)
# after node 0; node 3 (token 4) after node 2; node 4 (token 1) after node 1. Rows: 0 the context, i + 1 node i.
TREE_TOKENS, TREE_PARENTS = [1, 3, 2, 4, 1], [-1, -1, 0, 2, 1]


TREE_DEPTHS = [0, 1, 1, 2, 3, 2]  # per row: how far past the next position it predicts (the engine's positions)


def _tree_samples(p: torch.Tensor, choose_rule) -> Counter:
    """The first two emitted tokens of SAMPLES walks of the tree, one per seed (a walk that stops emits one more
    token); `choose_rule(p, row, noise)` is the target's token at a row."""
    pairs: Counter = Counter()
    for seed in range(SAMPLES):
        noise = KeyedNoise(seed, p.shape[1])
        path, next_token = verify_tree(TREE_TOKENS, TREE_PARENTS, lambda row, noise=noise: choose_rule(p, row, noise))
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


def _keyed(p: torch.Tensor, row: int, noise: KeyedNoise) -> int:
    """The target's keyed draw at a row: siblings predict one position and share its noise, as in the engine."""
    return noise.choose(p[row], TREE_DEPTHS[row])


def test_a_token_tree_walk_gives_the_target_distribution():
    """Drawing the target's token at each node and following the matching child: the first two tokens follow the
    target's law exactly (within TOLERANCE over SAMPLES walks)."""
    generator = torch.Generator().manual_seed(3)
    p = torch.stack([random_distribution(6, generator) for _ in range(len(TREE_TOKENS) + 1)])
    pairs = _tree_samples(p, _keyed)
    assert total_variation(pairs, _exact_pairs(p), SAMPLES) < TOLERANCE


def test_negative_control_a_tree_walk_that_favours_drafted_children_is_detected():
    """A wrong rule, taking the first drafted child (token 1) outright half the time, is far from the target's
    law."""
    generator = torch.Generator().manual_seed(3)
    p = torch.stack([random_distribution(6, generator) for _ in range(len(TREE_TOKENS) + 1)])

    def biased(p, row, noise):
        if row == 0 and float(noise.log_exponentials(99)[0]) < math.log(0.7):  # about half the time
            return TREE_TOKENS[0]
        return _keyed(p, row, noise)

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


def test_a_batch_verdict_is_each_sequences_own():
    """verify_batch (the engine's: every row's choice found for the whole pass at once) gives, on random batches of
    chains and trees, the verdicts verify_greedy, verify_chain and verify_tree give one sequence at a time."""
    from verispec.decoding.acceptance import verify_batch

    g = torch.Generator().manual_seed(9)
    for _ in range(200):
        drafts, parents, choices, expected = [], [], [], []
        for _ in range(int(torch.randint(1, 9, (1,), generator=g))):
            k = int(torch.randint(0, 6, (1,), generator=g))
            draft = torch.randint(0, 4, (k,), generator=g).tolist()
            chosen = torch.randint(0, 4, (k + 1,), generator=g).tolist()
            tree = None if k < 2 or torch.rand(1, generator=g) < 0.5 else [-1] + [
                int(torch.randint(-1, j, (1,), generator=g)) for j in range(k - 1)]  # fmt: skip
            drafts.append(draft), parents.append(tree), choices.append(chosen)
            if tree is None:
                logits = torch.nn.functional.one_hot(torch.tensor(chosen), 4).float()
                accepted, token = verify_greedy(torch.tensor(draft, dtype=torch.long), logits)
                assert (accepted, token) == verify_chain(draft, chosen.__getitem__)
                expected.append((accepted, token, None))
            else:
                path, token = verify_tree(draft, tree, chosen.__getitem__)
                expected.append((len(path), token, path))
        assert verify_batch(drafts, parents, choices) == expected
