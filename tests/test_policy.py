"""The draft policy (engine/policy.py) on simulated step costs: the draft length that pays at each batch size,
probes that follow the machine, and no decision swayed by a slow step or a slow spell."""

from __future__ import annotations

from itertools import pairwise

import pytest

from verispec.engine.policy import DraftPolicy, PolicySettings, StepCost


def record(policy: DraftPolicy, batch: int, drafting: int, k: int, draft: float, verify: float, **more) -> None:
    """One step's costs, `draft` without the catch-up (StepCost's draft_seconds includes it)."""
    cost = StepCost(batch=batch, drafting=drafting, k=k, draft_seconds=draft + more.get("catch_up_seconds", 0.0),
                    verify_seconds=verify, **more)  # fmt: skip
    policy.record(cost)


def _cpu_like_costs(batch: int, k: int) -> tuple[float, float]:
    """(draft, verify) seconds as on a CPU whose matmuls work on blocks of 4 rows (docs/speed.md)."""
    return 0.03 * k, 0.1 * -(-batch * (k + 1) // 4)


def _settle(policy: DraftPolicy, batch: int, alpha: float, steps: int = 12) -> list[int]:
    """Run `steps` steps of `batch` sequences with acceptance `alpha`; the k chosen at each."""
    chosen = []
    for _ in range(steps):
        k = policy.choose_k(batch, [alpha] * batch, [policy.settings.k_max] * batch)
        record(policy, batch, batch if k else 0, k, *_cpu_like_costs(batch, k))
        chosen.append(k)
    return chosen


def _gaps(steps: list[int]) -> list[int]:
    """Steps from the start to the first of `steps`, and between each and the next."""
    return [later - earlier for earlier, later in pairwise([-1, *steps])]


def test_draft_policy_picks_the_draft_length_that_pays_at_each_batch_size():
    policy = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
    # plain first (the baseline, measured twice, then until 3 steps can pair a new k's first samples), then
    # each k measured twice, largest first
    assert _settle(policy, 1, 0.8)[:11] == [0, 0, 0, 0, 3, 3, 2, 2, 1, 1, 3]
    # one row, a = 0.8: k = 3 yields 2.95 tokens in 0.19 s (one 4-row block), plain 1 in 0.1 s
    assert policy.choose_k(1, [0.8], [3]) == 3
    chosen = _settle(policy, 2, 0.8)
    # two rows: k = 1 (2 x 2 tokens, one block) beats k = 3 (two blocks) and plain (2 tokens / 0.1 s)
    assert chosen[:2] == [0, 0] and chosen[-1] == 1
    # four rows: plain fills the block, and no draft length is even tried: k = 1 (8 tokens) costs at least the
    # measured 8-token passes (0.2 s), k = 2 and 3 at least 2.6 and 2.9 x plain, their multiples at two rows
    assert set(_settle(policy, 4, 0.8)) == {0}
    assert policy.choose_k(1, [0.1], [3]) == 0  # a draft that is rarely right never pays
    assert policy.choose_k(1, [0.8], [1]) == 1  # a sequence that may draft 1 more token: longer k yield no more
    assert DraftPolicy(PolicySettings(mode="always", k_max=4)).choose_k(8, [0.0], [4]) == 4
    assert DraftPolicy(PolicySettings(mode="never")).choose_k(1, [1.0], [4]) == 0


def test_draft_policy_probes_the_other_choice_less_and_less_while_the_decision_holds():
    policy = DraftPolicy(PolicySettings(k_max=1, probe_every=4, max_probe_interval=16, probe_budget=1.0))
    for _ in range(2):  # a step time counts once measured twice
        record(policy, 2, 2, 1, 0.01, 0.02)  # drafting: 2 x 2 tokens in 0.03 s; plain: 2 tokens in 0.02 s
        record(policy, 2, 0, 0, 0.0, 0.02)
    decisions = [policy.choose_k(2, [1.0, 1.0], [1, 1]) for _ in range(60)]
    gaps = _gaps([i for i, k in enumerate(decisions) if not k])  # steps from one plain probe to the next
    assert gaps[0] == policy.settings.probe_every and len(gaps) >= 4
    assert all(later >= earlier for earlier, later in pairwise(gaps))  # never closer while the choice holds
    assert max(gaps) == policy.settings.max_probe_interval  # doubled up to the cap, and no further
    for _ in range(5):  # drafting's verify became 10x slower for good; plain probes beside it show that (alone,
        for _ in range(4):  # 10x slower drafting steps look like a slower machine: the chosen cell keeps its time,
            record(policy, 2, 2, 1, 0.01, 0.2)  # and plain, measured against them, looks 10x faster: 0.002 s)
        record(policy, 2, 0, 0, 0.0, 0.02)
    # the decision flips and probing is frequent again: back to every 4 steps, but a drafting probe now loses
    # 0.03 s * (1 - 133/1000) = 0.026 s, 13 plain steps of 0.002 s (then the interval, 8, is below that)
    decisions = [policy.choose_k(2, [1.0, 1.0], [1, 1]) for _ in range(30)]
    gaps = _gaps([i for i, k in enumerate(decisions) if k])
    assert len(gaps) >= 2 and all(13 <= gap <= 2 * 8 for gap in gaps)  # spaced by their cost, interval reset


def test_draft_policy_drafts_only_when_it_beats_plain_by_the_margin():
    """bench-serve at two sequences: drafting 1 token estimated 6-9% faster than plain decoding was level with it
    in practice (the estimate's own error), so drafting must win by 10%."""
    policy = DraftPolicy(PolicySettings(k_max=1, probe_every=1000))
    for _ in range(3):
        record(policy, 2, 2, 1, 0.05, 0.21)  # 2 x 1.9 tokens in 0.26 s: 14.6 tokens/s, 7% above plain's
        record(policy, 2, 0, 0, 0.0, 0.147)  # 2 tokens in 0.147 s: 13.6 tokens/s
    assert policy.choose_k(2, [0.9, 0.9], [1, 1]) == 0
    assert policy.choose_k(2, [1.0, 1.0], [1, 1]) == 1  # 2 x 2 tokens: 15.4 tokens/s, 13% above


def test_draft_policy_ignores_one_slow_step():
    policy = DraftPolicy(PolicySettings(k_max=1, probe_every=1000))
    for _ in range(4):
        record(policy, 1, 1, 1, 0.02, 0.06)
        record(policy, 1, 0, 0, 0.0, 0.05)
    assert policy.choose_k(1, [1.0], [1]) == 1  # 2 / 0.08 s beats 1 / 0.05 s
    record(policy, 1, 0, 0, 0.0, 0.5)  # one plain step slowed 10x by other load
    assert policy.choose_k(1, [1.0], [1]) == 1
    record(policy, 1, 1, 1, 0.02, 0.6)  # nor does one slow drafting step flip it
    assert policy.choose_k(1, [1.0], [1]) == 1
    fresh = DraftPolicy(PolicySettings(k_max=1, probe_every=1000))
    for verify_seconds in (0.6, 0.06):  # the first drafting step ever, slowed 10x, does not rule drafting out
        record(fresh, 1, 1, 1, 0.02, verify_seconds)
        record(fresh, 1, 0, 0, 0.0, 0.05)
    assert fresh.choose_k(1, [1.0], [1]) == 1


def test_draft_policy_is_not_swayed_by_a_slow_spell_of_the_machine():
    """A shared machine slows every step by up to 2x for seconds at a time. Plain steps measured in such a spell
    must not make drafting (measured before it) look better than plain; a change of drafting's cost relative to
    plain's still shows once drafting is measured again beside plain."""
    policy = DraftPolicy(PolicySettings(k_max=1, probe_every=1000))
    for _ in range(3):
        record(policy, 2, 2, 1, 0.06, 0.24)  # drafting: 2 x 1.9 tokens in 0.30 s ...
    for _ in range(9):
        record(policy, 2, 0, 0, 0.0, 0.16)  # ... plain: 2 tokens in 0.16 s
    assert policy.choose_k(2, [0.9, 0.9], [1, 1]) == 0
    for _ in range(12):
        record(policy, 2, 0, 0, 0.0, 0.35)  # a slow spell (with a median of raw times, plain's 0.35 s stood)
    assert policy.choose_k(2, [0.9, 0.9], [1, 1]) == 0
    record(policy, 2, 2, 1, 0.13, 0.52)  # a probe in the spell: drafting slowed alike
    assert policy.choose_k(2, [0.9, 0.9], [1, 1]) == 0
    for _ in range(5):  # drafting got faster than before relative to plain, as probes beside plain steps show
        record(policy, 2, 2, 1, 0.06, 0.24)
        for _ in range(3):
            record(policy, 2, 0, 0, 0.0, 0.35)
    assert policy.choose_k(2, [0.9, 0.9], [1, 1]) == 1


@pytest.mark.parametrize("chosen", [0, 1])
def test_draft_policy_is_not_swayed_by_a_machine_that_slows_gradually(chosen):
    """Steps of the chosen draft length say nothing about the others: a machine (or a context) that gets slower
    step by step must not move the chosen cell's time away from the cell it is compared with. (When each step's
    own time set the slowdown, a 12-step ramp to 1.55x dragged plain's time along and flipped the choice.)"""
    policy = DraftPolicy(PolicySettings(k_max=1, probe_every=1000))
    plain = 0.16 if chosen == 0 else 0.20  # drafting: 2 x 1.9 tokens in 0.30 s; plain: 2 tokens in 0.16 (0.20) s
    for _ in range(3):
        record(policy, 2, 2, 1, 0.06, 0.24)
        record(policy, 2, 0, 0, 0.0, plain)
    for _ in range(6):
        record(policy, 2, 2 * chosen, chosen, 0.06 * chosen, 0.24 if chosen else plain)
    assert policy.choose_k(2, [0.9, 0.9], [1, 1]) == chosen
    for i in range(12):
        slower = 1 + 0.05 * i
        record(policy, 2, 2 * chosen, chosen, 0.06 * chosen * slower, (0.24 if chosen else plain) * slower)
    assert policy.choose_k(2, [0.9, 0.9], [1, 1]) == chosen


def test_draft_policy_measures_a_probe_against_the_chosen_steps_not_the_other_way_round():
    """The steps right after a probe are measured against the steps before it only if those were mostly of
    other cells: one probe step slowed by other load moved the chosen cell through the 4 steps that followed."""
    policy = DraftPolicy(PolicySettings(k_max=1, probe_every=1000))
    for _ in range(3):
        record(policy, 1, 1, 1, 0.05, 0.15)
        record(policy, 1, 0, 0, 0.0, 0.13)
    for _ in range(6):
        record(policy, 1, 1, 1, 0.05, 0.15)
    drafting = policy.seconds(1, 1, 1)
    record(policy, 1, 0, 0, 0.0, 0.39)  # a plain probe, 3x slowed
    for _ in range(5):
        record(policy, 1, 1, 1, 0.05, 0.15)
    assert policy.seconds(1, 1, 1) == pytest.approx(drafting)
    assert policy.seconds(1, 1, 0) == pytest.approx(0.13)


def test_draft_policy_spaces_probes_by_their_cost():
    policy = DraftPolicy(PolicySettings(k_max=1, probe_every=4, probe_budget=0.02))
    for _ in range(2):
        record(policy, 2, 2, 1, 0.01, 0.02)  # drafting: 4 tokens in 0.03 s; plain: 2 tokens in 0.02 s
        record(policy, 2, 0, 0, 0.0, 0.02)
    decisions = [policy.choose_k(2, [1.0, 1.0], [1, 1]) for _ in range(60)]
    # a plain probe loses 0.02 s * (1 - 100/133) = 0.005 s, 2% of 9 drafting steps of 0.03 s: after 9, 9
    # (not 4, 8) steps, then 16 (the doubling interval)
    gaps = _gaps([i for i, k in enumerate(decisions) if not k])
    assert gaps[:2] == [9, 9] and all(gap >= 9 for gap in gaps)  # the cost's spacing first, then the doubling
    assert max(gaps) == 16
    suspended = DraftPolicy(PolicySettings(k_max=1, probe_every=4, probe_budget=0.02))
    for _ in range(2):
        record(suspended, 1, 1, 1, 0.05, 0.05, catch_up_seconds=0.1, catch_up_tokens=10)  # 2 tokens in 0.1 s
        record(suspended, 1, 0, 0, 0.0, 0.02)  # plain: 1 token in 0.02 s
    decisions = [suspended.choose_k(1, [1.0], [1], lag_tokens=10) for _ in range(300)]
    # a drafting probe loses 0.1 s * (1 - 20/50) + 10 tokens * 0.01 s of catching up = 0.16 s: 400 plain steps
    assert not any(decisions)
    assert any(suspended.choose_k(1, [1.0], [1], lag_tokens=0) for _ in range(300))  # without a lag: 0.06 s, 150
    far_behind = [suspended.choose_k(1, [1.0], [1], lag_tokens=100) for _ in range(2000)]
    assert not any(far_behind)  # 100 tokens behind: 1.06 s of loss, a probe at most every 2,650 steps


def test_draft_policy_does_not_try_a_draft_length_that_a_smaller_measured_pass_rules_out():
    policy = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
    for _ in range(2):
        record(policy, 2, 2, 3, *_cpu_like_costs(2, 3))  # 2 x 4 = 8 tokens: 0.2 s, drafting 0.09 s
        record(policy, 1, 1, 1, *_cpu_like_costs(1, 1))
        record(policy, 4, 0, 0, *_cpu_like_costs(4, 0))  # plain at four sequences: 4 tokens in 0.1 s
    # Four sequences drafting 1 (8 tokens) cost at least the measured 8-token pass: 4 x 1.7 / 0.23 s < 4 / 0.1 s,
    # and so do k = 2 and 3. (Bounded only by passes with no larger k, k = 2 looked worth 8.8 / 0.13 s.)
    assert policy.choose_k(4, [0.7] * 4, [3] * 4) == 0


def test_draft_policy_resumes_drafting_only_if_the_catch_up_pays_back():
    policy = DraftPolicy(PolicySettings(k_max=1, probe_every=1000))
    for _ in range(2):
        record(policy, 1, 1, 1, 0.01, 0.025, catch_up_seconds=0.1, catch_up_tokens=10)  # 2 tokens in 0.035 s
        record(policy, 1, 0, 0, 0.0, 0.02)  # plain: 1 token in 0.02 s
    assert policy.choose_k(1, [1.0], [1]) == 1
    # 10 tokens behind: 0.1 s of catching up, worth it over 1,000 more tokens, not over the last 5
    assert policy.choose_k(1, [1.0], [1], lag_tokens=10, remaining_tokens=1000) == 1
    assert policy.choose_k(1, [1.0], [1], lag_tokens=10, remaining_tokens=5) == 0
    # A new request's draft must first read its whole prompt: that too is spread over the tokens to come, so a
    # batch size where only plain was measured still tries drafting (a whole catch-up charged to one step never did)
    fresh = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
    for _ in range(4):
        record(fresh, 1, 0, 0, *_cpu_like_costs(1, 0))
    for _ in range(2):
        fresh.catch_up.add(0.02)
    assert fresh.choose_k(1, [0.8], [3], lag_tokens=40, remaining_tokens=64) == 3


def test_draft_policy_prices_a_first_catch_up_from_the_prefill_before_paying_it():
    """Before the draft has ever caught up, its catch-up is priced at half a prefilled token of the target: a
    1,500-token prompt with 64 tokens to go is not worth the draft reading it (never slower on long prompts),
    a short one is; without the prefill's measure the long one would be tried, unpriced (the control)."""

    def fresh(prefill_seconds_per_token: float | None) -> DraftPolicy:
        policy = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
        for _ in range(4):
            record(policy, 1, 0, 0, *_cpu_like_costs(1, 0))  # plain: 1 token in 0.1 s
        if prefill_seconds_per_token is not None:
            policy.record_prefill(prefill_seconds_per_token * 1500, 1500)
        return policy

    long_prompt = fresh(0.05)
    assert [long_prompt.choose_k(1, [0.8], [3], lag_tokens=1500, remaining_tokens=64) for _ in range(20)] == [0] * 20
    assert fresh(0.05).choose_k(1, [0.8], [3], lag_tokens=20, remaining_tokens=512) == 3
    assert fresh(None).choose_k(1, [0.8], [3], lag_tokens=1500, remaining_tokens=64) == 3


def test_the_expected_answer_length_follows_the_answers_before_it():
    policy = DraftPolicy(PolicySettings(answer_prior=2.0))
    assert policy.expected_left(0, 128) == 128  # nothing known: the most it may write
    for _ in range(8):
        policy.record_answer(20, stopped=True)
    assert policy.expected_left(0, 128) == (8 * 20 + 2 * 128) / 10
    assert policy.expected_left(25, 103) == 103  # longer than every answer seen: nothing says it ends soon
    for _ in range(8):
        policy.record_answer(16, stopped=False)  # cut at max_tokens = 16: it would have run on
    assert policy.expected_left(0, 128) == (8 * 20 + 8 * 128 + 2 * 128) / 18


def test_short_answers_stand_down_where_the_catch_up_would_not_pay_back():
    """Answers that stop after 20 tokens: a 300-token prompt's catch-up (0.02 s a token) is not worth drafting for
    them, though it is over the 128 tokens the request allows (the control: the same policy before any answer)."""

    def fresh() -> DraftPolicy:
        policy = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
        for _ in range(4):
            record(policy, 1, 0, 0, *_cpu_like_costs(1, 0))  # plain: 1 token in 0.1 s
        for _ in range(2):
            policy.catch_up.add(0.02)
        return policy

    def choose(policy: DraftPolicy) -> int:
        return policy.choose_k(1, [0.8], [3], lag_tokens=300, remaining_tokens=policy.expected_left(0, 128))

    assert choose(fresh()) == 3
    short = fresh()
    for _ in range(30):
        short.record_answer(20, stopped=True)
    assert choose(short) == 0


def test_the_catch_up_is_spread_over_the_tokens_the_lookups_leave_to_the_draft_model():
    """A sequence whose lookups give most of its tokens (an answer that copies its prompt) does not read a long
    prompt into the draft model for the few tokens no lookup finds; one whose lookups give none does (the
    control). The looked-up tokens are priced as catch-up too: the draft reads them before it drafts again. A
    sequence's own record outweighs the server-wide share once it has a few rounds."""

    def fresh() -> DraftPolicy:
        policy = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
        for _ in range(4):
            record(policy, 1, 0, 0, *_cpu_like_costs(1, 0))  # plain: 1 token in 0.1 s
        policy.record_prefill(0.05 * 1500, 1500)  # a caught-up token priced at 0.025 s
        return policy

    def choice(policy: DraftPolicy, looked_up: int, generated: int) -> int:
        covered = 512 * policy.lookup_coverage(looked_up, generated)
        return policy.choose_k(1, [0.8], [3], lag_tokens=256, remaining_tokens=512 - covered, covered_tokens=covered)

    assert choice(fresh(), 0, 100) == 3  # no lookups: 512 tokens carry the catch-up
    assert choice(fresh(), 96, 100) == 0  # 83 % expected from lookups: 88 tokens would carry 680
    server = fresh()
    assert server.lookup_coverage(0, 0) == 0.0  # no rounds yet: no share expected
    for _ in range(100):
        server.record_round(9, 9, looked_up=True)  # nine looked-up tokens and the target's own
    assert server.lookup_coverage(0, 0) == pytest.approx(0.9, abs=0.01)
    assert choice(server, 0, 0) == 0  # a new sequence starts from the server's share
    assert server.lookup_coverage(0, 200) < 0.1  # its own record outweighs it
    assert choice(server, 0, 200) == 3


def test_draft_policy_learns_acceptance_from_rounds():
    policy = DraftPolicy()
    assert policy.acceptance(0, 0) == pytest.approx(0.6)  # the prior
    for _ in range(500):
        policy.record_round(4, 1)  # one accepted, then a rejection: a = 0.5
    assert policy.acceptance(0, 0) == pytest.approx(0.5, abs=0.01)
    assert policy.acceptance(96, 4) > 0.9  # a sequence's own record outweighs the server-wide rate


def test_the_draft_models_k_follows_its_own_acceptance_not_the_lookups():
    """k governs the draft model, so the server-wide rate a new sequence starts from counts the model's rounds
    alone: copied text accepted in full must not make a model that is seldom right look worth resuming (on long
    prompts it could read each prompt into the draft model for drafts mostly rejected)."""
    policy = DraftPolicy()
    for _ in range(500):
        policy.record_round(8, 8, looked_up=True)  # lookups: every copied token accepted
    assert policy.acceptance(0, 0) == pytest.approx(0.6)  # still the prior
    for _ in range(500):
        policy.record_round(2, 0)  # the model: its first token rejected every round
    assert policy.acceptance(0, 0) < 0.05
    lookups_too = DraftPolicy()  # the control: were lookups counted, the rate would be theirs
    for _ in range(500):
        lookups_too.record_round(8, 8)
    assert lookups_too.acceptance(0, 0) > 0.95


def test_a_hybrid_proposers_lookups_and_model_steps_are_priced_apart():
    """A hybrid proposer drafts by free lookups on some steps and by the draft model on others. Each k's drafting
    is priced as the share of model steps times the model's cost: when the few steps that measured k = 2 happen
    to be lookups, k = 2 must not look free (one window mixing both kinds priced it so, and chose it over
    k = 3 for good)."""
    policy = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
    verify, model, lookup = 0.032, 0.0105, 0.0001  # seconds: a memory-bound verify pass; per drafted token
    chosen = []
    for step in range(80):
        k = policy.choose_k(1, [0.85], [3])
        modelled = step not in (6, 7) and step % 10 not in (0, 3, 6)  # k = 2's first steps look up; 30% do
        record(policy, 1, 1 if k else 0, k, (model * k if modelled else lookup) if k else 0.0, verify,
                      modelled=modelled)  # fmt: skip
        chosen.append(k)
    share = policy.model_share
    assert 0.6 < share < 0.8
    assert policy.draft_seconds(1, 2) == pytest.approx(share * 2 * model + (1 - share) * lookup, rel=0.01)
    # rates: k = 3 yields 3.19 tokens per 0.032 + 0.7 x 0.0315 s, k = 2 2.57 per 0.032 + 0.7 x 0.021 s
    assert chosen[-20:] == [3] * 20


def test_the_draft_models_price_is_its_drafting_and_catch_up_over_the_verify_pass():
    """What the suffix drafter weighs a lookup against: the model's drafting (its share, when several sequences
    draft in one pass) and the sequence's catch-up, in verify passes; 0 until both passes are measured."""
    policy = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
    assert policy.model_price(1, 1, 3, lag_tokens=10) == 0.0
    for _ in range(2):
        record(policy, 1, 1, 3, 0.03, 0.04, catch_up_seconds=0.02, catch_up_tokens=10)
    assert policy.model_price(1, 1, 3, lag_tokens=0) == pytest.approx(0.75)
    assert policy.model_price(1, 1, 3, lag_tokens=10) == pytest.approx((0.03 + 0.02) / 0.04)
    for _ in range(2):
        record(policy, 2, 2, 3, 0.04, 0.05)
    assert policy.model_price(2, 2, 3, lag_tokens=0) == pytest.approx(0.02 / 0.05)
    # steps that only looked tokens up never price the model
    lookups = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
    for _ in range(2):
        record(lookups, 1, 1, 3, 0.0001, 0.04, modelled=False)
    assert lookups.model_price(1, 1, 3, lag_tokens=0) == 0.0


# ---- lookups priced by the measured cost of wider passes --------------------------------------------------------
ZEN1 = {1: 0.090, 2: 0.140, 4: 0.2205, 8: 0.4023, 16: 0.77}  # an AVX2-only Zen 1: T(4)/T(1) 2.45, T(8)/T(1) 4.47
ZEN5 = {1: 0.022, 2: 0.0225, 4: 0.024, 8: 0.027, 16: 0.033}  # a memory-bound AVX-512 Zen 5: T(16)/T(1) 1.5


def _measured(passes: dict[int, float]) -> DraftPolicy:
    policy = DraftPolicy()
    for rows, seconds in passes.items():
        for _ in range(3):
            policy.record_pass(rows, seconds)
    return policy


def _lookup(alpha: float, length: int = 15):
    from verispec.engine.suffix import Lookup

    chances = tuple(alpha ** (j + 1) for j in range(length))
    return Lookup(list(range(length)), 8, sum(chances), chances=chances)


def test_a_pass_is_priced_by_its_rows_measured_interpolated_or_extrapolated():
    policy = _measured(ZEN1)
    assert policy.pass_seconds(4) == pytest.approx(0.2205)
    assert policy.pass_seconds(6) == pytest.approx((0.2205 + 0.4023) / 2)  # between 4 and 8
    assert policy.pass_seconds(32) == pytest.approx(0.77 + (0.77 - 0.4023) / 8 * 16)  # along 8 -> 16
    cost = policy.row_cost(1, 1)
    assert cost(3) == pytest.approx(2.45) and cost(0) == 1.0
    assert policy.row_cost(2, 2)(5) == pytest.approx(policy.pass_seconds(12) / 0.2205)  # 2 x 6 padded rows over 2 x 2
    assert DraftPolicy().row_cost(1, 1) is None  # nothing measured: lookups draft unpriced, and get measured


@pytest.mark.parametrize(
    ("passes", "alpha", "drafted"),
    [
        (ZEN1, 0.5, 0),  # seldom right on a compute-bound CPU: no wider pass pays, not even by one row
        (ZEN1, 0.8, 2),  # right often: 2.44 tokens for 2.0 plain steps (3 rows), 1.22x; 3 tokens would be 1.20x
        (ZEN1, 0.97, 6),  # copied text: 6.6 tokens for 4.1 plain steps, 1.61x; the 16-row pass only 1.35x
        (ZEN5, 0.5, 4),  # memory-bound: rows are cheap, a few pay even at a = 0.5 (1.72x)
        (ZEN5, 0.8, 9),
        (ZEN5, 0.97, 15),  # 8.6x
    ],
)
def test_a_lookup_drafts_only_the_rows_that_pay_on_this_machine(passes, alpha, drafted):
    from verispec.engine.suffix import priced

    lookup = priced(_lookup(alpha), _measured(passes).row_cost(1, 1))
    assert (len(lookup.tokens) if lookup is not None else 0) == drafted


def test_in_a_batch_a_lookup_must_pay_for_widening_everyones_pass():
    """Four sequences, the others plain (one row each): a 3-token lookup makes the pass 4 x 4 rows; on Zen 1 that
    costs what 4 x 1 rows do times 0.77 / 0.2205, which a = 0.97 does not repay (1 + 2.8 / 4 tokens per row)."""
    from verispec.engine.suffix import priced

    policy = _measured(ZEN1)
    assert priced(_lookup(0.97, 3), policy.row_cost(1, 1)) is not None
    assert priced(_lookup(0.97, 3), policy.row_cost(4, 1), batch=4) is None


def test_passes_slowed_by_other_load_do_not_change_their_widths_cost():
    """Other load only ever slows a pass: a width costs the least of its last passes, so passes measured while the
    machine was busy (as many as the quiet ones, 10x as long) price nothing differently."""
    from verispec.engine.suffix import priced

    policy = _measured(ZEN1)
    for _ in range(3):
        policy.record_pass(8, 10 * ZEN1[8])
    assert policy.pass_seconds(8) == pytest.approx(ZEN1[8])
    assert len(priced(_lookup(0.97), policy.row_cost(1, 1)).tokens) == 6  # as without the busy pass


def test_pass_costs_never_fall_as_the_pass_widens():
    """A width measured only while the machine was busy (its least pass 5x the others') is pooled with the wider
    widths (weighted by their passes): no wider pass is priced cheaper than a narrower one, and a width that was
    measured normally is not priced cheaper than measured either."""
    policy = _measured(ZEN1)
    policy.record_pass(5, 5 * ZEN1[4])
    costs = [policy.pass_seconds(rows) for rows in range(1, 33)]
    assert all(b >= a for a, b in zip(costs, costs[1:], strict=False))
    assert policy.pass_seconds(4) == pytest.approx(ZEN1[4])
    assert policy.pass_seconds(16) >= ZEN1[16]


def test_with_no_wider_pass_measured_a_lookup_drafts_unpriced_once_to_measure_one():
    """Only plain steps measured (one row): no cost is known for any wider pass, so the lookup drafts as found, and
    its pass is measured; never dropping lookups for want of a measurement that only a lookup can make."""
    from verispec.engine.suffix import priced

    policy = _measured({1: ZEN1[1]})
    lookup = _lookup(0.5)
    assert priced(lookup, policy.row_cost(1, 1)) is lookup


def test_a_long_catch_up_waits_for_the_answer_to_show_itself_where_short_answers_are_common():
    """A young sequence's catch-up is paid now or after evidence_tokens tokens, whichever the answers seen so far
    make worth more: where most answers end within 12 tokens, a 256-token prompt's catch-up (0.77 s against 0.036 s
    saved a drafted token) waits; where they run on, or nothing is known of them, or the catch-up is short, or the
    sequence has written its evidence tokens (the controls), it is paid at once."""

    def policy_after(answers: list[tuple[int, bool]]) -> DraftPolicy:
        policy = DraftPolicy(PolicySettings(k_max=3, probe_every=1000))
        for _ in range(2):
            for k in (1, 2, 3):  # k = 3: 2.95 tokens in 0.19 s, the best
                record(policy, 1, 1, k, *_cpu_like_costs(1, k), catch_up_seconds=0.03, catch_up_tokens=10)
            record(policy, 1, 0, 0, 0.0, 0.1)  # plain: 1 token in 0.1 s
        for length, stopped in answers:
            policy.record_answer(length, stopped)
        return policy

    def ask(policy: DraftPolicy, lag: int, young: list[tuple[int, int]]) -> int:
        return policy.choose_k(1, [0.8], [3], lag_tokens=lag, remaining_tokens=128, young=young)

    short, long = policy_after([(12, True)] * 20), policy_after([(128, False)] * 20)
    assert ask(short, 256, [(0, 128)]) == 0
    assert ask(short, 256, [(10, 118)]) == 0  # six tokens to go: most answers end before
    assert ask(short, 256, []) == 3  # written its evidence tokens: the usual rule
    assert ask(short, 20, [(0, 128)]) == 3  # 0.06 s of catch-up repays itself on 12 tokens
    assert ask(long, 256, [(0, 128)]) == 3
    assert ask(policy_after([]), 256, [(0, 128)]) == 3  # a new server: nothing known of its answers


def test_the_draft_models_acceptance_fades_back_to_its_prior_while_it_rests():
    """A server-wide acceptance learned on one kind of text (a translation's 0.3) returns to the prior 0.6 over the
    rounds where the model does not draft, so the model is tried again; without those rounds it stays (control)."""
    low = DraftPolicy()
    for _ in range(300):
        low.record_round(3, 0)  # every draft rejected at its first token
    assert low.acceptance(0, 0) < 0.1
    rested = DraftPolicy(accepted=low.accepted, rejected=low.rejected)
    for _ in range(500):
        rested.record_round(0, 0)  # plain rounds
        rested.record_round(4, 4, looked_up=True)  # lookups say nothing of the model
    assert rested.acceptance(0, 0) == pytest.approx(0.6, abs=0.02)
    assert low.acceptance(0, 0) < 0.1
    high = DraftPolicy()
    for _ in range(300):
        high.record_round(3, 3)
        high.record_round(0, 0)  # rests between the model's rounds barely move what it shows
    assert high.acceptance(0, 0) > 0.95


def _serve(policy: DraftPolicy, requests: int, alpha: float, draft_step: float, rng, tokens: int = 40):
    """`requests` requests of `tokens` tokens, one at a time, on simulated costs (a plain step 0.05 s, a verify pass
    of k + 1 rows 0.05 (1 + 0.05 k) s, `draft_step` s per drafted token, 2 ms per token the draft catches up on),
    each drafted token accepted with probability `alpha`. Returns the tokens the draft model drafted per request, and
    the seconds they all took."""
    drafted_per_request, seconds = [], 0.0
    for _ in range(requests):
        written, lag, drafted_here, accepted, rejected = 0, 20, 0, 0, 0  # a 20-token prompt to catch up on first
        while written < tokens:
            left = tokens - written
            k = policy.choose_k(1, [policy.acceptance(accepted, rejected)], [min(4, left - 1) or 1],
                                lag_tokens=lag, remaining_tokens=float(left))  # fmt: skip
            k = min(k, max(left - 1, 0))
            kept = 0
            while kept < k and rng.random() < alpha:
                kept += 1
            catch_up = 0.002 * lag if k else 0.0
            step = (draft_step * k, 0.05 * (1 + 0.05 * k))
            record(policy, 1, 1 if k else 0, k, *step, catch_up_seconds=catch_up, catch_up_tokens=lag if k else 0)
            seconds += sum(step) + catch_up
            policy.record_round(k, kept)
            if k:
                drafted_here += k
                accepted, rejected = accepted + kept, rejected + (kept < k)
                lag = 0
            written += kept + 1
            lag += 0 if k else kept + 1
        policy.record_answer(tokens, True)
        drafted_per_request.append(drafted_here)
    return drafted_per_request, seconds


def test_a_draft_model_turned_off_by_a_burst_of_bad_text_comes_back_on_good_text():
    """1,000 requests on which the draft model does not pay (its drafts rarely accepted, and its steps 5x dearer
    while the machine was busy), then 20 on which it does (a = 0.9, a draft step 0.2 of a target step): the model
    drafts again on at least 15 of the 20. A long-running server once drafted 16 tokens with the model in 40 minutes
    and never came back: nothing but its own rounds could show it that the text and the load had changed. The trials
    cost at most explore_share of the bad text's time. The control, without trials and with stale costs kept, stays
    plain on the good text."""
    import random

    runs = {}
    for name, settings in (("trials", PolicySettings(k_max=4)),
                           ("control", PolicySettings(k_max=4, explore_share=0.0, stale_steps=10**9))):  # fmt: skip
        policy, rng = DraftPolicy(settings), random.Random(7)
        _, bad_seconds = _serve(policy, 1000, alpha=0.05, draft_step=0.05, rng=rng)
        good, _ = _serve(policy, 20, alpha=0.9, draft_step=0.01, rng=rng)
        runs[name] = (sum(1 for tokens in good if tokens), bad_seconds, policy.exploring.trials)
    assert runs["trials"][0] >= 15, runs
    assert runs["trials"][1] <= runs["control"][1] * (1 + PolicySettings().explore_share), runs
    assert runs["control"][0] < 15, runs  # without trials the target is missed
