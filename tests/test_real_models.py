"""End to end on the bundled Qwen2.5-Coder pair (1.5B target, 0.5B draft), float32.

Marked `real`: they need the [bundled] extra and take a few minutes on a 2-core CPU.
"""

import pytest
import torch

from verispec import SpeculativeGenerator, load_model
from verispec.defaults import DEFAULT_DRAFT_VOCAB

from real_models import dense_copy, humaneval_prompts, require_bundled, smollm2_path

pytestmark = pytest.mark.real
TOKENS = 64


@pytest.fixture(scope="module")
def pair():
    require_bundled()
    return load_model("target", "float32"), load_model("draft", "float32")


slow_float32 = pytest.mark.slow  # float32 weights on PyTorch read 6 GB a step: minutes (the native path runs below)


@slow_float32
def test_greedy_speculative_equals_plain_on_humaneval(pair):
    target, draft = pair
    plain = SpeculativeGenerator(target, None)
    spec = SpeculativeGenerator(target, draft, num_speculative_tokens=4, adaptive=False, speculative_method="draft")
    accepted = 0
    # two prompts: float32 weights on PyTorch read 6 GB a step, and this test was the suite's slowest (244 s of
    # 21 min with five on a 2-core Sapphire Rapids, 145 s with three on a Zen 4); the GGUF path below runs five
    for prompt in humaneval_prompts(2):
        expected = plain.generate(prompt, max_tokens=TOKENS)
        got = spec.generate(prompt, max_tokens=TOKENS)
        assert got.token_ids == expected.token_ids, prompt[:60]
        assert len(got.token_ids) == TOKENS or got.finish_reason == "stop"
        accepted += got.stats.accepted
    assert accepted > 0


@slow_float32
def test_chat_template_renders_and_generates(pair):
    target, draft = pair
    out = SpeculativeGenerator(target, draft).generate([{"role": "user", "content": "Say hi."}], max_tokens=8)
    assert out.prompt_ids[:2] == target.tokenizer.encode("<|im_start|>system")
    assert out.text


@pytest.fixture(scope="module")
def smol_pair():
    """The bundled target on the native kernels, and SmolLM2-135M-Instruct: another family, another vocabulary."""
    require_bundled()
    from verispec.kernels import native

    if not native.available():
        pytest.skip("native kernels not compiled")
    return load_model("target", quantization="gguf"), load_model(smollm2_path(), quantization="gguf")


@pytest.mark.slow  # 3 prompts x 3 generators on the real pair; the batched test below stays in the default set
def test_a_draft_of_another_vocabulary_drafts_for_the_target(smol_pair):
    """SmolLM2 (49,152 tokens of its own BPE) drafts for the Qwen target (151,936): greedy output equal to plain
    decoding's on HumanEval prompts with its drafts accepted in part, by itself and as suffix's model; a seeded
    sample equal to plain decoding's."""
    target, smol = smol_pair
    assert not target.tokenizer.shares_vocabulary(smol.tokenizer)
    plain = SpeculativeGenerator(target, None)
    spec = SpeculativeGenerator(target, smol, num_speculative_tokens=4, adaptive=False, speculative_method="draft")
    suffix = SpeculativeGenerator(target, smol, num_speculative_tokens=4, adaptive=False)
    accepted, rejected = 0, 0
    for prompt in humaneval_prompts(3):
        expected = plain.generate(prompt, max_tokens=TOKENS)
        got = spec.generate(prompt, max_tokens=TOKENS)
        assert got.token_ids == expected.token_ids, prompt[:60]
        assert suffix.generate(prompt, max_tokens=TOKENS).token_ids == expected.token_ids, prompt[:60]
        accepted, rejected = accepted + got.stats.accepted, rejected + got.stats.drafted - got.stats.accepted
    assert accepted > 0 and rejected > 0
    sampled = {"temperature": 0.8, "top_p": 0.95, "seed": 7}
    prompt = humaneval_prompts(1)[0]
    assert spec.generate(prompt, 48, **sampled).token_ids == plain.generate(prompt, 48, **sampled).token_ids


