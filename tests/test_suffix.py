"""Suffix drafting: the native suffix trie against a brute-force reading of the same sequences, and the suffix
drafter through the engine (greedy output equal to plain decoding, earlier requests' outputs used, lookups
counted)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from verispec import SpeculativeGenerator
from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams
from verispec.engine.drafting import DraftJob, LookupPricing
from verispec.engine.requests import EngineRequest, FinishEvent
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.engine.suffix import Lookup, lookup_pays, model_expects
from verispec.kernels import suffix

pytestmark = pytest.mark.skipif(not suffix.available(), reason="native library not compiled")


def _job(model_alpha: float, model_price: float) -> DraftJob:
    params = SamplingParams(temperature=0.0)
    pricing = LookupPricing(model_alpha=model_alpha, model_price=model_price)
    return DraftJob(slot=0, tokens=[1, 2, 3], k=3, params=params, noise=KeyedNoise(0, 64), pricing=pricing)


def test_a_lookup_drafts_unless_the_model_yields_more_tokens_per_second():
    """The choice weighs tokens per second, not tokens: a lookup expecting 1 accepted token (2 with the
    target's) against the model's k = 3 at alpha 0.8 (2.95 a round) loses while the model is free, and wins
    once the model's drafting and catch-up cost half a verify pass (2 x 1.5 = 3 >= 2.95 in the same time)."""
    lookup = Lookup([5, 6], match=2, expected=1.0)
    assert model_expects(_job(0.8, 0.0)) == pytest.approx(1.9520)
    assert not lookup_pays(lookup, _job(0.8, 0.0))
    assert not lookup_pays(lookup, _job(0.8, 0.45))
    assert lookup_pays(lookup, _job(0.8, 0.5))
    assert lookup_pays(Lookup([5, 6, 7], match=2, expected=2.0), _job(0.8, 0.0))


# ---- the trie against brute force ----------------------------------------------------------------------------
def continuations(sequences: list[list[int]], pattern: list[int]) -> Counter:
    """What followed each occurrence of `pattern` in `sequences`."""
    found: Counter = Counter()
    n = len(pattern)
    for seq in sequences:
        for i in range(len(seq) - n):
            if seq[i : i + n] == pattern:
                found[seq[i + n]] += 1
    return found


def brute_match(sequences: list[list[int]], context: list[int], depth: int) -> int:
    """The length of the longest suffix of `context` (at most depth - 1) that occurred followed by a token."""
    for length in range(min(depth - 1, len(context)), 0, -1):
        if continuations(sequences, context[-length:]):
            return length
    return 0


def brute_chain(sequences: list[list[int]], context: list[int], length: int, most: int, least: float):
    """The most frequent continuation, token by token (ties: the lower id), scores the product of frequencies;
    a pattern grows past the trie's depth only as far as the trie remembers (depth tokens)."""
    tokens, scores, pattern, score = [], [], list(context[-length:]), 1.0
    while len(tokens) < most:
        found = continuations(sequences, pattern)
        if not found:
            break
        total = sum(found.values())
        token = min(found, key=lambda t: (-found[t], t))
        score *= found[token] / total
        if score <= least:
            break
        tokens.append(token)
        scores.append(score)
        pattern.append(token)
    return tokens, scores


@pytest.mark.parametrize("seed", range(6))
def test_matches_and_chains_are_what_the_sequences_hold(seed):
    rng = random.Random(seed)
    depth = 6
    sequences = [[rng.randrange(4) for _ in range(rng.randrange(5, 40))] for _ in range(5)]
    trie = suffix.SuffixTrie(depth)
    for seq in sequences:
        trie.add(seq)
    for _ in range(40):
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        node, length = trie.match(context)
        assert length == brute_match(sequences, context, depth), context
        if length:
            most = depth - length  # the trie remembers continuations up to depth tokens from the match's start
            got = trie.candidates(node, most, 0.05, chain=True)
            tokens, scores = brute_chain(sequences, context, length, most, 0.05)
            assert got.tokens == tokens and got.parents == list(range(-1, len(tokens) - 1))
            assert got.scores == pytest.approx(scores)


def test_a_capped_match_leaves_room_for_a_long_continuation():
    """Text being copied matches as far back as the trie's depth allows; capped, the match leaves the continuation
    room to draft the full lookup (uncapped, the trie would remember one token after it)."""
    from verispec.engine.suffix import DEPTH, LOOKUP_MAX, MATCH_MAX, best_lookup

    rng = random.Random(3)
    text = [rng.randrange(1000) for _ in range(200)]
    trie = suffix.SuffixTrie(DEPTH)
    trie.add(text)
    copying = text[:120]  # the answer so far copies the text's first 120 tokens
    assert trie.match(copying)[1] == DEPTH - 1
    node, length = trie.match(copying, MATCH_MAX)
    assert length == MATCH_MAX
    assert len(trie.candidates(node, LOOKUP_MAX, 0.0, chain=True).tokens) == LOOKUP_MAX
    lookup = best_lookup([trie], copying, LOOKUP_MAX)
    assert lookup is not None and lookup.tokens == text[120 : 120 + LOOKUP_MAX]


def test_a_sequence_whose_lookups_fail_drafts_shorter_ones():
    """The j-th looked-up token is kept while its score times the sequence's lookup alpha^j stays >= MIN_SCORE:
    a sequence whose lookups keep failing drafts short ones, then none (its draft model drafts instead)."""
    from verispec.engine.policy import estimated_alpha
    from verispec.engine.suffix import DEPTH, LOOKUP_MAX, best_lookup

    rng = random.Random(4)
    text = [rng.randrange(1000) for _ in range(200)]
    trie = suffix.SuffixTrie(DEPTH)
    trie.add(text)
    assert len(best_lookup([trie], text[:120], LOOKUP_MAX, alpha=0.9).tokens) == LOOKUP_MAX  # 0.9^15 > 0.1
    assert len(best_lookup([trie], text[:120], LOOKUP_MAX, alpha=0.5).tokens) == 3  # 0.5^3 > 0.1 > 0.5^4
    assert best_lookup([trie], text[:120], LOOKUP_MAX, alpha=0.05) is None
    assert estimated_alpha(0, 0) == 0.8 and estimated_alpha(95, 0) == 0.99 and estimated_alpha(0, 35) == 0.1


def test_a_tree_of_candidates_is_best_first_by_the_product_of_frequencies():
    trie = suffix.SuffixTrie(8)
    for seq in ([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6, 7]):
        trie.add(seq)
    node, length = trie.match([9, 1, 2])
    assert length == 2
    got = trie.candidates(node, 5, 0.0)
    # after [1, 2]: 3 (3/4), then 3 -> 4 (3/4 * 2/3), 6 (1/4), 3 -> 5 (1/4), 6 -> 7 (1/4 * 1): ties to the lower id
    assert got.tokens == [3, 4, 5, 6, 7] and got.parents == [-1, 0, 0, -1, 3]
    assert got.scores == pytest.approx([0.75, 0.5, 0.25, 0.25, 0.25])


def test_growing_token_by_token_counts_what_adding_whole_counts():
    rng = random.Random(7)
    seq = [rng.randrange(5) for _ in range(60)]
    whole, grown = suffix.SuffixTrie(5), suffix.SuffixTrie(5)
    whole.add(seq)
    for i in range(0, len(seq), 7):
        grown.extend(seq[i : i + 7])
    for _ in range(50):
        context = [rng.randrange(5) for _ in range(rng.randrange(1, 8))]
        a, b = whole.match(context), grown.match(context)
        assert a[1] == b[1]
        if a[1]:
            assert whole.candidates(a[0], 4, 0.0).tokens == grown.candidates(b[0], 4, 0.0).tokens


def test_a_removed_sequence_leaves_no_continuation_and_the_index_stays_bounded():
    from verispec.engine.suffix import SuffixIndex

    trie = suffix.SuffixTrie(6)
    trie.add([1, 2, 3, 4])
    trie.add([7, 8, 9])
    trie.add([1, 2, 3, 4], -1)
    assert trie.match([1, 2, 3])[1] == 0 and trie.match([7, 8])[1] == 2
    index = SuffixIndex(max_tokens=10, depth=6)
    index.add([]), index.add([])  # two requests finished: a partition requests come back to, kept in full
    for i in range(20):
        index.add([i, i + 1, i + 2, i + 3])
    assert index.tokens <= 10 and index.trie().match([19, 20, 21])[1] == 3 and index.trie().match([1, 2])[1] == 0


def test_a_flood_of_one_off_partitions_keeps_within_its_share_and_leaves_a_returning_tenants_history():
    """10,000 requests each in a partition of its own (a new cache_salt each) once took a trie of ~35 KB each, and
    pushed every other tenant's history out of one shared first-in-first-out order."""
    from verispec.engine.suffix import TRIAL_SHARE, SuffixIndex

    index = SuffixIndex(max_tokens=4096, depth=8, max_partitions=64)
    index.add([1000, 1001], "tenant")
    index.add(list(range(1000, 1100)), "tenant")  # its second request: a tenant coming back
    for i in range(10_000):
        index.add([i % 50, 7, 8, 9, i % 13], f"salt {i}")
    assert len(index.partitions) <= 64 and index.trial_tokens <= 4096 // TRIAL_SHARE
    assert index.trie("tenant").match([1000, 1001, 1002])[1] == 3  # the returning tenant's history stays
    # the control: the same history left on trial goes first, as any one-off partition's
    index.add(list(range(2000, 2100)), "newcomer")
    for i in range(10_000, 10_200):
        index.add([i % 50, 7, 8, 9], f"salt {i}")
    assert "newcomer" not in index.partitions and index.trie("tenant").match([1000, 1001])[1] == 2


def test_past_its_tokens_the_index_takes_from_the_tenant_holding_the_most():
    from verispec.engine.suffix import SuffixIndex

    index = SuffixIndex(max_tokens=100, depth=6)
    for name in ("big", "small"):
        index.add([], name)
    index.add(list(range(60)), "big")
    index.add(list(range(200, 230)), "small")
    index.add(list(range(100, 140)), "big")  # 130 > 100: big gives its oldest sequence up
    assert index.tokens == 70 and index.trie("small").match([200, 201])[1] == 2
    assert index.trie("big").match([0, 1])[1] == 0 and index.trie("big").match([100, 101])[1] == 2


# ---- the drafter through the engine ---------------------------------------------------------------------------
REPEATING = ["abc abc abc abc abd abc ab", "def f(x):\n    return x\n\ndef g(x):\n    return", "1234 1234 1234 12"]


@pytest.mark.parametrize("with_model", [True, False])
def test_suffix_drafting_gives_plain_greedy_output_and_uses_earlier_outputs(tiny, with_model):
    """Greedy outputs equal plain decoding's, for prompts that repeat themselves; a prompt sent again finds its
    first answer in the index of earlier outputs and drafts long lookups from it."""
    target, draft = tiny
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    config = SchedulerConfig(max_num_seqs=2, max_model_len=256, speculative_method="suffix", draft_policy="always")
    scheduler = Scheduler(target, draft if with_model else None, config)
    outputs: dict[str, list] = {}
    for round_ in range(2):
        for i, prompt in enumerate(REPEATING):
            events: list = []
            ids = target.tokenizer.encode(prompt)
            scheduler.submit(
                EngineRequest(
                    request_id=f"{round_}-{i}",
                    prompt_ids=ids,
                    params=SamplingParams(),
                    max_tokens=40,
                    sink=events.append,
                    ignore_eos=True,
                )
            )
            scheduler.run_until_idle()
            assert isinstance(events[-1], FinishEvent)
            outputs[f"{round_}-{i}"] = events[-1].output
    for i, prompt in enumerate(REPEATING):
        expected = plain.generate(prompt, max_tokens=40, ignore_eos=True).token_ids
        assert outputs[f"0-{i}"].token_ids == expected and outputs[f"1-{i}"].token_ids == expected
    first = sum(outputs[f"0-{i}"].stats.drafted_by_lookup for i in range(len(REPEATING)))
    again = [outputs[f"1-{i}"].stats for i in range(len(REPEATING))]
    assert first > 0
    # the second time, the earlier output is there to copy: far fewer target passes than tokens
    assert sum(s.target_passes for s in again) * 3 < sum(s.new_tokens for s in again)
    assert all(s.accepted_by_lookup > 0 for s in again)


def test_a_seeded_sample_is_the_same_whatever_the_server_answered_before(tiny):
    """A sampled request with a seed gives the same text every time, although earlier outputs in the index change
    what is drafted: its tokens are drawn with noise keyed by the seed and their positions (decoding/noise.py)."""
    target, _ = tiny
    config = SchedulerConfig(max_num_seqs=2, max_model_len=256, speculative_method="suffix", draft_policy="always")
    scheduler = Scheduler(target, None, config)
    ids = target.tokenizer.encode(REPEATING[0])
    params = SamplingParams(temperature=1.0, seed=11)
    texts = []
    for round_ in range(3):
        events: list = []
        scheduler.submit(
            EngineRequest(
                request_id=f"r{round_}",
                prompt_ids=ids,
                params=params,
                max_tokens=40,
                sink=events.append,
                ignore_eos=True,
            )
        )
        scheduler.run_until_idle()
        texts.append(events[-1].output.token_ids)
    assert texts[0] == texts[1] == texts[2]


@pytest.mark.parametrize("policy", ["auto", "never"])
def test_lookups_go_on_when_the_policy_stops_the_draft_model(tiny, policy, monkeypatch):
    """The policy's k governs the draft model only: a step it gives k = 0 still drafts by lookup (free), and
    the output is still plain decoding's; `--draft-policy never` drafts nothing at all."""
    target, draft = tiny
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method="suffix", draft_policy=policy)
    scheduler = Scheduler(target, draft, config)
    monkeypatch.setattr(scheduler.policy, "choose_k", lambda *args, **kwargs: 0)
    events: list = []
    ids = target.tokenizer.encode(REPEATING[2])
    scheduler.submit(
        EngineRequest(
            request_id="r", prompt_ids=ids, params=SamplingParams(), max_tokens=40, sink=events.append, ignore_eos=True
        )
    )
    scheduler.run_until_idle()
    output = events[-1].output
    assert output.token_ids == plain.generate(REPEATING[2], max_tokens=40, ignore_eos=True).token_ids
    if policy == "never":
        assert output.stats.drafted == 0
    else:
        assert output.stats.drafted_by_lookup == output.stats.drafted > 0


