"""The engine on the tiny pair, in process: padded batches, the draft's catch-up, greedy identity with every
proposer and policy, seeded sampling equal whatever runs beside, chunked prefill, ignore_eos, context limits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from verispec import SpeculativeGenerator
from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams
from verispec.engine.draft_model import CATCH_UP_WIDTH, BatchedDrafter, draft_cut_for, draft_view
from verispec.engine.drafting import DraftJob, Proposal
from verispec.engine.methods import DraftModelUse, Method, register, unregister
from verispec.engine.policy import DraftPolicy, StepCost
from verispec.engine.prefixes import reusable_prefill
from verispec.engine.proposer import LookupThenModel
from verispec.engine.requests import EngineRequest, ErrorEvent, FinishEvent, StreamChunk
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.errors import InvalidParameterError
from verispec.models.passes import padded_forward
from verispec.testing import prefer_the_end_token, tiny_pair

from real_models import smollm2_path

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "import numpy as np\n\n# compute the mean of"]  # fmt: skip


def _record(policy: DraftPolicy, batch: int, drafting: int, k: int, draft: float, verify: float, **more) -> None:
    """One step's costs, `draft` without the catch-up (StepCost's draft_seconds includes it)."""
    cost = StepCost(batch=batch, drafting=drafting, k=k, draft_seconds=draft + more.get("catch_up_seconds", 0.0),
                    verify_seconds=verify, **more)  # fmt: skip
    policy.record(cost)


def test_padded_rows_do_not_change_other_rows(tiny):
    target, _ = tiny
    model = target.model
    prompts = [[1, 2, 3, 4, 5], [7], [9, 8, 7, 6, 5, 4, 3, 2, 1], [42, 43]]
    rows = [[11, 12, 13], [14], [15, 16], [17, 18, 19, 20, 21]]
    solo_cache, batch_cache = model.new_cache(4, 64), model.new_cache(4, 64)
    solo = []
    for slot, (prompt, row) in enumerate(zip(prompts, rows, strict=True)):
        model(torch.tensor([prompt]), solo_cache, [slot])
        model(torch.tensor([prompt]), batch_cache, [slot])
        solo.append(model(torch.tensor([row]), solo_cache, [slot])[0])
    batched = padded_forward(model, batch_cache, rows, [0, 1, 2, 3])
    for slot, (expect, got) in enumerate(zip(solo, batched, strict=True)):
        torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-5)
        assert batch_cache.lengths[slot] == len(prompts[slot]) + len(rows[slot])


def test_the_draft_model_reuses_only_its_own_partitions_context(tiny):
    """A slot of another partition (tenant) never lends its keys and values, and a slot taken over by another
    partition forgets what it held: what the draft reads costs each request as if no other tenant had sent it."""
    target, draft = tiny
    vocab = target.model.config.vocab_size
    drafter = BatchedDrafter(draft.model, vocab, 2, 128, None)
    tokens = list(range(1, 61))
    drafter.admit(0, "victim")
    drafter.propose([DraftJob(slot=0, tokens=tokens, k=1, params=SamplingParams(), noise=KeyedNoise(0, vocab))])
    drafter.admit(1, "attacker")
    assert drafter.lag(1, tokens) == len(tokens) - CATCH_UP_WIDTH  # all of it: slot 0 is not the attacker's
    drafter.admit(0, "attacker")  # the victim's slot taken over
    assert drafter.lag(0, tokens) == len(tokens) - CATCH_UP_WIDTH and not drafter.fed[0]
    drafter.admit(1, "victim")
    drafter.propose([DraftJob(slot=1, tokens=tokens, k=1, params=SamplingParams(), noise=KeyedNoise(0, vocab))])
    drafter.admit(0, "victim")  # the control: a colleague's slot lends what it holds
    assert drafter.lag(0, tokens) == 0


def test_draft_lag_is_what_propose_then_feeds_alone(tiny):
    """The draft policy prices resuming drafting by `lag`: it must count what the slot really lacks, also when
    the slot holds a longer earlier request that shares only a prefix (it once counted 1 token there)."""
    target, draft = tiny
    drafter = BatchedDrafter(draft.model, target.model.config.vocab_size, 1, 128, None)
    greedy = SamplingParams()
    old, new = list(range(1, 61)), [*range(1, 11), *range(100, 130)]
    # a new slot, a short step on, a shorter request sharing 10 tokens, a step on, back into its own prompt
    for tokens in (old, old + [61, 62, 63], new, new + [7], new[:12]):
        lag = drafter.lag(0, tokens)
        drafter.propose(
            [DraftJob(slot=0, tokens=tokens, k=1, params=greedy, noise=KeyedNoise(0, target.model.config.vocab_size))]
        )
        assert lag == drafter.spent.catch_up_tokens
    assert drafter.lag(0, new) == len(new) - 12 - CATCH_UP_WIDTH
    assert drafter.lag(0, old) == len(old) - 10 - CATCH_UP_WIDTH


def test_a_bounded_draft_context_keeps_the_sink_and_the_last_window():
    """StreamingLLM's layout: the first DRAFT_SINK tokens, then the prompt's last `window` and what follows; fixed
    at the start, so the view only grows as the sequence generates."""
    prompt = list(range(100, 130))
    cut = draft_cut_for(len(prompt), 8)
    assert draft_view(prompt + [1, 2], cut) == [100, 101, 102, 103, *range(122, 130), 1, 2]
    assert draft_cut_for(len(prompt), 0) == 0 and draft_cut_for(12, 8) == 0  # off; a prompt the window holds
    assert draft_view(prompt, 0) is prompt


def test_the_draft_catches_up_on_the_window_only(tiny):
    """A 200-token prompt and a window of 16: the draft model reads 20 tokens, whatever the prompt's length, and
    its proposals come from that view (the same as drafting from the view alone); without a window it reads all."""
    target, draft = tiny
    prompt = [(7 * i) % 250 for i in range(200)]
    for window, read in ((16, 20), (0, 200)):
        config = SchedulerConfig(
            max_num_seqs=1, max_model_len=256, draft_window=window, draft_policy="always", speculative_method="draft"
        )
        scheduler, events = Scheduler(target, draft, config), []
        scheduler.submit(
            EngineRequest(request_id="0", prompt_ids=prompt, params=SamplingParams(), max_tokens=8, sink=events.append)
        )
        scheduler.admitter.admit()
        scheduler.prefill.step()
        seq = next(iter(scheduler.running.values()))
        assert scheduler.proposer.lag(seq.slot, seq.tokens, seq.draft_tokens) == read - CATCH_UP_WIDTH
        scheduler.step()  # drafts: the draft model reads the view
        view = seq.draft_tokens if window else seq.tokens
        fed = scheduler.proposer.fed[seq.slot]
        assert len(view) == read + len(seq.tokens) - len(prompt)
        assert fed[:read] == view[:read] and read <= len(fed) <= len(view) + config.num_speculative_tokens


def _run_scheduler(
    target,
    draft,
    requests: list[tuple[str, SamplingParams, bool]],
    policy: str,
    method: str = "draft",
    draft_vocab: int | None = None,
    draft_window: int = 0,
) -> list[list]:
    config = SchedulerConfig(
        max_num_seqs=3, max_model_len=256, draft_policy=policy, speculative_method=method,
        method_options={"draft_vocab": draft_vocab}, draft_window=draft_window,
    )  # fmt: skip
    scheduler = Scheduler(target, draft, config)
    events: list[list] = []
    for i, (prompt, params, speculative) in enumerate(requests):
        events.append([])
        ids = target.tokenizer.encode(prompt)
        scheduler.submit(
            EngineRequest(
                request_id=str(i),
                prompt_ids=ids,
                params=params,
                max_tokens=30,
                sink=events[-1].append,
                speculative=speculative,
            )
        )
    scheduler.run_until_idle(max_steps=2000)
    return events


POLICY_METHODS = [
    ("always", "draft", None, 0), ("auto", "draft", None, 0), ("never", "draft", None, 0), ("always", "ngram", None, 0),
    ("always", "draft", 100, 0),  # a restricted draft head (models/draft_head.py)
    ("always", "hybrid", None, 0), ("auto", "hybrid", None, 0),
    ("always", "draft", None, 3), ("always", "hybrid", None, 3),  # the draft reads 4 + 3 tokens of a long prompt
]  # fmt: skip


@pytest.mark.parametrize(("policy", "method", "draft_vocab", "window"), POLICY_METHODS)
def test_scheduler_greedy_outputs_equal_plain_decoding(policy, method, draft_vocab, window, tiny):
    target, draft = tiny
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    prompts = ["hello world", "a", "The quick brown fox", "xyz" * 8, "1234", "ok"]
    requests = [(p, SamplingParams(), i % 3 != 0) for i, p in enumerate(prompts)]
    draft = None if method == "ngram" else draft
    events = _run_scheduler(target, draft, requests, policy, method, draft_vocab, window)  # 6 requests, 3 slots
    for prompt, request_events in zip(prompts, events, strict=True):
        expected = plain.generate(prompt, max_tokens=30)
        final = request_events[-1]
        assert isinstance(final, FinishEvent)
        assert final.output.token_ids == expected.token_ids
        streamed = [e for e in request_events[:-1] if isinstance(e, StreamChunk)]
        assert "".join(e.text for e in streamed) == expected.text
        assert len([e for e in streamed if e.token_id is not None]) == len(expected.token_ids)
    drafted = sum(e[-1].output.stats.drafted for e in events)
    assert (drafted == 0) == (policy == "never")


def test_scheduler_on_the_native_kernels_equals_plain_decoding(one_thread):
    """The server's default weights on a CPU: the GGUF blocks on the native kernels. Batched verify passes
    (rows of different lengths, some speculating, some not) give each request its plain greedy output."""
    from verispec import load_model
    from verispec.kernels import native

    if not native.available():
        pytest.skip("native kernels not compiled")
    model = load_model(str(smollm2_path()), quantization="gguf", progress=False)
    assert type(model.model.lm_head).__name__ == "NativeLinear"
    plain = SpeculativeGenerator(model, None, max_seq_len=256, progress=False)
    prompts = PROMPTS
    requests = [(p, SamplingParams(), i % 3 != 2) for i, p in enumerate(prompts)]
    events = _run_scheduler(model, model, requests, "always")
    for prompt, request_events in zip(prompts, events, strict=True):
        assert request_events[-1].output.token_ids == plain.generate(prompt, max_tokens=30).token_ids, prompt
    assert sum(e[-1].output.stats.drafted for e in events) > 0


def test_a_request_that_cannot_start_fails_alone(tiny):
    """An error while admitting one request answers that request and frees its slot; the others go on."""
    target, draft = tiny

    class Broken(SamplingParams):
        def noise(self, vocab):
            raise RuntimeError("broken")

    scheduler, events = Scheduler(target, draft, SchedulerConfig(max_num_seqs=2, max_model_len=64)), {}
    for name, params in (("ok", SamplingParams()), ("broken", Broken())):
        sink = lambda event, name=name: events.setdefault(name, []).append(event)  # noqa: E731
        scheduler.submit(
            EngineRequest(
                request_id=name, prompt_ids=target.tokenizer.encode("hello"), params=params, max_tokens=8, sink=sink
            )
        )
    scheduler.run_until_idle()
    assert [type(e) for e in events["broken"]] == [ErrorEvent]
    assert isinstance(events["ok"][-1], FinishEvent) and len(events["ok"][-1].output.token_ids) == 8
    assert sorted(scheduler.free_slots) == [0, 1] and not scheduler.active


class _FailsAt:
    """Wraps a per-sequence function so it raises for one request from its `at`-th call on: a bad row in a step."""

    def __init__(self, function, is_bad, at: int):
        self.function, self.is_bad, self.at, self.calls = function, is_bad, at, 0

    def __call__(self, *args):
        if self.is_bad(*args):
            self.calls += 1
            if self.calls >= self.at:
                raise RuntimeError("a bad row")
        return self.function(*args)


@pytest.mark.parametrize("where", ["verdict", "draft", "advance"])
def test_a_row_that_fails_mid_generation_fails_only_its_request(where, tiny, monkeypatch):
    """Three greedy requests decode together; one of them raises in its verification row, its draft, or while its
    tokens are emitted, a few steps in. That request alone ends with an error event; the others finish with
    their plain greedy outputs (the failure once reached every request of the step)."""
    target, draft = tiny
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    scheduler = Scheduler(target, draft, SchedulerConfig(max_num_seqs=3, max_model_len=256, draft_policy="always"))
    bad = lambda request_id: request_id == "1"  # noqa: E731
    if where == "verdict":
        wrapped = _FailsAt(scheduler.verifier.settle, lambda seq, *_: bad(seq.request.request_id), 3)
        monkeypatch.setattr(scheduler.verifier, "settle", wrapped)
    elif where == "advance":
        wrapped = _FailsAt(scheduler.emitter.advance, lambda seq, *_: bad(seq.request.request_id), 3)
        monkeypatch.setattr(scheduler.emitter, "advance", wrapped)
    else:
        slot_of = {}
        wrapped = _FailsAt(scheduler.proposer.propose, lambda jobs: any(slot_of.get(j.slot) for j in jobs), 3)
        monkeypatch.setattr(scheduler.proposer, "propose", wrapped)
    events: dict[str, list] = {}
    for i, prompt in enumerate(["hello world", "The quick brown fox", "1234"]):
        sink = events.setdefault(str(i), []).append
        scheduler.submit(
            EngineRequest(
                request_id=str(i),
                prompt_ids=target.tokenizer.encode(prompt),
                params=SamplingParams(),
                max_tokens=30,
                sink=sink,
            )
        )
    if where == "draft":
        scheduler.step()  # admitted: the bad request's slot is known
        slot_of.update({seq.slot: bad(seq.request.request_id) for seq in scheduler.running.values()})
    scheduler.run_until_idle(max_steps=2000)
    assert wrapped.calls >= 3
    assert isinstance(events["1"][-1], ErrorEvent) and events["1"][-1].error is None  # verispec's fault: a 500
    for i, prompt in (("0", "hello world"), ("2", "1234")):
        assert events[i][-1].output.token_ids == plain.generate(prompt, max_tokens=30).token_ids
    assert sorted(scheduler.free_slots) == [0, 1, 2] and not scheduler.active


def test_long_prompts_are_prefilled_in_chunks_between_decode_steps(tiny):
    """Running requests keep decoding while a long prompt is prefilled, and chunking does not change its output."""
    target, draft = tiny
    long_prompt = target.tokenizer.encode("the quick brown fox jumps over the lazy dog " * 3)

    def run(requests):
        config = SchedulerConfig(max_num_seqs=2, max_model_len=256, draft_policy="always", prefill_chunk=8)
        scheduler, order = Scheduler(target, draft, config), []
        for name, ids in requests:
            sink = lambda event, name=name: order.append((name, event))  # noqa: E731
            scheduler.submit(
                EngineRequest(request_id=name, prompt_ids=ids, params=SamplingParams(), max_tokens=40, sink=sink)
            )
            scheduler.step()
        scheduler.run_until_idle()
        return order

    together = run([("short", target.tokenizer.encode("ok")), ("long", long_prompt)])
    alone = run([("long", long_prompt)])
    outputs = lambda order: {n: e.output.token_ids for n, e in order if isinstance(e, FinishEvent)}  # noqa: E731
    assert outputs(together)["long"] == outputs(alone)["long"]
    names = [name for name, event in together if isinstance(event, StreamChunk)]
    chunks = -(-(len(long_prompt) - 1) // 8)
    assert len(long_prompt) > 3 * 8 and names.index("long") >= chunks - 1  # "short" decoded during each chunk


def test_reusable_prefill_takes_whole_chunks_that_end_where_prefilling_would_end_them():
    record = list(range(20))  # a slot prefilled 20 tokens in chunks of 8: [0, 8), [8, 16), [16, 20)
    assert reusable_prefill(record, list(range(20)), 0, 8) == 20
    assert reusable_prefill(record, list(range(20)), 8, 8) == 20  # from a later chunk boundary
    assert reusable_prefill(record, [*range(19), 99], 0, 8) == 16  # the last chunk differs
    assert reusable_prefill(record, list(range(18)), 0, 8) == 16  # [16, 18) would be its own, shorter chunk
    assert reusable_prefill(record, list(range(30)), 0, 8) == 16  # [16, 24) was never prefilled as one chunk
    assert reusable_prefill(record, [99, *range(1, 20)], 0, 8) == 0
    assert reusable_prefill([], list(range(5)), 0, 8) == 0
    # a row-invariant model's prefill (chunk None): to where the tokens first differ
    assert reusable_prefill(record, [*range(13), 99], 0, None) == 13
    assert reusable_prefill(record, list(range(30)), 5, None) == 20
    assert reusable_prefill(record, [99, *range(1, 20)], 0, None) == 0


def test_requests_sharing_a_prompt_prefill_it_once_and_decode_as_alone(tiny):
    """n choices of one prompt (and a later request repeating it, in the slot it left): the first prefills it,
    the others copy its keys and values chunk by chunk; each decodes exactly as it would alone, greedy or
    seeded. A prompt sharing only its first chunk reuses that chunk."""
    target, draft = tiny
    prompt = target.tokenizer.encode("the quick brown fox jumps over the lazy dog " * 3)
    other = prompt[:8] + target.tokenizer.encode(" and now something else entirely")
    config = SchedulerConfig(max_num_seqs=3, max_model_len=256, draft_policy="always", prefill_chunk=8)
    requests = [
        ("a", prompt, SamplingParams()), ("b", prompt, SamplingParams(temperature=0.9, seed=1)),
        ("c", prompt, SamplingParams(temperature=0.9, seed=2)), ("d", other, SamplingParams()),
        ("e", prompt, SamplingParams()),
    ]  # fmt: skip

    def run(batch):
        scheduler, outputs = Scheduler(target, draft, config), {}
        for name, ids, params in batch:
            sink = lambda event, name=name: outputs.update({name: event}) if isinstance(event, FinishEvent) else None  # noqa: E731
            scheduler.submit(EngineRequest(request_id=name, prompt_ids=ids, params=params, max_tokens=30, sink=sink))
        scheduler.run_until_idle()
        return scheduler, {name: event.output for name, event in outputs.items()}

    scheduler, together = run(requests)
    for name, ids, params in requests:
        alone = run([(name, ids, params)])[1][name]
        assert together[name].token_ids == alone.token_ids, name
    assert together["a"].stats.drafted > 0
    assert [together[n].stats.time_prefill > 0 for n in "abcde"] == [True, False, False, True, False]
    prefilled = len(prompt) - 1
    assert scheduler.metrics.prefill_reused_tokens._value.get() == 2 * prefilled + 8 + prefilled


def test_chunks_equal_after_a_different_start_are_not_reused(tiny):
    """Keys and values hold every token before them: a prompt whose first chunk differs from another slot's
    cannot take that slot's later chunks, equal as their tokens are (it once did, and decoded from a cache of
    the other prompt's start)."""
    target, draft = tiny
    shared = target.tokenizer.encode(" over the lazy dog and the quick brown fox " * 2)
    first, second = [5, 6, 7, 8, 9, 10, 11, 12] + shared, [50, 60, 70, 80, 90, 100, 110, 120] + shared
    assert reusable_prefill(first, second, 8, 8) == 8
    config = SchedulerConfig(max_num_seqs=2, max_model_len=256, draft_policy="never", prefill_chunk=8)

    def run(prompts):
        scheduler, outputs = Scheduler(target, draft, config), {}
        for name, ids in prompts:
            sink = lambda event, name=name: outputs.update({name: event}) if isinstance(event, FinishEvent) else None  # noqa: E731
            scheduler.submit(
                EngineRequest(request_id=name, prompt_ids=ids, params=SamplingParams(), max_tokens=12, sink=sink)
            )
        scheduler.run_until_idle()
        return {name: event.output.token_ids for name, event in outputs.items()}

    assert run([("a", first), ("b", second)])["b"] == run([("b", second)])["b"]