def test_a_draft_of_another_vocabulary_batched_gets_each_request_its_plain_output(smol_pair):
    """Three requests at once through the scheduler, SmolLM2 drafting for each (greedy, and seeded at two
    temperatures): each gets plain decoding's output for its prompt and seed."""
    from verispec.decoding.sampling import SamplingParams
    from verispec.engine.requests import EngineRequest, FinishEvent
    from verispec.engine.scheduler import Scheduler, SchedulerConfig

    target, smol = smol_pair
    plain = SpeculativeGenerator(target, None)
    config = SchedulerConfig(max_num_seqs=3, draft_policy="always", speculative_method="draft")
    scheduler = Scheduler(target, smol, config)
    options = [{}, {"temperature": 0.8, "seed": 3}, {"temperature": 1.0, "top_p": 0.9, "seed": 11}]
    prompts = humaneval_prompts(3)
    events: list[list] = [[] for _ in prompts]
    for i, (prompt, option) in enumerate(zip(prompts, options, strict=True)):
        ids, params = target.tokenizer.encode(prompt), SamplingParams(**option)
        scheduler.submit(EngineRequest(request_id=str(i), prompt_ids=ids, params=params, max_tokens=48,
                                       sink=events[i].append))  # fmt: skip
    scheduler.run_until_idle(max_steps=1000)
    for prompt, option, got in zip(prompts, options, events, strict=True):
        assert isinstance(got[-1], FinishEvent), got[-1]
        assert got[-1].output.token_ids == plain.generate(prompt, max_tokens=48, **option).token_ids, option
    assert sum(e[-1].output.stats.accepted for e in events) > 0


def test_the_identity_with_smollm2_is_the_verifiers_doing(smol_pair, monkeypatch):
    """The negative control of the tests above: a verifier that accepts every drafted token emits SmolLM2's
    translated drafts as they come, and the output is no longer plain decoding's."""
    from verispec.engine import verification

    def accept_all(drafts, parents, choices):
        return [(len(tokens), chosen[len(tokens)], None) for tokens, chosen in zip(drafts, choices, strict=True)]

    target, smol = smol_pair
    prompt = humaneval_prompts(1)[0]
    expected = SpeculativeGenerator(target, None).generate(prompt, max_tokens=TOKENS).token_ids
    monkeypatch.setattr(verification, "verify_batch", accept_all)
    spec = SpeculativeGenerator(target, smol, num_speculative_tokens=4, adaptive=False, speculative_method="draft")
    assert spec.generate(prompt, max_tokens=TOKENS).token_ids != expected


@pytest.fixture(
    scope="module",
    params=[pytest.param(("int4", "int4-all"), marks=pytest.mark.slow), ("gguf", "gguf")],  # PyTorch's int4: slow
    ids=["int4", "gguf"],
)
def int4_pair(request):
    """The quantized formats whose kernels keep rows independent: PyTorch's int4, and the native kernels on the
    GGUF blocks as stored."""
    require_bundled()
    from verispec.kernels import native

    if request.param[0] == "gguf" and not native.available():
        pytest.skip("native kernels not compiled")
    return load_model("target", quantization=request.param[0]), load_model("draft", quantization=request.param[1])


def _step_and_block_logits(model, ids: list[int], block: int):
    """Logits of the last `block` positions, decoded one token at a time and in one pass."""
    step_cache, block_cache = model.new_cache(max_len=len(ids)), model.new_cache(max_len=len(ids))
    for cache in (step_cache, block_cache):
        model(torch.tensor([ids[:-block]]), cache, [0])
    stepwise = torch.cat([model(torch.tensor([[t]]), step_cache, [0])[0] for t in ids[-block:]])
    return stepwise, model(torch.tensor([ids[-block:]]), block_cache, [0])[0]


