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