@pytest.mark.parametrize(("draft_vocab", "method"), [(None, "draft"), (100, "draft"), (None, "hybrid")])
def test_scheduler_seeded_sampling_matches_the_single_sequence_loop(draft_vocab, method, tiny):
    """A seeded sampled request draws the same random stream beside other requests as alone (generate's batch
    of one)."""
    target, draft = tiny
    spec = SpeculativeGenerator(
        target, draft, max_seq_len=256, progress=False, adaptive=False, draft_vocab=draft_vocab,
        speculative_method=method,
    )  # k = 4, as served  # fmt: skip
    expected = spec.generate("hello", max_tokens=30, temperature=0.8, top_k=50, seed=3).token_ids
    requests = [
        ("hello", SamplingParams(temperature=0.8, top_k=50, seed=3), True),
        ("something else", SamplingParams(temperature=1.0, seed=1), True),
        ("greedy", SamplingParams(), False),
    ]
    events = _run_scheduler(target, draft, requests, "always", method, draft_vocab=draft_vocab)
    assert events[0][-1].output.token_ids == expected
    assert events[0][-1].output.stats.drafted > 0


def test_hybrid_drafting_needs_a_draft_model(tiny):
    target, _ = tiny
    with pytest.raises(InvalidParameterError, match="needs a draft model"):
        Scheduler(target, None, SchedulerConfig(speculative_method="hybrid"))