@pytest.mark.parametrize(("slope", "drafts"), [(1.0, False), (0.01, True)])
def test_lookups_are_priced_by_this_machines_passes(tiny, monkeypatch, slope, drafts):
    """Where a pass costs in proportion to its rows (slope 1: a compute-bound CPU, in the extreme) no lookup pays,
    since no draft is sure to be accepted: nothing is drafted. Where rows are nearly free (slope 0.01: memory-bound)
    lookups draft. The output is plain decoding's either way."""
    target, _ = tiny
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method="suffix", draft_policy="auto")
    scheduler = Scheduler(target, None, config)  # lookups alone
    for rows in (1, 2, 4, 8, 16):
        for _ in range(3):
            scheduler.policy.record_pass(rows, 0.01 * (1 + slope * (rows - 1)))
    monkeypatch.setattr(scheduler.policy, "record_pass", lambda *args: None)  # these costs, whatever runs
    events: list = []
    ids = target.tokenizer.encode(REPEATING[2])
    scheduler.submit(
        EngineRequest(
            request_id="r", prompt_ids=ids, params=SamplingParams(), max_tokens=40, sink=events.append, ignore_eos=True
        )
    )
    scheduler.run_until_idle()
    output = events[-1].output
    assert output.token_ids == plain.generate(REPEATING[2], max_tokens=40, ignore_eos=True).token_ids
    assert (output.stats.drafted > 0) == drafts


