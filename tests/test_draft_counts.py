"""Drafted and accepted tokens counted per proposer (the draft model, a lookup) and per draft position: in a
request's stats and in the engine's Prometheus counters, checked against a log of the rounds as the target
verified them (independent of the counting under test)."""

from __future__ import annotations

import random

import pytest

from verispec import SpeculativeGenerator
from verispec.decoding.grammar import GrammarSpec
from verispec.decoding.sampling import SamplingParams
from verispec.decoding.stats import PROPOSERS, GenerationStats
from verispec.engine.metrics import DEEPER_POSITIONS, POSITION_LABELS, Metrics
from verispec.engine.requests import EngineRequest, FinishEvent
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.kernels import suffix

needs_suffix = pytest.mark.skipif(not suffix.available(), reason="native library not compiled")

# text that repeats itself (lookups find it) with new text between (the draft model drafts there)
REPEATING = ["abc abc abc abc abd abc ab", "def f(x):\n    return x\n\ndef g(x):\n    return", "1234 1234 1234 12"]


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(f"verispec_{name}_total", labels) or 0.0


def record_random_rounds(stats: GenerationStats, metrics: Metrics, rounds: int, seed: int) -> list[tuple]:
    rng, log = random.Random(seed), []
    for _ in range(rounds):
        drafted, looked_up = rng.choice([0, 1, 3, 4, 15, 20]), rng.random() < 0.5
        accepted = rng.randint(0, drafted)
        stats.record_round(drafted, accepted, looked_up)
        metrics.record_round(drafted, accepted, "lookup" if looked_up else "model")
        log.append((drafted, accepted, looked_up))
    return log


def assert_consistent(stats: GenerationStats, rounds: list[tuple[int, int, bool]]) -> None:
    """`stats` against the rounds (drafted, accepted, looked_up) it was built from."""
    by = stats.by_proposer()
    assert set(by) == set(PROPOSERS)
    assert sum(c.drafted for c in by.values()) == stats.drafted == sum(d for d, _, _ in rounds)
    assert sum(c.accepted for c in by.values()) == stats.accepted == sum(a for _, a, _ in rounds)
    assert sum(c.rejected for c in by.values()) == stats.rejected
    for name, looked_up in (("model", False), ("lookup", True)):
        mine = [(d, a) for d, a, up in rounds if up == looked_up]
        assert by[name].drafted == sum(d for d, _ in mine) and by[name].accepted == sum(a for _, a in mine)
        assert by[name].rejected == sum(a < d for d, a in mine)
    assert stats.drafted_by_position[0] == sum(d >= 1 for d, _, _ in rounds)  # position 1: rounds that drafted
    assert sum(stats.drafted_by_position) == stats.drafted and sum(stats.accepted_by_position) == stats.accepted
    for column in (stats.drafted_by_position, stats.accepted_by_position):
        assert all(a >= b for a, b in zip(column, column[1:], strict=False))  # a chain: non-increasing in j
    for j, (d, a) in enumerate(zip(stats.drafted_by_position, stats.accepted_by_position, strict=True), start=1):
        assert d == sum(dr >= j for dr, _, _ in rounds) and a == sum(ac >= j for _, ac, _ in rounds)


def assert_metrics_equal_stats(metrics: Metrics, stats: GenerationStats) -> None:
    """The engine's counters hold the same counts as the stats (positions past POSITION_LABELS summed)."""
    assert sample(metrics, "draft_tokens") == stats.drafted and sample(metrics, "accepted_tokens") == stats.accepted
    for name, counts in stats.by_proposer().items():
        assert sample(metrics, "draft_tokens_by_proposer", proposer=name) == counts.drafted
        assert sample(metrics, "accepted_tokens_by_proposer", proposer=name) == counts.accepted
    for column, series in ((stats.drafted_by_position, "draft"), (stats.accepted_by_position, "accepted")):
        name = f"{series}_tokens_by_position"
        for j, count in enumerate(column[:POSITION_LABELS], start=1):
            assert sample(metrics, name, position=str(j)) == count
        assert sample(metrics, name, position=DEEPER_POSITIONS) == sum(column[POSITION_LABELS:])
        assert sample(metrics, name, position=str(POSITION_LABELS + 1)) == 0  # never a label of its own


@pytest.mark.parametrize("seed", range(3))
def test_counts_by_proposer_and_position_add_up(seed):
    stats, metrics = GenerationStats(), Metrics()
    rounds = record_random_rounds(stats, metrics, 200, seed)
    assert_consistent(stats, rounds)
    assert_metrics_equal_stats(metrics, stats)
    assert len(stats.drafted_by_position) == 20  # the deepest round's length, past the labelled positions


def test_both_proposer_series_exist_before_any_draft():
    metrics = Metrics()
    text = metrics.render().decode()
    for proposer in PROPOSERS:
        assert f'verispec_draft_tokens_by_proposer_total{{proposer="{proposer}"}} 0.0' in text
        assert f'verispec_accepted_tokens_by_proposer_total{{proposer="{proposer}"}} 0.0' in text