def test_scheduler_does_not_draft_while_a_prompt_prefills(tiny, monkeypatch):
    """While a prompt prefills (a chunk per step), a burst is starting: drafting for the sequences already
    decoding would finish them before the joining ones, which does not end the burst sooner (bench-serve's
    waves at two sequences lost ~2% to it), and would read their prompts into the draft."""
    target, draft = tiny
    config = SchedulerConfig(
        max_num_seqs=2, max_model_len=256, num_speculative_tokens=2, prefill_chunk=4, speculative_method="draft"
    )
    scheduler = Scheduler(target, draft, config)
    policy = scheduler.policy
    for _ in range(3):  # one sequence: k = 2 pays (1.96 tokens in 0.012 s against 1 in 0.01 s) once caught up
        _record(policy, 1, 1, 2, 0.002, 0.010, catch_up_seconds=0.05, catch_up_tokens=10)
        _record(policy, 1, 0, 0, 0.0, 0.010)
    monkeypatch.setattr(scheduler.drafting, "record_costs", lambda *args: None)  # keep these costs
    chosen, choose = [], policy.choose_k
    monkeypatch.setattr(policy, "choose_k", lambda *args, **kwargs: chosen.append(choose(*args, **kwargs)) or 0)
    first, second = [*range(1, 31)], [*range(40, 80)]  # the draft lacks 30 tokens of the first; 10 chunks
    for i, ids in enumerate((first, second)):
        scheduler.submit(
            EngineRequest(
                request_id=str(i), prompt_ids=ids, params=SamplingParams(), max_tokens=200, sink=lambda event: None
            )
        )
    while not scheduler.running or any(seq.prefilling for seq in scheduler.running.values()):
        scheduler.step()
    assert len(chosen) == 11 and set(chosen) == {0}  # the first decoded alone, plainly, while the second prefilled
    alone = scheduler.running[0]
    lag = scheduler.proposer.lag(alone.slot, alone.tokens)
    assert lag == 30 + 11 - CATCH_UP_WIDTH  # (the wrapper kept every step plain: the draft never read anything)
    # alone, without a prompt joining, the policy would draft k = 2 and pay the catch-up back over 189 tokens
    left = scheduler.drafting.tokens_left(alone)
    assert choose(1, [policy.acceptance(0, 0)], [2], lag_tokens=lag, remaining_tokens=left) == 2


