"""One pass shape (models/pass_shape.py), on the CPU in float32: a row's logits are the same bits whatever the pass's
width and whatever its other rows, where PyTorch's ordinary passes differ in the last bits (the negative control); what
a shaped pass computes is what an ordinary pass computes (chains, token trees, sliding windows, several slots, served
hidden states); speculative output then equals plain output to the bit of every logprob, batched and alone, for every
method; bad shapes are refused by name. The same code runs on CUDA, captured in graphs (tests/test_cuda.py)."""

from collections import Counter

import pytest
import torch

from verispec import SpeculativeGenerator
from verispec.decoding.sampling import SamplingParams
from verispec.engine.fixed_acceptance import fixed_acceptance
from verispec.engine.requests import EngineRequest, FinishEvent
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.errors import InvalidParameterError
from verispec.kernels.stack import TREE_ROWS
from verispec.models.pass_shape import PassShape, ShapedPasses, parse_pass_shape, use_pass_shape
from verispec.models.shaped_attention import KEY_BLOCK
from verispec.testing import byte_tokenizer, tiny_config, tiny_loaded, tiny_model, truncated_copy

CONFIG = dict(vocab_size=257, hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=384)
PROMPTS = ["def add(a, b):", "hello world", "x", "The quick brown fox jumps over the lazy dog. " * 3]


def model(shape: PassShape | None = None, **overrides):
    made = tiny_model(tiny_config(**{**CONFIG, **overrides}), seed=1, scale=2.0, residual_gain=0.3)
    use_pass_shape(made, shape)
    return made


def passes(model, ids: torch.Tensor, context: int = 30, steps: int = 6) -> dict[str, list[torch.Tensor]]:
    """The logits of the same `steps` tokens after the same `context`, as decode steps one by one, as one verify pass
    beside another sequence's 3 rows, and as the end of one prefill."""
    cache = model.new_cache(num_slots=4, max_len=128)
    model(ids[:, :context], cache, [0])
    model(ids[:, :context], cache, [1])
    model(ids[:, 5:20], cache, [2])
    decoded = [model(ids[:, context + i : context + i + 1], cache, [0])[0, 0] for i in range(steps)]
    batch = torch.stack([ids[0, context : context + steps], torch.cat([ids[0, 20:23], ids[0, : steps - 3]])])
    verified = model(batch, cache, [1, 2])[0]
    prefilled = model(ids[:, : context + steps], cache, [3])[0, context:]
    return {"decoded": decoded, "verified": list(verified), "prefilled": list(prefilled)}


def same_bits(runs: dict[str, list[torch.Tensor]]) -> bool:
    first = runs["decoded"]
    return all(torch.equal(a, b) for name in runs for a, b in zip(first, runs[name], strict=True))


def test_a_rows_logits_are_the_same_bits_in_every_pass_at_one_shape():
    ids = torch.randint(0, 257, (1, 40), generator=torch.Generator().manual_seed(0))
    assert same_bits(passes(model(PassShape(groups=3, width=4)), ids))
    assert same_bits(passes(model(PassShape(groups=1, width=16)), ids))
    # the control: PyTorch's ordinary passes round a 6-row pass otherwise than a 1-row one
    assert not same_bits(passes(model(), ids))


@pytest.mark.parametrize("held", [40, 9], ids=["older-keys", "no-older-keys"])
def test_a_row_gets_the_same_bits_from_a_pass_that_reads_more_blocks_of_older_keys(held):
    """A row decoded alone reads one block of KEY_BLOCK older positions (at position 9, older than its 16 newest, it
    reaches none of it); beside a sequence past KEY_BLOCK tokens the pass reads two, which the row does not reach: the
    same bits, and the ordinary pass's logits to float rounding."""
    made = model(PassShape(groups=2, width=4), max_position_embeddings=4096)
    ids = torch.randint(0, 257, (1, KEY_BLOCK + 100), generator=torch.Generator().manual_seed(5))
    cache = made.new_cache(num_slots=3, max_len=KEY_BLOCK + 128)
    for slot in (0, 1):
        made(ids[:, :held], cache, [slot])
    made(ids, cache, [2])
    alone = made(ids[:, held : held + 1], cache, [0])[0, 0]
    runner = made._shaped[cache]
    assert runner.key_blocks == 1
    beside = made(torch.stack([ids[0, held : held + 1], ids[0, 7:8]]), cache, [1, 2])[0, 0]
    assert runner.key_blocks == 2
    assert torch.equal(alone, beside)
    ordinary = model(max_position_embeddings=4096)
    expected = ordinary(ids[:, : held + 1], ordinary.new_cache(max_len=64), [0])[0, -1]
    torch.testing.assert_close(alone, expected, rtol=1e-4, atol=1e-4)


