"""The CUDA path on tiny models (skipped without a GPU): greedy identity, the sampled distribution, the
batched scheduler, and token trees (suffix lookups beside the draft model), each on the GPU, against the same
definitions as the CPU tests."""

from collections import Counter

import pytest
import torch
from test_generator_tiny import PROMPTS, RUNS, TOLERANCE, VOCAB, _exact_first_two, reference_greedy
from test_suffix import FORKING, _run_counting_trees

from verispec import SpeculativeGenerator
from verispec.decoding.sampling import SamplingParams
from verispec.engine.requests import EngineRequest, FinishEvent
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.kernels import suffix
from verispec.testing import tiny_config, tiny_loaded, tiny_model, tiny_pair, word_tokenizer

from distributions import total_variation

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def on_gpu(*loaded):
    for model in loaded:
        model.model.to("cuda")
    return loaded


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_on_the_gpu_equals_plain_greedy(k):
    target, draft = on_gpu(*tiny_pair())
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=k, adaptive=False, device="cuda")
    for prompt in PROMPTS:
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=40)
        assert out.token_ids == reference_greedy(target.model, ids, 40, target.tokenizer.stop_token_ids)
        assert 0 < out.stats.accepted < out.stats.drafted


def test_sampled_output_on_the_gpu_follows_the_target_distribution():
    tokenizer = word_tokenizer(VOCAB)
    tokenizer.stop_token_ids = frozenset()
    target_model = tiny_model(tiny_config(vocab_size=VOCAB), seed=3, scale=1.0, residual_gain=0.5)
    draft_model = tiny_model(tiny_config(vocab_size=VOCAB, hidden_size=32, num_layers=1), seed=4)
    prompt, params = [0, 1, 2], SamplingParams(temperature=1.0)
    exact = _exact_first_two(target_model, prompt, params)  # computed on the CPU: an independent reference
    target, draft = on_gpu(tiny_loaded(target_model, tokenizer), tiny_loaded(draft_model, tokenizer))
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=3, adaptive=False, device="cuda")
    counts = Counter(
        tuple(generator.generate(prompt, max_tokens=2, temperature=1.0, seed=s).token_ids) for s in range(RUNS)
    )
    assert total_variation(counts, exact, RUNS) < TOLERANCE


def test_batched_scheduler_on_the_gpu_equals_plain_decoding():
    target, draft = on_gpu(*tiny_pair())
    plain = SpeculativeGenerator(target, None, max_seq_len=256, device="cuda")
    config = SchedulerConfig(max_num_seqs=3, max_model_len=256, draft_policy="always", num_speculative_tokens=4)
    scheduler = Scheduler(target, draft, config)
    prompts = ["hello world", "a", "The quick brown fox", "xyz" * 8]
    finals: dict[int, FinishEvent] = {}
    for i, prompt in enumerate(prompts):
        sink = lambda event, i=i: finals.__setitem__(i, event) if isinstance(event, FinishEvent) else None  # noqa: E731
        scheduler.submit(
            EngineRequest(
                request_id=str(i),
                prompt_ids=target.tokenizer.encode(prompt),
                params=SamplingParams(),
                max_tokens=30,
                sink=sink,
            )
        )
    scheduler.run_until_idle(max_steps=2000)
    for i, prompt in enumerate(prompts):
        assert finals[i].output.token_ids == plain.generate(prompt, max_tokens=30).token_ids
    assert sum(f.output.stats.accepted for f in finals.values()) > 0


@pytest.mark.skipif(not suffix.available(), reason="native library not compiled")
def test_token_trees_on_the_gpu_give_plain_greedy_output():
    """Suffix lookups (trees where earlier text forked) beside the draft model: each verify pass with a tree
    attends by its ancestor mask on the GPU; the greedy output is plain decoding's."""
    target, draft = on_gpu(*tiny_pair())
    plain = SpeculativeGenerator(target, None, max_seq_len=256, device="cuda")
    config = SchedulerConfig(max_num_seqs=1, max_model_len=256, speculative_method="suffix", token_trees=True)
    outputs, trees = _run_counting_trees(Scheduler(target, draft, config), target, FORKING)
    for output, prompt in zip(outputs, FORKING * 2, strict=True):
        assert output.token_ids == plain.generate(prompt, max_tokens=40, ignore_eos=True).token_ids
    assert trees > 0