def test_int4_logits_do_not_depend_on_how_many_tokens_share_the_pass(int4_pair):
    model = int4_pair[0].model
    ids = int4_pair[0].tokenizer.encode(humaneval_prompts(1)[0])
    stepwise, blockwise = _step_and_block_logits(model, ids, 5)
    assert torch.equal(stepwise, blockwise)
    # the property is not free: with the ordinary batched attention (blocks one by one) the same logits differ
    fused, model.fused_blocks = model.fused_blocks, None
    for layer in model.layers:
        layer.attn.batch_invariant = False
    try:
        stepwise, blockwise = _step_and_block_logits(model, ids, 5)
        assert not torch.equal(stepwise, blockwise)
    finally:
        model.fused_blocks = fused
        for layer in model.layers:
            layer.attn.batch_invariant = True


def test_int4_greedy_speculative_equals_int4_plain_on_humaneval(int4_pair):
    target, draft = int4_pair
    plain = SpeculativeGenerator(target, None)
    spec = SpeculativeGenerator(
        target, draft, num_speculative_tokens=6, adaptive=False, draft_vocab=DEFAULT_DRAFT_VOCAB,
        speculative_method="draft", draft_window=0,
    )  # fmt: skip  # the acceptance below checks the draft's weights: it reads the whole prompt, as the target does
    drafted = accepted = 0
    # PyTorch's int4 kernels are the slower path (58 s for five prompts on a Zen 4): three there, five natively
    for prompt in humaneval_prompts(5 if target.model.fused_blocks is not None else 3):
        out = spec.generate(prompt, max_tokens=TOKENS)
        assert out.token_ids == plain.generate(prompt, max_tokens=TOKENS).token_ids
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    # Lossless whatever the draft does, so also check the draft is the real one: this pair agrees on most code
    # tokens, and a draft whose int4 weights were unpacked in the wrong layout accepted none.
    assert accepted > 0.5 * drafted


# ---- the API's features on the real pair (native kernels): exact under speculation -------------------------------


@pytest.fixture(scope="module")
def gguf_pair():
    require_bundled()
    from verispec.kernels import native

    if not native.available():
        pytest.skip("native kernels not compiled")
    return load_model("target", quantization="gguf"), load_model("draft", quantization="gguf")


@pytest.mark.slow
def test_json_schema_outputs_parse_validate_and_equal_plain_constrained_decoding(gguf_pair):
    """Twenty schemas, each with its own prompt (`bench --dataset json-schema`): every answer (greedy, speculating)
    parses and validates; the first five equal plain constrained decoding token for token."""
    import json

    from jsonschema import validate

    from verispec import GrammarSpec
    from verispec.bench.schemas import SCHEMAS

    target, draft = gguf_pair
    spec = SpeculativeGenerator(target, draft, num_speculative_tokens=3, speculative_method="hybrid")
    plain = SpeculativeGenerator(target, None)
    drafted = 0
    for i, (topic, schema) in enumerate(SCHEMAS):
        messages = [{"role": "user", "content": f"{topic}, as JSON."}]
        grammar = GrammarSpec("json_schema", json.dumps(schema))
        out = spec.generate(messages, max_tokens=120, grammar=grammar)
        assert out.finish_reason == "stop", (topic, out.text)
        validate(json.loads(out.text), schema)
        drafted += out.stats.drafted
        if i < 5:
            assert out.token_ids == plain.generate(messages, max_tokens=120, grammar=grammar).token_ids, topic
    assert drafted > 0


def test_a_json_answer_whose_string_hits_its_max_length_still_ends_as_json(gguf_pair):
    """The agent loop's sixth request: its `thought` reaches maxLength mid-sentence. With any whitespace allowed,
    the model went on with blanks to max_tokens and the answer never closed; now it closes and validates."""
    import json
    import re

    from jsonschema import validate

    from verispec import GrammarSpec
    from verispec.bench.repetition import agent_loop

    target, draft = gguf_pair
    _, messages, schema = agent_loop()[5]
    spec = SpeculativeGenerator(target, draft, num_speculative_tokens=3, speculative_method="suffix")
    out = spec.generate(messages, max_tokens=128, grammar=GrammarSpec("json_schema", json.dumps(schema)))
    assert out.finish_reason == "stop", out.text
    validate(json.loads(out.text), schema)
    assert not re.search(r"\s{67}", out.text)  # 32 blanks, a line break, 32 blanks at most