def test_shaped_passes_compute_what_ordinary_passes_compute():
    ids = torch.randint(0, 257, (1, 40), generator=torch.Generator().manual_seed(1))
    ordinary, shaped = passes(model(), ids), passes(model(PassShape(groups=2, width=3)), ids)
    for name in ordinary:
        for a, b in zip(ordinary[name], shaped[name], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


FEATURES = {  # what the families' blocks add, as the shaped attention must take them
    "gpt-oss": dict(attn_sinks=True, layer_windows=(4, 0, 4, 0), num_experts=4, experts_per_token=2,
                    expert_intermediate_size=96, router_softmax_topk=True, activation="swiglu_oai", swiglu_alpha=1.702,
                    swiglu_limit=7.0, o_bias=True),
    "gemma": dict(attn_softcap=50.0, final_softcap=30.0, qk_norm=True, post_norms=True, embed_scale=True,
                  query_scale=0.1, activation="gelu_tanh", layer_windows=(24, 0, 24, 0)),
    "gated-output": dict(attn_output_gate=True, qk_norm=True),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(FEATURES))
def test_the_families_features_at_one_shape_compute_what_ordinary_passes_compute_with_the_same_bits(family):
    """Attention sinks, sliding windows, soft-capping, q/k norms, a query scale, a gated output and mixtures of
    experts through shaped passes: the ordinary passes' logits (float rounding), and one row's bits in every pass."""
    ids = torch.randint(0, 257, (1, 40), generator=torch.Generator().manual_seed(7))
    shaped = passes(model(PassShape(groups=2, width=4), **FEATURES[family]), ids)
    assert same_bits(shaped)
    for a, b in zip(passes(model(**FEATURES[family]), ids)["decoded"], shaped["decoded"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("overrides", [{}, {"layer_windows": (4, 0, 4, 0)}], ids=["full", "sliding-window"])
def test_token_trees_and_windows_at_one_shape_compute_what_ordinary_passes_compute(overrides):
    """A verify pass holding token trees (two slots, one tree each, its nodes' ancestors spread over two groups of
    width 3) and the same rows as chains, with and without sliding windows: the logits of ordinary passes."""
    ids = torch.randint(0, 257, (2, 20), generator=torch.Generator().manual_seed(2))
    parents = [[-1, 0, 1, 0, 3, 1], [-1, -1, 1, 1, 2, 4]]
    results = []
    for shape in (None, PassShape(groups=2, width=3)):
        made = model(shape, **overrides)
        cache = made.new_cache(num_slots=2, max_len=64)
        made(ids[:, :12], cache, [0, 1])
        results.append((made(ids[:, 12:18], cache, [0, 1], parents=parents), made(ids[:, 12:18], cache, [0, 1])))
    for ordinary, shaped in zip(*results, strict=True):
        torch.testing.assert_close(ordinary, shaped, rtol=1e-4, atol=1e-4)


def test_a_tree_as_wide_as_trees_get_spread_over_narrow_groups_computes_what_an_ordinary_pass_does():
    """A tree of TREE_ROWS rows (a root, then a chain of 7 and branches off it) in groups of 2 rows: each node's
    ancestors lie in other groups of the pass, found by storage position."""
    parents = [[-1, 0, 1, 2, 3, 4, 5, 6, 0, 8, 1, 10, 2, 12, 7, 14]]
    assert len(parents[0]) == TREE_ROWS
    ids = torch.randint(0, 257, (1, 21), generator=torch.Generator().manual_seed(3))
    outputs = []
    for made in (model(PassShape(groups=3, width=2)), model()):
        cache = made.new_cache(max_len=32)
        made(ids[:, :5], cache, [0])
        outputs.append(made(ids[:, 5:], cache, [0], parents=parents))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-4, atol=1e-4)


def test_hidden_states_served_from_shaped_passes_are_the_ordinary_ones():
    ids = torch.randint(0, 257, (1, 20), generator=torch.Generator().manual_seed(4))
    seen = []
    for shape in (None, PassShape(groups=2, width=4)):
        made, got = model(shape), []
        made.serve_hidden(lambda slots, starts, hidden, got=got: got.append((slots, starts, hidden.clone())),
                          layers=(1, 4))  # fmt: skip
        cache = made.new_cache(max_len=32)
        made(ids[:, :13], cache, [0], num_logits=1)
        made(ids[:, 13:18], cache, [0])
        seen.append(got)
    for (slots, starts, ordinary), (slots2, starts2, shaped) in zip(*seen, strict=True):
        assert (slots, starts) == (slots2, starts2)
        torch.testing.assert_close(ordinary, shaped, rtol=1e-4, atol=1e-4)


# ---- speculative output = plain output, to the bit -------------------------------------------------------------------
def pair():
    target = model()
    draft = truncated_copy(target, 1)
    return tiny_loaded(target, byte_tokenizer(), "t"), tiny_loaded(draft, byte_tokenizer(), "d")


def generated(target, draft, shape: str, **options) -> list:
    """Each prompt's tokens, their logprobs and the stats, at `shape` ("off": PyTorch's ordinary passes)."""
    generator = SpeculativeGenerator(target, draft, pass_shape=shape, max_seq_len=256, **options)
    outputs = [generator.generate(p, max_tokens=40, ignore_eos=True, logprobs=0) for p in PROMPTS]
    return [(o.token_ids, [entry.logprob for entry in o.logprobs], o.stats) for o in outputs]


@pytest.mark.parametrize(
    "options",
    [dict(speculative_method="draft", num_speculative_tokens=4, adaptive=False),
     dict(speculative_method="suffix", num_speculative_tokens=3, adaptive=False),
     dict(speculative_method="oracle", num_speculative_tokens=6, adaptive=False),
     dict(speculative_method="oracle-tree", num_speculative_tokens=6, adaptive=False, token_trees=True)],
    ids=["draft", "suffix", "oracle", "trees"],
)  # fmt: skip
def test_speculative_output_is_plain_output_to_every_logprobs_bit_at_one_shape(options, monkeypatch):
    """Greedy output and every logprob of speculative decoding at shape 2x4 (verify rows spread over groups) are
    plain decoding's at that shape, for a draft model, suffix lookups, and drafts of fixed acceptance
    (engine/fixed_acceptance.py) as chains and as token trees whose second branch is taken; without the shape (the
    control) a verified token's logprob differs from its decoded one in the last bits."""
    tree_rows = []
    run = ShapedPasses.run
    monkeypatch.setattr(ShapedPasses, "run", lambda self, groups, *rest: tree_rows.extend(
        row for group in groups for row in group.rows if row.branch) or run(self, groups, *rest))  # fmt: skip
    target, draft = pair()
    plain = generated(target, None, "2x4")
    method = options.pop("speculative_method")
    with fixed_acceptance([target.tokenizer.encode(p) + o[0] for p, o in zip(PROMPTS, plain, strict=True)], 0.6,
                          tree=method == "oracle-tree") as oracle:  # fmt: skip
        name = oracle if method.startswith("oracle") else method
        speculative = generated(target, draft, "2x4", speculative_method=name, **options)
        ordinary = generated(target, draft, "off", speculative_method=name, **options)
    for (tokens, logprobs, _), (spec_tokens, spec_logprobs, _stats) in zip(plain, speculative, strict=True):
        assert spec_tokens == tokens
        assert spec_logprobs == logprobs  # floats compared exactly
    stats = [s for *_, s in speculative]
    assert 0 < sum(s.accepted for s in stats) < sum(s.drafted for s in stats)
    assert bool(tree_rows) == (method == "oracle-tree")  # trees verified through shaped passes
    assert any(o[1] != p[1] for o, p in zip(ordinary, generated(target, None, "off"), strict=True))


def test_a_batched_sequence_gets_the_bits_it_gets_alone():
    """Four requests in one engine at once (3 slots: one waits), seeded sampling and greedy, against each alone in an
    engine of plain decoding at the same shape: the same tokens and logprobs."""
    target, draft = pair()
    config = SchedulerConfig(max_num_seqs=3, max_model_len=256, draft_policy="always", num_speculative_tokens=4,
                             pass_shape="3x4", speculative_method="draft")  # fmt: skip
    scheduler = Scheduler(target, draft, config)
    finals: dict[int, FinishEvent] = {}
    params = [SamplingParams(), SamplingParams(temperature=0.8, seed=5), SamplingParams(), SamplingParams(seed=9)]
    for i, (prompt, param) in enumerate(zip(PROMPTS, params, strict=True)):
        sink = lambda event, i=i: finals.__setitem__(i, event) if isinstance(event, FinishEvent) else None  # noqa: E731
        request = EngineRequest(request_id=str(i), prompt_ids=target.tokenizer.encode(prompt), params=param,
                                max_tokens=30, sink=sink, ignore_eos=True, logprobs=0)  # fmt: skip
        scheduler.submit(request)
    scheduler.run_until_idle(max_steps=2000)
    alone = SpeculativeGenerator(target, None, pass_shape="3x4", max_seq_len=256)
    for i, (prompt, param) in enumerate(zip(PROMPTS, params, strict=True)):
        out = alone.generate(prompt, max_tokens=30, ignore_eos=True, logprobs=0, temperature=param.temperature,
                             seed=param.seed)  # fmt: skip
        assert finals[i].output.token_ids == out.token_ids
        assert [e.logprob for e in finals[i].output.logprobs] == [e.logprob for e in out.logprobs]
    assert sum(f.output.stats.accepted for f in finals.values()) > 0


def test_sampled_speculative_decoding_at_one_shape_follows_the_target_distribution():
    """The acceptance rule's law holds through shaped passes: the first two tokens' frequencies against the exact
    law over a 7-token vocabulary (tests/test_generator_tiny.py's reference), with its tolerance."""
    from test_generator_tiny import RUNS, TOLERANCE, VOCAB, _exact_first_two

    from verispec.testing import word_tokenizer

    from distributions import total_variation

    tokenizer = word_tokenizer(VOCAB)
    tokenizer.stop_token_ids = frozenset()
    target = tiny_model(tiny_config(vocab_size=VOCAB), seed=3, scale=1.0, residual_gain=0.5)
    draft = tiny_model(tiny_config(vocab_size=VOCAB, hidden_size=32, num_layers=1), seed=4)
    prompt, params = [0, 1, 2], SamplingParams(temperature=1.0)
    exact = _exact_first_two(target, prompt, params)
    generator = SpeculativeGenerator(tiny_loaded(target, tokenizer), tiny_loaded(draft, tokenizer), pass_shape="2x4",
                                     num_speculative_tokens=3, adaptive=False)  # fmt: skip
    counts = Counter(
        tuple(generator.generate(prompt, max_tokens=2, temperature=1.0, seed=s).token_ids) for s in range(RUNS // 4)
    )
    assert total_variation(counts, exact, RUNS // 4) < 2 * TOLERANCE


# ---- the shape asked for ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["0x4", "8x", "x8", "8x300", "32x32", "8*8", "eight", "-1x8"])
def test_a_malformed_pass_shape_is_refused_naming_the_forms(text):
    with pytest.raises(InvalidParameterError, match="GROUPSxWIDTH"):
        parse_pass_shape(text, "cpu")
    with pytest.raises(InvalidParameterError, match="GROUPSxWIDTH"):
        SchedulerConfig(pass_shape=text)


def test_auto_is_a_shape_on_cuda_and_none_on_a_cpu():
    assert parse_pass_shape("auto", "cpu") is None and parse_pass_shape("off", "cuda") is None
    assert parse_pass_shape("auto", "cuda") == PassShape(groups=8, width=8)
    assert parse_pass_shape("2x16", "cpu") == PassShape(groups=2, width=16)


def test_a_model_the_rule_does_not_cover_is_refused_by_name_and_left_alone_under_auto():
    native = tiny_model(tiny_config())  # per-query attention of the native kernels: row-invariant already
    for block in native.layers:
        block.attn.batch_invariant = True
    with pytest.raises(InvalidParameterError, match="row-invariant already"):
        use_pass_shape(native, PassShape(groups=2, width=4), asked=True)
    assert use_pass_shape(native, PassShape(groups=2, width=4)) is None and native.pass_shape is None
    with pytest.raises(InvalidParameterError, match="row-invariant already"):
        Scheduler(tiny_loaded(native), None, SchedulerConfig(max_num_seqs=1, max_model_len=64, pass_shape="2x4"))


@pytest.mark.parametrize("beside", [False, True], ids=["in-place-of-the-mlp", "beside-the-mlp"])
def test_a_mixture_of_experts_rows_are_the_same_bits_in_every_pass_at_one_shape(beside):
    """Each chosen expert runs over the pass's whole row count: a row's bits do not depend on how many other rows
    chose its experts (ordinary passes: they do). Such a model runs its shaped passes without CUDA graphs."""
    overrides = dict(num_experts=4, experts_per_token=2, expert_intermediate_size=96, moe_beside_mlp=beside)
    ids = torch.randint(0, 257, (1, 40), generator=torch.Generator().manual_seed(6))
    shaped = model(PassShape(groups=3, width=4), **overrides)
    assert shaped.pass_graphs is False
    assert same_bits(passes(shaped, ids))
    assert not same_bits(passes(model(**overrides), ids))


# ---- a hybrid model (Qwen3.5's linear attention) ---------------------------------------------------------------------
HYBRID = dict(linear_layers=(0, 2), linear_key_heads=2, linear_key_dim=16, linear_value_heads=4, linear_value_dim=16,
              linear_conv_kernel=4)  # fmt: skip


def test_a_hybrid_models_rows_are_the_same_bits_in_every_pass_at_one_shape():
    """Its linear-attention layers step each group's rows in the recurrent form, prefills too, a slot's later group
    from the state its earlier one left: a row's bits in every pass (ordinary passes: not), the ordinary logits to
    float rounding. Its recurrent state steps in Python: no graphs, and no compiled passes."""
    ids = torch.randint(0, 257, (1, 40), generator=torch.Generator().manual_seed(9))
    shaped = model(PassShape(groups=2, width=4), **HYBRID)
    assert shaped.pass_graphs is False
    runs = passes(shaped, ids)
    assert same_bits(runs)
    ordinary = passes(model(**HYBRID), ids)
    assert not same_bits(ordinary)
    for a, b in zip(ordinary["decoded"], runs["decoded"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    with pytest.raises(InvalidParameterError, match="hybrid"):
        use_pass_shape(model(**HYBRID), PassShape(groups=2, width=4), compiled=True)
    cache = shaped.new_cache(max_len=64)  # a prefill keeps each slot's last state only (a long one would fill memory)
    shaped(ids[:, :30], cache, [0], num_logits=1, invariant=False)
    assert set(cache.recurrent.saved[0]) == {30}
    shaped(ids[:, 30:36], cache, [0])  # a verify pass keeps every row's: a rollback may land on any
    assert set(cache.recurrent.saved[0]) >= set(range(31, 37))


@pytest.mark.parametrize("method", ["suffix", "oracle"])
def test_a_hybrid_models_speculative_output_is_plain_output_to_every_logprobs_bit_at_one_shape(method):
    """Suffix lookups and drafts of fixed acceptance (rejections roll the recurrent state back to a verify row's) on
    a hybrid target at shape 2x4: plain decoding's tokens and every logprob at that shape."""
    target = tiny_loaded(model(**HYBRID), byte_tokenizer(), "t")
    plain = generated(target, None, "2x4")
    options = dict(num_speculative_tokens=3, adaptive=False)
    truths = [target.tokenizer.encode(p) + o[0] for p, o in zip(PROMPTS, plain, strict=True)]
    with fixed_acceptance(truths, 0.6) as oracle:
        speculative = generated(target, None, "2x4", speculative_method=oracle if method == "oracle" else method,
                                **options)  # fmt: skip
    assert [(t, lp) for t, lp, _ in speculative] == [(t, lp) for t, lp, _ in plain]
    assert sum(s.drafted for *_, s in speculative) > sum(s.accepted for *_, s in speculative) > 0


class ReplayedOnTheHost:
    """A CUDA graph's stand-in on the CPU: captured, the pass's outputs; replayed, the pass run again into them (what
    a graph's replay does to its static tensors)."""

    def __init__(self, runner: ShapedPasses, head, tapped: tuple[int, ...]):
        self.runner, self.head, self.tapped = runner, head, tapped
        self.outputs = runner._compute(head, tapped)

    def replay(self) -> None:
        hidden, logits, taps = self.runner._compute(self.head, self.tapped)
        self.outputs[0].copy_(hidden)
        self.outputs[1].copy_(logits)
        for layer, tap in taps.items():
            self.outputs[2][layer].copy_(tap)


def test_passes_replayed_from_graphs_tapped_or_not_give_the_logits_and_served_hidden_states_of_eager_ones():
    """The graph path's bookkeeping on the CPU (a stand-in graph): passes that tap layers for a drafter (EAGLE-3,
    DFlash) are captured as graphs of their own, and serve the same hidden states as eager passes."""
    ids = torch.randint(0, 257, (2, 24), generator=torch.Generator().manual_seed(2))
    runs = []
    for graphs in (True, False):
        made, served = model(PassShape(2, 4)), []
        cache = made.new_cache(num_slots=2, max_len=64)
        made(ids[:, :16], cache, [0, 1])
        runner = made._shaped[cache]
        if graphs:
            runner.graphs = True
            runner._capture = lambda head, tapped, runner=runner: (graph := ReplayedOnTheHost(runner, head, tapped),
                                                                   graph.outputs)  # fmt: skip
        logits = [made(ids[:, 16 + i : 17 + i], cache, [0, 1]) for i in range(2)]
        made.serve_hidden(lambda slots, starts, rows, served=served: served.append(rows.clone()), layers=(1, 3))
        logits += [made(ids[:, 18 + i : 19 + i], cache, [0, 1]) for i in range(3)]
        runs.append((logits, served, {tapped for *_, tapped in runner._captured}))
    (replayed, replayed_served, captured), (eager, eager_served, _) = runs
    assert captured == {(), (1, 3)}
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager, strict=True))
    assert len(eager_served) == 3 and all(torch.equal(a, b) for a, b in zip(replayed_served, eager_served, strict=True))


# ---- compiled passes (torch.compile) --------------------------------------------------------------------------------
def compiled_model(**overrides):
    made = model(**overrides)
    use_pass_shape(made, PassShape(groups=2, width=4), compiled=True)
    return made


@pytest.mark.slow
def test_compiled_passes_keep_a_rows_bits_in_every_pass_tapped_or_not_and_over_more_key_blocks():
    """Compiled by torch.compile (fused kernels, which round otherwise than eager ones): a row's logits the same bits
    in every pass; a pass tapping layers for served hidden states (EAGLE-3, DFlash) gives the bits of one that does
    not; a row read beside a sequence past KEY_BLOCK tokens (another compilation) too. The control: compiled logits
    are not the eager pass's bits, so each check compares two compilations."""
    ids = torch.randint(0, 257, (1, 40), generator=torch.Generator().manual_seed(0))
    compiled = passes(compiled_model(), ids)
    assert same_bits(compiled)
    assert not same_bits({"decoded": compiled["decoded"], "eager": passes(model(PassShape(2, 4)), ids)["decoded"]})
    tapping = compiled_model()
    tapping.serve_hidden(lambda *served: None, layers=(1, 4))
    assert same_bits({"decoded": compiled["decoded"], "tapped": passes(tapping, ids)["decoded"]})
    made = compiled_model(max_position_embeddings=4096)
    long_ids = torch.randint(0, 257, (1, KEY_BLOCK + 20), generator=torch.Generator().manual_seed(5))
    cache = made.new_cache(num_slots=3, max_len=KEY_BLOCK + 32)
    for slot in (0, 1):
        made(long_ids[:, :40], cache, [slot])
    made(long_ids, cache, [2])
    alone = made(long_ids[:, 40:41], cache, [0])[0, 0]
    beside = made(torch.stack([long_ids[0, 40:41], long_ids[0, 7:8]]), cache, [1, 2])[0, 0]
    assert made._shaped[cache].key_blocks == 2
    assert torch.equal(alone, beside)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [dict(speculative_method="draft", num_speculative_tokens=4, adaptive=False),
     dict(speculative_method="oracle-tree", num_speculative_tokens=6, adaptive=False, token_trees=True)],
    ids=["draft", "trees"],
)  # fmt: skip
def test_speculative_output_is_plain_output_to_every_logprobs_bit_with_compiled_passes(options):
    target, draft = pair()
    plain = generated(target, None, "2x4", compile_passes=True)
    method = options.pop("speculative_method")
    with fixed_acceptance([target.tokenizer.encode(p) + o[0] for p, o in zip(PROMPTS, plain, strict=True)], 0.6,
                          tree=method == "oracle-tree") as oracle:  # fmt: skip
        name = oracle if method.startswith("oracle") else method
        speculative = generated(target, draft, "2x4", speculative_method=name, compile_passes=True, **options)
    assert [(t, lp) for t, lp, _ in speculative] == [(t, lp) for t, lp, _ in plain]
    assert 0 < sum(s.accepted for *_, s in speculative) < sum(s.drafted for *_, s in speculative)
    assert target.model._shaped and all(r.compiled for r in target.model._shaped.values())


@pytest.mark.slow
def test_compiled_passes_compile_one_region_for_every_layer_alike():
    """Compiled by region (the layers' inputs, a layer, the head): a 6-layer model's passes take three compilations,
    not one per layer (a whole pass compiled as one took 70 s on a 28-layer model, by region 9 s)."""
    from torch._dynamo.utils import counters

    made = compiled_model(hidden_size=96, num_heads=6, intermediate_size=192, num_layers=6)
    before = counters["stats"]["unique_graphs"]
    ids = torch.randint(0, 257, (1, 40), generator=torch.Generator().manual_seed(0))
    cache = made.new_cache(num_slots=1, max_len=64)
    made(ids[:, :30], cache, [0])
    made(ids[:, 30:31], cache, [0])
    assert counters["stats"]["unique_graphs"] - before == 3  # per layer: 8; as one whole pass: 1


def test_compiled_passes_are_refused_without_a_shape_and_for_a_mixture_of_experts():
    with pytest.raises(InvalidParameterError, match="pass shape"):
        SchedulerConfig(pass_shape="off", compile_passes=True)
    with pytest.raises(InvalidParameterError, match="no pass shape"):
        use_pass_shape(model(), None, compiled=True)
    mixture = model(num_experts=4, experts_per_token=2, expert_intermediate_size=96)
    with pytest.raises(InvalidParameterError, match="experts"):
        use_pass_shape(mixture, PassShape(groups=2, width=4), compiled=True)
    with pytest.raises(InvalidParameterError, match="auto is none on a CPU"):
        Scheduler(tiny_loaded(model()), None, SchedulerConfig(max_num_seqs=1, max_model_len=64, compile_passes=True))


@pytest.mark.slow
def test_the_gpu_cost_benchmark_runs_on_the_cpu_and_finds_speculative_output_identical(tmp_path):
    """benchmarks/gpu_costs.py (what a GPU visit runs) on tiny shapes: every figure written, and each speculative
    output of fixed acceptance equal to plain output at its shape, ordinary, shaped and compiled."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_costs.py"
    out = tmp_path / "costs.json"
    command = [sys.executable, str(script), "--device", "cpu", "--target", "tiny", "--draft", "tiny-draft",
               "--dtype", "float32", "--pass-shapes", "off,2x4,2x4:compiled", "--tokens", "12", "--reps", "1",
               "--batch", "2", "--acceptance", "0.8", "--long-context", "300", "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    results = json.loads(out.read_text())
    for entry in ("off", "2x4", "2x4:compiled"):
        row = results[f"shape_{entry}"]
        assert row["T_ms"]["1"] > 0 and row["c"] > 0
        assert row["batch_1"]["alpha_0.8"]["identical"] == "1/1"
        assert row["batch_2"]["alpha_0.8"]["identical"] == "2/2"
    assert set(results["long_context"]) == {"off", "2x4"}  # not compiled; nothing walked where nothing is fused
    assert all(row["T1_ms"] > 0 and row["c"] > 0 for row in results["long_context"].values())