def test_qwen35_on_the_gpu_rolls_back_exactly_and_keeps_the_output(tmp_path, monkeypatch):
    """Qwen3.5's linear attention and its recurrent state kept per length, with the MTP drafter, on the GPU
    (test_hybrid.check_the_gguf_fixture_on)."""
    from test_hybrid import Oracle, check_the_gguf_fixture_on

    from verispec.engine.methods import DraftModelUse, Method, register, unregister

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    truths: list[list[int]] = []
    register(Method(name="oracle", summary="test", build=lambda setup: Oracle(truths),
                    draft_model=DraftModelUse.UNUSED))  # fmt: skip
    try:
        check_the_gguf_fixture_on("cuda", truths)
    finally:
        unregister("oracle")


# ---- one pass shape in bfloat16 at a real shape (models/pass_shape.py) -----------------------------------------------
REAL_SHAPE = dict(  # Qwen2.5-1.5B's
    vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, intermediate_size=8960,
    rope_theta=1e6, qkv_bias=True, tie_word_embeddings=True, max_position_embeddings=4096,
)  # fmt: skip


@pytest.fixture(scope="module")
def real_shape_pair():
    """Random bfloat16 weights of Qwen2.5-1.5B's shape on the GPU, and a draft of its first 2 layers."""
    from verispec.models.config import ModelConfig
    from verispec.testing import byte_tokenizer, truncated_copy

    model = tiny_model(ModelConfig(**REAL_SHAPE), scale=2.0, residual_gain=0.3, device="cuda")
    draft = truncated_copy(model, 2).to(torch.bfloat16)
    model = model.to(torch.bfloat16)
    tokenizer = byte_tokenizer()
    return tiny_loaded(model, tokenizer, "t"), tiny_loaded(draft, tokenizer, "d")


def _real_prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (48,), generator=generator).tolist() for _ in range(6)]


def test_the_fused_attention_runs_on_the_gpu_and_shaped_passes_take_it_there(real_shape_pair):
    """kernels/triton_attention.py compiled for this card agrees with plain attention here (`usable`), and a pass shape
    takes it by default on CUDA: the tests below run it (where it did not run, they run the written-out attention)."""
    from verispec.kernels import triton_attention
    from verispec.models.pass_shape import CUDA_PASS_SHAPE, use_pass_shape

    model = real_shape_pair[0].model
    assert triton_attention.usable(str(model.device), torch.bfloat16, (model.layers[0].attn.head_dim,))
    try:
        use_pass_shape(model, CUDA_PASS_SHAPE)
        assert model.pass_fused
    finally:
        use_pass_shape(model, None)