def test_scheduler_does_not_draft_while_a_request_waits_for_a_free_slot(tiny, monkeypatch):
    """Over HTTP a burst's second request arrives while the first prefills, after this step's admission: the
    first's first decoding step must not draft either (bench-serve's waves at two sequences lost 1-2% to it)."""
    target, draft = tiny
    config = SchedulerConfig(max_num_seqs=2, max_model_len=256, num_speculative_tokens=2, speculative_method="draft")
    scheduler = Scheduler(target, draft, config)
    policy = scheduler.policy
    for _ in range(4):
        _record(policy, 1, 1, 2, 0.002, 0.010)
        _record(policy, 1, 0, 0, 0.0, 0.010)
    monkeypatch.setattr(scheduler.drafting, "record_costs", lambda *args: None)
    chosen, choose = [], policy.choose_k
    monkeypatch.setattr(policy, "choose_k", lambda *args, **kwargs: chosen.append(choose(*args, **kwargs)) or 0)
    prefill = scheduler.prefill.step

    def prefill_then_second_arrives() -> None:
        prefill()
        if not chosen:
            scheduler.submit(
                EngineRequest(
                    request_id="1",
                    prompt_ids=[*range(40, 50)],
                    params=SamplingParams(),
                    max_tokens=200,
                    sink=lambda event: None,
                )
            )

    monkeypatch.setattr(scheduler.prefill, "step", prefill_then_second_arrives)
    scheduler.submit(
        EngineRequest(
            request_id="0", prompt_ids=[*range(1, 11)], params=SamplingParams(), max_tokens=200, sink=lambda event: None
        )
    )
    scheduler.step()
    assert chosen == [0]
    assert choose(1, [0.9], [2]) == 2  # alone, it would have drafted