FORKING = ["abc abd abe abc abd abe abc ab", "x = 1\ny = 2\nx = 3\ny = 4\nx = 1\ny = 2\nx ="]


def _run_counting_trees(scheduler, target, prompts, params=None, **options) -> tuple[list, int]:
    """Each prompt alone, greedy unless `params`; the outputs, and how many rounds verified a token tree."""
    trees = 0
    settle = scheduler.verifier.settle

    def counted(*args):  # a round whose verdict has a path verified a tree
        nonlocal trees
        trees += args[-1][2] is not None  # verify_batch's verdict: (accepted, next token, a tree's path)
        return settle(*args)

    scheduler.verifier.settle = counted
    outputs = []
    for i, prompt in enumerate(prompts * 2):  # the second time, earlier outputs fork the index's continuations
        events: list = []
        ids = target.tokenizer.encode(prompt)
        request = EngineRequest(
            request_id=f"{i}",
            prompt_ids=ids,
            params=params or SamplingParams(),
            max_tokens=40,
            sink=events.append,
            ignore_eos=True,
            **options,
        )
        scheduler.submit(request)
        scheduler.run_until_idle()
        assert isinstance(events[-1], FinishEvent), events[-1]
        outputs.append(events[-1].output)
    return outputs, trees


@pytest.mark.parametrize("trees", [True, False])
def test_token_trees_give_plain_greedy_output(tiny, trees):
    """Lookups after text that forked propose token trees, verified in one pass: the greedy output is plain
    decoding's, with trees and without (the control: with them off, no round verifies a tree)."""
    target, _ = tiny
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method="suffix", token_trees=trees)
    outputs, verified = _run_counting_trees(Scheduler(target, None, config), target, FORKING)
    for output, prompt in zip(outputs, FORKING * 2, strict=True):
        assert output.token_ids == plain.generate(prompt, max_tokens=40, ignore_eos=True).token_ids
    assert (verified > 0) == trees