def test_the_fused_attention_keeps_a_rows_bits_where_a_pass_splits_older_keys_into_chunks_on_the_gpu():
    """The kernels compiled for this card, in bfloat16 at the 7B's head layout (7 query heads a kv head, 128 values):
    a row whose older keys fit in one chunk gets the same bits in a pass that walks them as in one that splits a
    further group's keys into chunks; a row past the first chunk the same bits beside a group reaching 100 keys and
    one reaching past two chunks; plain attention's to bfloat16 rounding."""
    from test_triton_attention import BLOCK_SIZE, Layer, kernel_inputs

    from verispec.kernels import triton_attention

    gen = torch.Generator().manual_seed(0)
    pools = [torch.randn(6 * triton_attention.CHUNK // BLOCK_SIZE, 2, BLOCK_SIZE, 128, generator=gen) for _ in "kv"]
    keys, values = (pool.to("cuda", torch.bfloat16) for pool in pools)
    q = torch.randn(2, 2, 14, 128, generator=gen).to("cuda", torch.bfloat16)
    read = torch.arange(keys.shape[0], device="cuda").view(2, -1)
    chunk = triton_attention.CHUNK
    for near, short, long in ((40, 100, chunk + 300), (chunk + 200, 100, 2 * chunk + 300)):
        beside = [kernel_inputs(read, far, near=near) for far in (short, long)]
        got = [triton_attention.attend(Layer(), q, keys, values, **inputs) for inputs in beside]
        assert torch.equal(got[0][0], got[1][0]), f"row at {near}"
        expected = triton_attention._reference(q.float(), keys.float(), values.float(), read=read,
                                               positions=beside[0]["positions"], block_size=BLOCK_SIZE,
                                               scale=Layer.scale)  # fmt: skip
        torch.testing.assert_close(got[0].float(), expected, rtol=2e-2, atol=2e-2)


def test_in_bfloat16_at_a_real_shape_greedy_speculative_output_is_plain_output(real_shape_pair):
    """6 prompts x 96 tokens; a draft model (k 4), suffix lookups and drafts of fixed acceptance as token trees, each
    alone and the 6 batched in one engine, against plain decoding at the same (default) pass shape; seeded sampling
    the same. Before the pass shape: 0 of 6 equal for the draft model and suffix (docs/speed.md "On a GPU")."""
    from verispec.engine.fixed_acceptance import fixed_acceptance

    target, draft = real_shape_pair
    prompts = _real_prompts()
    plain = SpeculativeGenerator(target, None, device="cuda", dtype="bfloat16", max_seq_len=512)
    expected = [plain.generate(p, max_tokens=96, ignore_eos=True).token_ids for p in prompts]
    sampled = [plain.generate(p, max_tokens=48, ignore_eos=True, temperature=0.8, seed=i).token_ids
               for i, p in enumerate(prompts)]  # fmt: skip
    table: dict[str, dict[str, str]] = {}  # method -> mode -> "equal / prompts" (first differing tokens): all shown
    with fixed_acceptance([p + e for p, e in zip(prompts, expected, strict=True)], 0.7, tree=True) as oracle:
        for name, options in (
            ("draft k4", dict(speculative_method="draft", num_speculative_tokens=4, adaptive=False)),
            ("suffix", dict(speculative_method="suffix")),
            ("tree", dict(speculative_method=oracle, num_speculative_tokens=4, adaptive=False, token_trees=True)),
        ):
            spec = SpeculativeGenerator(target, draft, device="cuda", dtype="bfloat16", max_seq_len=512, **options)
            alone = [spec.generate(p, max_tokens=96, ignore_eos=True).token_ids for p in prompts]
            draws = [spec.generate(p, max_tokens=48, ignore_eos=True, temperature=0.8, seed=i).token_ids
                     for i, p in enumerate(prompts)]  # fmt: skip
            batched = _batched(target, draft, prompts, **options)
            table[name] = {"alone": _agreement(alone, expected), "seeded": _agreement(draws, sampled),
                           "batched": _agreement(batched, expected)}  # fmt: skip
    total = f"{len(prompts)}/{len(prompts)}"
    assert all(cell.startswith(total) for row in table.values() for cell in row.values()), table


def _agreement(outputs: list[list[int]], expected: list[list[int]]) -> str:
    """How many outputs equal the expected ones, and where each that does not first differs."""
    equal = sum(o == e for o, e in zip(outputs, expected, strict=True))
    firsts = [next((i for i, (a, b) in enumerate(zip(o, e, strict=False)) if a != b), min(len(o), len(e)))
              for o, e in zip(outputs, expected, strict=True) if o != e]  # fmt: skip
    return f"{equal}/{len(expected)}" + (f" (first differing tokens {firsts})" if firsts else "")


def _batched(target, draft, prompts, **options) -> list[list[int]]:
    method = options.get("speculative_method")
    config = SchedulerConfig(max_num_seqs=len(prompts), max_model_len=512, speculative_method=method,
                             num_speculative_tokens=options.get("num_speculative_tokens", 4), draft_policy="always",
                             token_trees=options.get("token_trees", False))  # fmt: skip
    scheduler = Scheduler(target, draft, config)
    finals: dict[int, FinishEvent] = {}
    for i, ids in enumerate(prompts):
        sink = lambda event, i=i: finals.__setitem__(i, event) if isinstance(event, FinishEvent) else None  # noqa: E731
        scheduler.submit(EngineRequest(request_id=str(i), prompt_ids=ids, params=SamplingParams(), max_tokens=96,
                                       sink=sink, ignore_eos=True))  # fmt: skip
    scheduler.run_until_idle(max_steps=20000)
    return [finals[i].output.token_ids for i in range(len(prompts))]


def test_a_rows_bfloat16_logits_are_the_same_bits_in_every_pass_on_the_gpu(real_shape_pair):
    """tests/test_pass_shape.py's check (decode steps, a verify pass beside another sequence, a prefill's end) in
    bfloat16 on the GPU, replayed from CUDA graphs, with the fused attention (the default) and written out; the
    control: the ordinary passes differ."""
    from test_pass_shape import passes, same_bits

    from verispec.models.pass_shape import CUDA_PASS_SHAPE, use_pass_shape

    model = real_shape_pair[0].model
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0)).cuda()
    try:
        for fused in (None, False):
            use_pass_shape(model, CUDA_PASS_SHAPE, fused=fused)
            assert same_bits(passes(model, ids)), f"fused attention: {model.pass_fused}"
        use_pass_shape(model, None)
        assert not same_bits(passes(model, ids))
    finally:
        use_pass_shape(model, None)