@pytest.mark.parametrize("k", [1, 4])
def test_scheduler_fills_the_context_exactly_and_resumes_drafting_after_a_pause(k, tiny):
    """Requests that end exactly at the context limit, with drafting suspended then resumed (long catch-up)."""
    target, draft = tiny
    plain = SpeculativeGenerator(target, None, max_seq_len=64, progress=False)
    config = SchedulerConfig(
        max_num_seqs=2, max_model_len=64, num_speculative_tokens=k, draft_policy="never", speculative_method="draft"
    )
    scheduler = Scheduler(target, draft, config)
    prompts = [target.tokenizer.encode("0123456789"), target.tokenizer.encode("z")]
    events: list[list] = [[], []]
    for i, ids in enumerate(prompts):
        scheduler.submit(
            EngineRequest(
                request_id=str(i),
                prompt_ids=ids,
                params=SamplingParams(),
                max_tokens=64 - len(ids),
                sink=events[i].append,
            )
        )
    for _ in range(20):  # plain steps: the draft caches fall 20 tokens behind
        scheduler.step()
    scheduler.policy.settings = replace(scheduler.policy.settings, mode="always")
    scheduler.run_until_idle(max_steps=200)
    for ids, request_events in zip(prompts, events, strict=True):
        output = request_events[-1].output
        assert output.token_ids == plain.generate(ids, max_tokens=64 - len(ids)).token_ids
        assert output.stats.drafted > 0