def test_no_token_trees_for_requests_with_penalties(tiny):
    """Penalties count the drafted tokens before each row (a row's own path, in a tree): such requests draft
    chains. (A grammar's masks follow each node's path: test_grammar.py.)"""
    target, _ = tiny
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method="suffix", token_trees=True)
    params = SamplingParams(frequency_penalty=0.5)
    _, verified = _run_counting_trees(Scheduler(target, None, config), target, FORKING, params)
    assert verified == 0
    _, verified = _run_counting_trees(Scheduler(target, None, config), target, FORKING)  # the control
    assert verified > 0


def test_logprobs_of_a_token_tree_are_the_targets_at_each_accepted_node(tiny, monkeypatch):
    """Where a tree's accepted path leaves its chain (a branch won), each token's logprob still comes from the
    row of the node it follows: the target's own log-softmax after the tokens before it."""
    import verispec.engine.verification as verification_module

    target, _ = tiny
    paths: list[list[int]] = []
    judge = verification_module.verify_batch

    def recorded(drafts, parents, choices):
        verdicts = judge(drafts, parents, choices)
        paths.extend(path for _, _, path in verdicts if path is not None)
        return verdicts

    monkeypatch.setattr(verification_module, "verify_batch", recorded)
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method="suffix", token_trees=True)
    scheduler = Scheduler(target, None, config)
    prompts = [*FORKING, "cab ac abc ca ca abc ba ab abc ab ab cab"]  # the last: a branch wins once (found by search)
    for i, prompt in enumerate(prompts * 2):
        events: list = []
        ids = target.tokenizer.encode(prompt)
        request = EngineRequest(
            request_id=f"{i}",
            prompt_ids=ids,
            params=SamplingParams(),
            max_tokens=40,
            sink=events.append,
            ignore_eos=True,
            logprobs=2,
        )
        scheduler.submit(request)
        scheduler.run_until_idle()
        output = events[-1].output
        cache = target.model.new_cache(1, 256)
        logits = target.model(torch.tensor([ids + output.token_ids[:-1]]), cache, [0])[0, len(ids) - 1 :]
        expected = torch.log_softmax(logits.float(), -1)
        for j, (token, logprob) in enumerate(zip(output.token_ids, output.logprobs, strict=True)):
            assert logprob.token_id == token
            assert abs(logprob.logprob - float(expected[j, token])) < 1e-3, (i, j)
    assert any(path != list(range(1, len(path) + 1)) for path in paths)  # a branch was accepted somewhere