def test_graph_replay_gives_the_bits_of_the_same_pass_run_eagerly(real_shape_pair):
    """Decode steps replayed from CUDA graphs: the eager passes' logits, and the hidden states a drafter reads (EAGLE-3,
    DFlash: passes that tap layers, captured as graphs of their own) the same bits."""
    from verispec.models.pass_shape import CUDA_PASS_SHAPE, use_pass_shape

    model = real_shape_pair[0].model
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(2)).cuda()
    outputs, served = [], []
    try:
        for graphs in (True, False):
            use_pass_shape(model, CUDA_PASS_SHAPE, graphs=graphs)
            cache = model.new_cache(num_slots=2, max_len=64)
            model(ids[:, :16], cache, [0, 1])
            outputs.append([model(ids[:, 16 + i : 17 + i], cache, [0, 1]) for i in range(4)])
            served.append([])
            model.serve_hidden(lambda slots, starts, rows: served[-1].append(rows.clone()), layers=(1, 14, 27))
            outputs[-1] += [model(ids[:, 20 + i : 21 + i], cache, [0, 1]) for i in range(4)]
            model.serve_hidden(None)
            captured = {tapped for _, _, tapped in model._shaped[cache]._captured}
            assert captured == ({(), (1, 14, 27)} if graphs else set())  # replayed, tapped or not: no fallback
    finally:
        model.serve_hidden(None)
        use_pass_shape(model, None)
    assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))
    assert len(served[0]) == 4 and all(torch.equal(a, b) for a, b in zip(*served, strict=True))


def test_a_draft_models_steps_on_the_gpu_never_wait_for_the_card(real_shape_pair):
    """Shaped passes replayed from graphs, each step fed the tokens the last one chose on the card (what
    models/greedy_steps.py does): no operation in the steps waits for the card (torch's sync debug mode raises on
    one), so the host plans step i + 1 while the card runs step i."""
    from verispec.models.pass_shape import CUDA_PASS_SHAPE, use_pass_shape

    draft = real_shape_pair[1].model
    try:
        use_pass_shape(draft, CUDA_PASS_SHAPE)
        cache = draft.new_cache(num_slots=2, max_len=128)
        draft(torch.arange(1, 41, device="cuda").view(2, 20), cache, [0, 1], num_logits=1, invariant=False)
        chosen = torch.tensor([[7], [9]], device="cuda")
        for sync_mode in ("default", "error"):  # the first round captures the graphs, which waits
            for _ in range(4):
                torch.cuda.set_sync_debug_mode(sync_mode)
                out = draft(chosen, cache, [0, 1], num_logits=1, invariant=False)
                chosen = out[:, -1].argmax(-1, keepdim=True)
            torch.cuda.set_sync_debug_mode("default")
            for slot in (0, 1):
                cache.set_length(slot, 20)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        use_pass_shape(draft, None)


def test_compiled_passes_keep_a_rows_bfloat16_bits_in_every_pass_and_replay_their_eager_bits(real_shape_pair):
    """Each shaped pass compiled by torch.compile (fused kernels) and replayed from CUDA graphs: a row's bfloat16
    logits the same bits in every pass, and the bits of the same compiled passes run without graphs."""
    from test_pass_shape import passes, same_bits

    from verispec.models.pass_shape import CUDA_PASS_SHAPE, use_pass_shape

    model = real_shape_pair[0].model
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0)).cuda()
    try:
        use_pass_shape(model, CUDA_PASS_SHAPE, compiled=True)
        replayed = passes(model, ids)
        assert same_bits(replayed)
        assert any(runner._captured for runner in model._shaped.values())
        use_pass_shape(model, CUDA_PASS_SHAPE, graphs=False, compiled=True)
        assert same_bits({"decoded": replayed["decoded"], "eager": passes(model, ids)["decoded"]})
    finally:
        use_pass_shape(model, None)


def test_in_bfloat16_with_compiled_passes_greedy_speculative_output_is_plain_output(real_shape_pair):
    """The draft model (k 4) against plain decoding, both with compiled passes, alone and batched."""
    target, draft = real_shape_pair
    prompts = _real_prompts()[:3]
    options = dict(device="cuda", dtype="bfloat16", max_seq_len=512, compile_passes=True)
    plain = SpeculativeGenerator(target, None, **options)
    expected = [plain.generate(p, max_tokens=96, ignore_eos=True).token_ids for p in prompts]
    spec = SpeculativeGenerator(target, draft, speculative_method="draft", num_speculative_tokens=4, adaptive=False,
                                **options)  # fmt: skip
    assert [spec.generate(p, max_tokens=96, ignore_eos=True).token_ids for p in prompts] == expected