def test_ignore_eos_requests_generate_max_tokens_through_end_tokens():
    """A target whose head always prefers the end token: a request stops at once, unless it sets ignore_eos;
    then it generates max_tokens end tokens, drafted or not, as `generate` does."""
    target, draft = tiny_pair()
    eos = prefer_the_end_token(target)
    scheduler = Scheduler(target, draft, SchedulerConfig(max_num_seqs=3, max_model_len=64, draft_policy="always"))
    events: dict[str, list] = {}
    ids = target.tokenizer.encode("hello")
    for name, ignore, speculative in (("stops", False, True), ("drafted", True, True), ("plain", True, False)):
        sink = events.setdefault(name, []).append
        request = EngineRequest(
            request_id=name,
            prompt_ids=ids,
            params=SamplingParams(),
            max_tokens=12,
            sink=sink,
            speculative=speculative,
            ignore_eos=ignore,
        )
        scheduler.submit(request)
    scheduler.run_until_idle()
    outputs = {name: found[-1].output for name, found in events.items()}
    assert outputs["stops"].token_ids == [] and outputs["stops"].finish_reason == "stop"
    for name in ("drafted", "plain"):
        assert outputs[name].token_ids == [eos] * 12 and outputs[name].finish_reason == "length", name
        assert outputs[name].stats.new_tokens == 12
    assert outputs["drafted"].stats.drafted > 0
    expected = SpeculativeGenerator(target, None, max_seq_len=64, progress=False).generate(
        ids, max_tokens=12, ignore_eos=True
    )
    assert outputs["drafted"].token_ids == expected.token_ids


