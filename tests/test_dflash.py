"""DFlash (`--speculative-method dflash`): the block drafter's maths against an independent reading of it, its
checkpoint in the published layout and as llama.cpp's converter writes it, llama.cpp's own drafts for the same target
state, its output equal to plain decoding's (greedy and seeded, alone and batched, PyTorch and native targets), and
the one-line refusals of a drafter its target cannot serve."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from dflash_drafters import MASK, write_agreeing_drafter, write_drafter
from hidden_drafting import alone_as_plain, exact_first_two, on_native, rms, rotated, run_as_plain
from safetensors.torch import load_file

from verispec import SpeculativeGenerator, load_model
from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams
from verispec.engine.dflash import DFlashProposer
from verispec.engine.drafting import DraftJob
from verispec.errors import InvalidParameterError, ModelLoadError
from verispec.models.dflash_checkpoint import load_dflash
from verispec.testing import byte_tokenizer, tiny_config, tiny_loaded, tiny_model

from architectures import TINY, make_model, save

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "dflash"
PROMPTS = ["hello world", "The quick brown fox", "abc abc abc abc abc"]


# ---- the reference: DFlash's drafter as z-lab's DFlashDraftModel and llama.cpp's graph (src/models/dflash.cpp) ---


def reference_block(folder: Path, features: torch.Tensor, tokens: list[int], embed: torch.Tensor,
                    head: torch.Tensor, k: int) -> tuple[list[int], torch.Tensor]:  # fmt: skip
    """Greedy drafts after `tokens` and their logits [k, vocab]: the context g = hidden_norm(fc(features)) at positions
    0 .. n - 2 (`features` [n - 1, m x hidden]), the block [tokens[-1], MASK x k] at n - 1 ..; every layer's keys
    and values the context's and the block's side by side (k_norm on both), no mask; the target's `embed`, `head`."""
    t, c = load_file(folder / "model.safetensors"), json.loads((folder / "config.json").read_text())
    eps, heads, kv, dim, theta = (c[key] for key in ("rms_norm_eps", "num_attention_heads", "num_key_value_heads",
                                                     "head_dim", "rope_theta"))  # fmt: skip
    n = len(tokens)
    g = rms(features @ t["fc.weight"].T, t["hidden_norm.weight"], eps)
    x = embed[torch.tensor([tokens[-1]] + [c["dflash_config"]["mask_token_id"]] * k)]
    context, block = torch.arange(n - 1), torch.arange(n - 1, n + k)
    for i in range(c["num_hidden_layers"]):
        p = lambda name, i=i: t[f"layers.{i}.{name}"]  # noqa: E731
        h = rms(x, p("input_layernorm.weight"), eps)
        q = rotated(rms((h @ p("self_attn.q_proj.weight").T).view(-1, heads, dim), p("self_attn.q_norm.weight"),
                          eps), block, theta)  # fmt: skip
        both = torch.cat([g, h])
        keys = rms((both @ p("self_attn.k_proj.weight").T).view(-1, kv, dim), p("self_attn.k_norm.weight"), eps)
        keys = rotated(keys, torch.cat([context, block]), theta).repeat_interleave(heads // kv, dim=1)
        values = (both @ p("self_attn.v_proj.weight").T).view(-1, kv, dim).repeat_interleave(heads // kv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, keys) / dim**0.5
        attended = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values).reshape(k + 1, heads * dim)
        x = x + attended @ p("self_attn.o_proj.weight").T
        m = rms(x, p("post_attention_layernorm.weight"), eps)
        x = x + (torch.nn.functional.silu(m @ p("mlp.gate_proj.weight").T) * (m @ p("mlp.up_proj.weight").T)) @ \
            p("mlp.down_proj.weight").T  # fmt: skip
    logits = rms(x, t["norm.weight"], eps)[1:] @ head.T
    return [int(i) for i in logits.argmax(-1)], logits


# ---- fixtures -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    """A tiny Qwen3 target (6 layers, no sliding window) as a Hugging Face folder."""
    model = make_model("qwen3", dims=TINY, num_hidden_layers=6, use_sliding_window=False)
    return save(model, tmp_path_factory.mktemp("dflash") / "target")


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _proposer(target, drafter) -> DFlashProposer:
    proposer = DFlashProposer(target, drafter, slots=2, max_len=256)
    target.serve_hidden(proposer.observe_hidden, layers=proposer.hidden_layers)
    return proposer


def _job(tokens: list[int], k: int, vocab: int, slot: int = 0) -> DraftJob:
    return DraftJob(slot=slot, tokens=tokens, k=k, most=15, params=SamplingParams(), noise=KeyedNoise(0, vocab))


def drafts_and_logits(target, drafter_path: Path, tokens: list[int], k: int):
    """verispec's drafts after `tokens` (the target run over all but the last) and the block's logits [k, vocab]."""
    drafter = load_dflash(str(drafter_path), target)
    proposer = _proposer(target.model, drafter)
    seen: list[torch.Tensor] = []
    pick = proposer._pick
    proposer._pick = lambda job, logits: (seen.append(logits), pick(job, logits))[1]
    try:
        target.model(torch.tensor([tokens[:-1]]), target.model.new_cache(2, 256), [0])
        drafted = proposer.propose([_job(tokens, k, target.model.config.vocab_size)])[0].tokens.tolist()
    finally:
        target.model.serve_hidden(None)
    return drafter, drafted, seen[0]


def _tokens(seed: int, length: int = 12) -> list[int]:
    return [int(t) for t in torch.randint(0, 250, (length,), generator=torch.Generator().manual_seed(seed))]


def test_the_drafter_drafts_what_an_independent_reading_of_dflash_drafts(qwen3, tmp_path):
    """Greedy drafts and their logits (a block of 1 + 5 rows) equal the reference's, the target's features taken from
    transformers' own hidden states (hidden_states[id + 1] of the config's ids, as z-lab's extract_context_feature)."""
    from transformers import AutoModelForCausalLM

    folder = write_drafter(tmp_path / "d", _config(qwen3), layers=2, target_layer_ids=[1, 4])
    target = load_model(qwen3, "float32", progress=False)
    tokens = _tokens(4)
    drafter, drafted, logits = drafts_and_logits(target, folder, tokens, 5)
    assert drafter.spec.target_layers == (2, 5)
    hf = AutoModelForCausalLM.from_pretrained(qwen3, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        states = hf(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
    features = torch.cat([states[i + 1][0] for i in (1, 4)], dim=-1)
    expected, reference = reference_block(folder, features, tokens, hf.model.embed_tokens.weight.detach(),
                                          hf.lm_head.weight.detach(), 5)  # fmt: skip
    assert drafted == expected
    assert torch.allclose(logits, reference, atol=1e-4 * reference.abs().max(), rtol=0)


def test_a_causal_block_is_caught_by_the_reference(qwen3, tmp_path):
    """The control: the block's rows attending causally among themselves (llama.cpp's dflash.attention.causal, which
    this drafter refuses) give other logits than the reference's; so does a context read one layer off."""
    folder = write_drafter(tmp_path / "d", _config(qwen3), layers=2, target_layer_ids=[1, 4])
    target = load_model(qwen3, "float32", progress=False)
    tokens = _tokens(6)
    _, _, ours = drafts_and_logits(target, folder, tokens, 4)
    drafter = load_dflash(str(folder), target)
    proposer = _proposer(target.model, drafter)
    import verispec.engine.dflash as module

    full = module.visible_block
    module.visible_block = lambda starts, rows, width: full(starts, rows, width) & torch.ones(
        width, max(starts) + width, dtype=torch.bool).tril(max(starts))  # fmt: skip
    seen: list[torch.Tensor] = []
    pick = proposer._pick
    proposer._pick = lambda job, logits: (seen.append(logits), pick(job, logits))[1]
    try:
        target.model(torch.tensor([tokens[:-1]]), target.model.new_cache(2, 256), [0])
        proposer.propose([_job(tokens, 4, target.model.config.vocab_size)])
    finally:
        module.visible_block = full
        target.model.serve_hidden(None)
    assert not torch.allclose(seen[0], ours, atol=1e-3 * ours.abs().max())
    shifted = write_drafter(tmp_path / "s", _config(qwen3), layers=2, target_layer_ids=[2, 4])
    assert not torch.allclose(drafts_and_logits(target, shifted, tokens, 4)[2], ours, atol=1e-3 * ours.abs().max())


# ---- output equal to plain decoding's ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def agreeing(tmp_path_factory):
    """A target whose layers are small corrections, its mask token embedded as zero, and a drafter that drafts its
    bigram reading of the block's first token (dflash_drafters.py): drafts accepted often enough, in part."""
    model = tiny_model(tiny_config(num_layers=4), seed=0, scale=2.0, residual_gain=0.1)
    with torch.no_grad():
        model.embed.weight[MASK] = 0.0
    target = tiny_loaded(model, byte_tokenizer())
    return target, write_agreeing_drafter(tmp_path_factory.mktemp("agreeing") / "drafter", model)


@pytest.mark.parametrize("native", [False, True], ids=["pytorch", "native"])
def test_greedy_and_seeded_output_is_plain_decodings(one_thread, agreeing, native):
    """Alone: greedy output token for token, and a seed's sampled text, as plain decoding's; drafts were made and
    some accepted."""
    target, drafter = agreeing
    target = on_native(target) if native else target
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    spec = SpeculativeGenerator(target, str(drafter), speculative_method="dflash", num_speculative_tokens=4,
                                max_seq_len=256, adaptive=False, progress=False)  # fmt: skip
    accepted = alone_as_plain(spec, plain, PROMPTS)
    assert accepted > 5


@pytest.mark.parametrize("native", [False, True], ids=["pytorch", "native"])
def test_batched_with_shared_prompts_the_output_is_plain_decodings(one_thread, agreeing, native):
    """Five requests decoded together (three slots), greedy and seeded: three share a prompt, whose start the later
    ones take from the prefix cache (the drafter then reads from where the target's features start); each output is
    plain decoding's."""
    from verispec.engine.methods import get_method, load_models
    from verispec.engine.scheduler import Scheduler, SchedulerConfig

    target, drafter_path = agreeing
    target = on_native(target) if native else target
    target, drafter = load_models(get_method("dflash"), target, str(drafter_path))
    prompt = target.tokenizer.encode("the quick brown fox jumps over the lazy dog " * 3)
    other = target.tokenizer.encode("abc abc abc abc")
    requests = [("a", prompt, SamplingParams()), ("b", prompt, SamplingParams(temperature=0.9, seed=1)),
                ("c", other, SamplingParams()), ("d", other, SamplingParams(temperature=0.7, seed=4)),
                ("e", prompt, SamplingParams())]  # fmt: skip
    config = SchedulerConfig(max_num_seqs=3, max_model_len=256, draft_policy="always", prefill_chunk=16,
                             speculative_method="dflash", num_speculative_tokens=3)  # fmt: skip
    outputs = run_as_plain(Scheduler(target, drafter, config), target, requests)
    assert sum(outputs[n].stats.accepted for n in "ace") > 10
    assert sum(outputs[n].stats.cached_tokens for n in "abcde") > 0  # prompts' starts came from the prefix cache


LAW_VOCAB, LAW_RUNS, LAW_TOLERANCE = 7, 3000, 0.07  # TV over 49 outcomes; sampling noise about 0.025 at 3000


@pytest.mark.slow  # 3,000 seeded requests: in the slow set with the other methods' laws
def test_sampled_output_follows_the_targets_law(one_thread, tmp_path):
    """Sampled at temperature 1 over many seeds, the first two tokens follow the target's exact law (total variation
    within sampling noise), drafts accepted on the way; the drafter's own law (its bigram reading) is told apart at
    this sample size (the control: the test can fail)."""
    from verispec.testing import word_tokenizer

    from distributions import total_variation

    tokenizer = word_tokenizer(LAW_VOCAB)
    tokenizer.stop_token_ids = frozenset()
    mask = LAW_VOCAB - 1
    model = tiny_model(tiny_config(vocab_size=LAW_VOCAB, num_layers=4), seed=3, scale=1.0, residual_gain=0.5)
    with torch.no_grad():
        model.embed.weight[mask] = 0.0
    drafter = write_agreeing_drafter(tmp_path / "drafter", model, mask=mask)
    spec = SpeculativeGenerator(tiny_loaded(model, tokenizer), str(drafter), speculative_method="dflash",
                                num_speculative_tokens=3, adaptive=False, progress=False)  # fmt: skip
    prompt, counts, accepted = [0, 1, 2, 0, 1], Counter(), 0
    for seed in range(LAW_RUNS):
        out = spec.generate(prompt, max_tokens=4, ignore_eos=True, temperature=1.0, seed=seed)
        counts[tuple(out.token_ids[:2])] += 1
        accepted += out.stats.accepted
    assert accepted > 0
    assert total_variation(counts, exact_first_two(model, prompt, LAW_VOCAB), LAW_RUNS) < LAW_TOLERANCE
    bigram = tiny_model(tiny_config(vocab_size=LAW_VOCAB, num_layers=4), seed=3, scale=1.0, residual_gain=0.0)
    with torch.no_grad():
        bigram.embed.weight[mask] = 0.0
    assert total_variation(counts, exact_first_two(bigram, prompt, LAW_VOCAB), LAW_RUNS) > LAW_TOLERANCE


@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_the_fixtures_targets_output_is_plain_decodings(one_thread, name):
    """The converted drafters beside their Qwen3 and Llama targets (GGUF, on the native stack and as PyTorch weights):
    greedy and seeded output as plain decoding's, drafts made."""
    drafter = str(FIXTURES / f"{name}.q8_0.gguf")
    for quantization in ("gguf", "none"):
        target = load_model(FIXTURES / f"{name}.target.f32.gguf", "float32", progress=False, quantization=quantization)
        plain = SpeculativeGenerator(target, None, max_seq_len=128, progress=False)
        spec = SpeculativeGenerator(target, drafter, speculative_method="dflash", num_speculative_tokens=5,
                                    max_seq_len=128, adaptive=False, progress=False)  # fmt: skip
        prompt = target.tokenizer.encode("hello world, hello world")
        for sampled in (dict(temperature=0), dict(temperature=0.8, seed=5)):
            out = spec.generate(prompt, max_tokens=16, ignore_eos=True, **sampled)
            assert out.token_ids == plain.generate(prompt, max_tokens=16, ignore_eos=True, **sampled).token_ids
            assert out.stats.drafted > 0


# ---- refusals ---------------------------------------------------------------------------------------------------
def _refused(tmp_path, qwen3, match: str, error=InvalidParameterError, target_dims: dict | None = None, **change):
    folder = write_drafter(tmp_path / "d", _config(qwen3) | (target_dims or {}), layers=2)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | change))
    target = load_model(qwen3, "float32", progress=False)
    with pytest.raises(error, match=match) as raised:
        SpeculativeGenerator(target, str(folder), speculative_method="dflash", progress=False)
    assert "\n" not in str(raised.value)


def test_a_drafter_for_another_hidden_size_is_refused_in_one_line(tmp_path, qwen3):
    _refused(tmp_path, qwen3, "reads hidden states of 64 values and embeds in 64; the target's have 32",
             target_dims={"hidden_size": 64})  # fmt: skip


def test_a_drafter_reading_layers_the_target_lacks_is_refused_in_one_line(tmp_path, qwen3):
    _refused(tmp_path, qwen3, r"reads the inputs of target layers \[2, 10\]; the target has 6 layers",
             dflash_config={"mask_token_id": MASK, "target_layer_ids": [1, 9]})  # fmt: skip


def test_a_drafter_for_another_vocabulary_is_refused_in_one_line(tmp_path, qwen3):
    _refused(tmp_path, qwen3, "drafts in a vocabulary of 151936 tokens", vocab_size=151936)


def test_a_config_field_the_drafter_does_not_compute_is_refused(tmp_path, qwen3):
    _refused(tmp_path, qwen3, "dflash_config.conv_kernel_size", error=ModelLoadError,
             dflash_config={"mask_token_id": MASK, "target_layer_ids": [1, 4], "conv_kernel_size": 4})  # fmt: skip


def test_a_drafter_with_sliding_windows_is_refused_in_one_line(tmp_path, qwen3):
    """Its layers' windows are not computed by the block pass: refused, not ignored."""
    _refused(tmp_path, qwen3, "sliding windows", error=ModelLoadError, use_sliding_window=True, sliding_window=4,
             max_window_layers=0, layer_types=["sliding_attention"] * 2)  # fmt: skip


# ---- llama.cpp's conversions and drafts (tests/fixtures/dflash/make.py, llamacpp_drafts.py) -------------------------
@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_llama_cpps_conversions_draft_as_the_folder(name):
    """The drafter as llama.cpp's converter writes it (--target-model-dir; the target layers written as the ids + 1)
    reads as the folder: F32 the same drafts and logits (to float rounding), Q8_0 logits within its 8-bit rounding
    (0.05 of the largest)."""
    target = load_model(FIXTURES / f"{name}.target.f32.gguf", "float32", progress=False)
    tokens = _tokens(9)
    folder, drafted, logits = drafts_and_logits(target, FIXTURES / name, tokens, 6)
    for outtype, tolerance in (("f32", 1e-5), ("q8_0", 5e-2)):
        path = FIXTURES / f"{name}.{outtype}.gguf"
        converted, their_drafts, their_logits = drafts_and_logits(target, path, tokens, 6)
        assert converted.spec.target_layers == folder.spec.target_layers
        assert (converted.spec.block_size, converted.spec.mask_token) == (folder.spec.block_size, MASK)
        assert torch.allclose(their_logits, logits, atol=tolerance * logits.abs().max(), rtol=0), outtype
        if outtype == "f32":
            assert their_drafts == drafted


@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_the_drafts_are_llama_cpps_own(name):
    """llama.cpp's own DFlash (its C API in the flow of its draft-dflash: the target's layer inputs injected into the
    drafter's cache, then one non-causal block pass of [last token, MASK x k]; llamacpp_drafts.py) on the same target
    file and drafter file: the same drafts after each sequence, at every block length recorded, and each draft's
    logits within 1e-2 of the largest (llama.cpp keeps keys and values in float16)."""
    recorded = json.loads((FIXTURES / "llamacpp_drafts.json").read_text())[name]
    target = load_model(FIXTURES / f"{name}.target.f32.gguf", "float32", progress=False)
    for run in recorded:
        _, drafted, logits = drafts_and_logits(target, FIXTURES / f"{name}.f32.gguf", run["tokens"], run["k"])
        theirs = torch.tensor(run["logits"])
        assert drafted == run["drafts"]
        assert torch.allclose(logits, theirs, atol=1e-2 * theirs.abs().max(), rtol=0)