def test_logprobs_and_penalties_under_speculation_equal_plain_decoding(gguf_pair):
    target, draft = gguf_pair
    spec = SpeculativeGenerator(target, draft, num_speculative_tokens=4, adaptive=False)
    plain = SpeculativeGenerator(target, None)
    prompt = humaneval_prompts(2)[1]
    on, off = (g.generate(prompt, max_tokens=TOKENS, logprobs=3) for g in (spec, plain))
    assert on.token_ids == off.token_ids and on.stats.accepted > 0
    assert [(x.logprob, x.top) for x in on.logprobs] == [(x.logprob, x.top) for x in off.logprobs]  # bit for bit
    adjust = {"presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {on.token_ids[3]: -100.0}}
    penalised = spec.generate(prompt, max_tokens=TOKENS, **adjust)
    assert penalised.token_ids == plain.generate(prompt, max_tokens=TOKENS, **adjust).token_ids
    assert penalised.token_ids != on.token_ids and penalised.stats.accepted > 0


@pytest.mark.parametrize(("name", "tiled"), [pytest.param("target", False, marks=pytest.mark.slow), ("smollm2", True)])
def test_token_embeddings_get_a_tile_form_only_where_they_are_the_head(name, tiled, tmp_path, monkeypatch):
    """The target has its own output head, so its embeddings are only looked up (from the GGUF rows): no tile
    form of them is written. SmolLM2 ties its head to the embeddings, which then need one."""
    require_bundled()
    from verispec.models import bundled, gguf_native
    from verispec.models.gguf_source import GGUFSource

    current, repacked = [], []  # the tensor being indexed (named by its finiteness check), those repacked
    check = gguf_native._check_finite
    monkeypatch.setattr(gguf_native, "_check_finite", lambda p, t, e: current.append(t) or check(p, t, e))
    monkeypatch.setattr(gguf_native.native, "repack", lambda *_: repacked.append(current[-1]))
    path = bundled.bundled_path("target", progress=False) if name == "target" else smollm2_path()
    tensors = gguf_native._write_tiles(path, GGUFSource(path), tmp_path / "tiles.bin", progress=False)
    assert ("token_embd.weight" in repacked) == tiled
    assert ("output.weight" in tensors) != tiled
    assert "blk.0.ffn_down.weight" in repacked


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["F16", "BF16"])
def test_a_dense_gguf_runs_on_the_native_kernels(kind, tmp_path, monkeypatch):
    """SmolLM2 with its matrices as F16 / BF16: the native dense kernels run it (not PyTorch's int4, which would
    quantize it), its logits are the float32 model's within rounding, and greedy speculation is exact."""
    from verispec.kernels import native
    from verispec.kernels.stack import NativeStack

    if not native.available():
        pytest.skip("native kernels not compiled")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    path = dense_copy(smollm2_path(), tmp_path / f"smollm2-{kind}.gguf", kind)
    loaded = load_model(path, quantization="gguf", progress=False)
    assert isinstance(loaded.model.fused_blocks, NativeStack)
    reference = load_model(path, "float32", progress=False).model
    ids = torch.tensor([loaded.tokenizer.encode(humaneval_prompts(1)[0])])
    logits = [m(ids, m.new_cache(1, ids.shape[1]), [0])[0] for m in (loaded.model, reference)]
    assert (logits[0] - logits[1]).abs().max() < 1e-3 * logits[1].abs().max()
    plain = SpeculativeGenerator(loaded, None).generate(humaneval_prompts(1)[0], max_tokens=32)
    spec = SpeculativeGenerator(loaded, loaded, num_speculative_tokens=4, adaptive=False)
    assert spec.generate(humaneval_prompts(1)[0], max_tokens=32).token_ids == plain.token_ids