class Bigram:
    """The Lookups of docs/architecture.md's example method: after the last earlier occurrence of the sequence's
    last token, the tokens that followed it."""

    always = True  # drafts even when the draft model's k is 0 (lookups are priced by the rows they add)

    def find(self, jobs, model):
        return [self._lookup(job) for job in jobs]

    def _lookup(self, job):
        last, before = job.tokens[-1], job.tokens[:-1]
        if last not in before:
            return None
        start = len(before) - before[::-1].index(last)
        return Proposal(torch.tensor(job.tokens[start : start + job.widest]), looked_up=True)

    def drafts(self, slot, tokens):
        return tokens[-1] in tokens[:-1]

    def admit(self, slot, partition): ...

    def finished(self, slot, output, partition): ...

    def forget(self): ...


def test_a_method_added_to_the_registry_drafts_and_keeps_greedy_output(tiny):
    """A new drafting method is one class and one registry entry (engine/methods.py); the engine runs it like its own
    and the output is plain decoding's."""
    register(Method(name="bigram", summary="test", build=lambda setup: LookupThenModel(Bigram(), setup.model),
                    draft_model=DraftModelUse.OPTIONAL))  # fmt: skip
    try:
        _bigram_runs(tiny)
    finally:
        unregister("bigram")


def _bigram_runs(tiny):
    target, draft = tiny
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    prompts = ["xyz" * 8, "hello hello hello", "The quick brown fox"]
    events = _run_scheduler(target, draft, [(p, SamplingParams(), True) for p in prompts], "always", "bigram")
    for prompt, request_events in zip(prompts, events, strict=True):
        assert request_events[-1].output.token_ids == plain.generate(prompt, max_tokens=30).token_ids
    stats = [e[-1].output.stats for e in events]
    assert sum(s.drafted for s in stats) > 0