@pytest.mark.parametrize("shared", [True, False])
def test_a_response_helps_its_neighbours_while_it_is_written(tiny, shared):
    """Request B asks what request A, of its partition, is still answering: B copies A's answer as far as A has
    written it (A's trie is read while A runs, as ArcticInference's global tree is), and needs far fewer target
    passes than tokens. Of another partition, B copies nothing of A's."""
    target, _ = tiny
    config = SchedulerConfig(max_num_seqs=2, max_model_len=256, speculative_method="suffix", draft_policy="always")
    scheduler = Scheduler(target, None, config)
    prompt = target.tokenizer.encode("A neighbour's answer: ")
    outputs = {}

    def submit(name: str, partition: str, tokens: int) -> None:
        sink = lambda event: outputs.update({name: event}) if isinstance(event, FinishEvent) else None  # noqa: E731
        request = EngineRequest(
            request_id=name,
            prompt_ids=prompt,
            params=SamplingParams(),
            max_tokens=tokens,
            sink=sink,
            ignore_eos=True,
            partition=partition,
        )
        scheduler.submit(request)

    submit("a", "team", 120)
    scheduler.step()
    (writer,) = scheduler.running.values()
    while len(writer.tokens) < len(prompt) + 70:  # A writes more than B will ask for
        scheduler.step()
    submit("b", "team" if shared else "stranger", 60)
    scheduler.step()
    assert "a" not in outputs  # A is still being written when B starts
    scheduler.run_until_idle()
    a, b = outputs["a"].output, outputs["b"].output
    assert a.token_ids[:60] == b.token_ids
    copied = b.stats.accepted_by_lookup
    if shared:
        assert copied >= 30 and b.stats.target_passes * 2 < b.stats.new_tokens
    else:
        assert copied < 30