def test_the_stats_line_shows_each_proposer_that_drafted_and_the_positions():
    stats = GenerationStats()
    for drafted, accepted, looked_up in [(4, 4, False), (4, 1, False), (6, 3, True), (0, 0, False)]:
        stats.record_round(drafted, accepted, looked_up)
    assert stats.summary().endswith("| accepted by model 5/8 (62.5%) · lookup 3/6 (50.0%)")
    assert stats.positions_summary() == "100% 67% 67% 33% 0% 0%"
    model_only = GenerationStats()
    model_only.record_round(2, 1)
    assert model_only.summary().endswith("| accepted by model 1/2 (50.0%)")
    assert "accepted by" not in GenerationStats().summary()  # plain decoding: no drafts, no proposers


def run_logged(scheduler: Scheduler, requests: list[tuple[str, list[int]]], **extra) -> tuple[dict, dict]:
    """Each request alone through `scheduler`: its outputs, and per request the rounds (drafted, accepted,
    looked_up) as the target verified them."""
    rounds: dict[str, list] = {}
    advance = scheduler.emitter.advance

    def logged(seq, proposal, verdict):
        rounds.setdefault(seq.request.request_id, []).append(
            (proposal.height, verdict.accepted, proposal.looked_up)  # a tree counts as its deepest path
        )
        return advance(seq, proposal, verdict)

    scheduler.emitter.advance = logged
    outputs = {}
    for request_id, ids in requests:
        events: list = []
        options = {"ignore_eos": True, **extra}
        scheduler.submit(
            EngineRequest(
                request_id=request_id,
                prompt_ids=ids,
                params=SamplingParams(),
                max_tokens=40,
                sink=events.append,
                **options,
            )
        )
        scheduler.run_until_idle()
        assert isinstance(events[-1], FinishEvent), events[-1]
        outputs[request_id] = events[-1].output
    return outputs, rounds


@needs_suffix
@pytest.mark.parametrize("method", ["suffix", "hybrid"])
def test_a_greedy_run_drafted_by_both_proposers_counts_each_its_own(tiny, method):
    """The draft model and the lookups both draft in these runs (greedy, output still plain decoding's); every
    round's tokens are counted under the proposer that drafted them, in the stats and in the engine's counters."""
    target, draft = tiny
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method=method, draft_policy="always")
    scheduler = Scheduler(target, draft, config)
    requests = [(f"{turn}-{i}", target.tokenizer.encode(p)) for turn in range(2) for i, p in enumerate(REPEATING)]
    outputs, rounds = run_logged(scheduler, requests)
    for request_id, ids in requests:
        expected = plain.generate(ids, max_tokens=40, ignore_eos=True).token_ids
        assert outputs[request_id].token_ids == expected
        assert_consistent(outputs[request_id].stats, rounds[request_id])
    total = GenerationStats.merged([output.stats for output in outputs.values()])
    assert total.drafted_by_lookup > 0 and total.drafted - total.drafted_by_lookup > 0  # both drafted
    if method == "suffix":  # (hybrid's prompt lookups find nothing right in these tiny models' text)
        assert all(counts.accepted > 0 for counts in total.by_proposer().values())
    assert_metrics_equal_stats(scheduler.metrics, total)


@needs_suffix
@pytest.mark.parametrize("with_model", [False, True])
def test_each_method_attributes_its_drafts_to_its_proposer(tiny, with_model):
    """Lookups alone (suffix without a draft model) count as lookup only; the draft model alone as model only."""
    target, draft = tiny
    method = "draft" if with_model else "suffix"
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method=method, draft_policy="always")
    scheduler = Scheduler(target, draft if with_model else None, config)
    outputs, _ = run_logged(scheduler, [(str(i), target.tokenizer.encode(p)) for i, p in enumerate(REPEATING)])
    total = GenerationStats.merged([output.stats for output in outputs.values()])
    by = total.by_proposer()
    mine, other = ("model", "lookup") if with_model else ("lookup", "model")
    assert by[mine].drafted == total.drafted > 0 and by[other].drafted == 0
    assert sample(scheduler.metrics, "draft_tokens_by_proposer", proposer=other) == 0


@needs_suffix
def test_a_lookup_cut_by_the_grammar_is_still_counted_as_a_lookup(tiny):
    """A draft cut at the first token the request's grammar rejects keeps its proposer: lookups alone (no draft
    model) draft every token here, and the grammar cuts some of their drafts."""
    target, _ = tiny
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method="suffix", draft_policy="always")
    scheduler = Scheduler(target, None, config)
    constrain, cuts = scheduler.verifier.constrain, []

    def counted(seqs, proposals):
        before = [p.tokens.shape[0] if p is not None else 0 for p in proposals]
        masks = constrain(seqs, proposals)
        after = [p.tokens.shape[0] if p is not None else 0 for p in proposals]
        cuts.extend(0 < a < b for b, a in zip(before, after, strict=True))  # cut, with tokens left to count
        return masks

    scheduler.verifier.constrain = counted
    grammar = scheduler.grammars.compile(GrammarSpec("regex", "[abc ]+"))
    prompt = target.tokenizer.encode("abc abc abd abc abd abc abd abc abc ")
    outputs, rounds = run_logged(scheduler, [("r", prompt)], grammar=grammar, ignore_eos=False)
    stats = outputs["r"].stats
    assert any(cuts), "the grammar cut no lookup: the test checks nothing"
    assert stats.drafted_by_lookup == stats.drafted > 0
    assert all(looked_up for drafted, _, looked_up in rounds["r"] if drafted)
    assert_consistent(stats, rounds["r"])
