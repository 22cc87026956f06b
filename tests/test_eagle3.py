"""EAGLE-3 (`--speculative-method eagle3`): the head's maths against an independent reading of it, its checkpoints in
both published layouts and as llama.cpp's converter writes them, the target's layer inputs it reads (PyTorch and the
native stack), its output equal to plain decoding's (greedy and seeded, alone and batched, chains and trees), and the
one-line refusals of a head its target cannot serve."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from eagle3_heads import FOLDER_LAYOUTS, LAYOUTS, layer_config, write_agreeing_head, write_head
from hidden_drafting import alone_as_plain, exact_first_two, on_native, rms, rotated, run_as_plain
from safetensors.torch import load_file

from verispec import SpeculativeGenerator, load_model
from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams
from verispec.engine.drafting import DraftJob, LookupPricing
from verispec.engine.eagle3 import Eagle3Drafter
from verispec.engine.eagle3_tree import DraftTree
from verispec.errors import InvalidParameterError, ModelLoadError
from verispec.models.eagle3 import default_layers
from verispec.models.eagle3_checkpoint import load_eagle3
from verispec.testing import byte_tokenizer, tiny_config, tiny_loaded, tiny_model, word_tokenizer

from architectures import make_model, save
from distributions import total_variation

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "eagle3"
PROMPTS = ["hello world", "The quick brown fox", "abc abc abc abc abc"]


# ---- the reference: EAGLE-3's head as the paper and llama.cpp's graph (src/models/eagle3.cpp) write it ----------


def _reference_rows(t: dict, config: dict, embeds: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The head's decoder layer over a whole sequence of rows (no cache: each row attends to every row up to its own),
    rows at positions 0, 1, ...; returns the prenorm outputs."""
    eps, heads, kv, dim = config["rms_norm_eps"], config["num_attention_heads"], config["num_key_value_heads"], \
        config["head_dim"]  # fmt: skip
    layer = "midlayer." if "midlayer.hidden_norm.weight" in t else "layers.0."
    normed = rms(g, t[layer + "hidden_norm.weight"], eps)
    x = torch.cat([rms(embeds, t[layer + "input_layernorm.weight"], eps), normed], -1)
    n = x.shape[0]
    positions = torch.arange(n)
    q = rotated((x @ t[layer + "self_attn.q_proj.weight"].T).view(n, heads, dim), positions, config["rope_theta"])
    k = rotated((x @ t[layer + "self_attn.k_proj.weight"].T).view(n, kv, dim), positions, config["rope_theta"])
    v = (x @ t[layer + "self_attn.v_proj.weight"].T).view(n, kv, dim)
    k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / dim**0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attended = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * dim)
    residual = normed if config.get("norm_before_residual") else g
    h = residual + attended @ t[layer + "self_attn.o_proj.weight"].T
    m = rms(h, t[layer + "post_attention_layernorm.weight"], eps)
    gate, up = m @ t[layer + "mlp.gate_proj.weight"].T, m @ t[layer + "mlp.up_proj.weight"].T
    return h + (torch.nn.functional.silu(gate) * up) @ t[layer + "mlp.down_proj.weight"].T


def reference_drafts(folder: Path, features: torch.Tensor, tokens: list[int], embed: torch.Tensor, k: int):
    """Greedy drafts after `tokens` from the target's `features` [len(tokens) - 1, 3 x hidden] (positions 0 ..
    n - 2) and each draft's logits over the draft vocabulary: the whole sequence recomputed for every draft, each
    further row reading the head's prenorm output before it."""
    t, config = load_file(folder / "model.safetensors"), layer_config(json.loads((folder / "config.json").read_text()))
    table = t.get("embed_tokens.weight", embed)
    d2t = t["d2t"].long() + torch.arange(t["d2t"].numel())
    g = features @ t["fc.weight"].T
    embeds = table[torch.tensor(tokens[1:])]
    drafts, logits = [], []
    for _ in range(k):
        last = _reference_rows(t, config, embeds, g)[-1]
        row = rms(last, t["norm.weight"], config["rms_norm_eps"]) @ t["lm_head.weight"].T
        drafts.append(int(d2t[int(row.argmax())]))
        logits.append(row)
        embeds, g = torch.cat([embeds, table[drafts[-1]][None]]), torch.cat([g, last[None]])
    return drafts, torch.stack(logits)


# ---- fixtures -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A tiny Llama target (4 layers) as a Hugging Face folder."""
    return save(make_model("llama", num_hidden_layers=4), tmp_path_factory.mktemp("eagle3") / "target")


def _target_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _drafter(target, head) -> Eagle3Drafter:
    drafter = Eagle3Drafter(target, head, slots=2, max_len=256)
    target.serve_hidden(drafter.observe_hidden, layers=drafter.hidden_layers)
    return drafter


def _job(tokens: list[int], k: int, vocab: int, slot: int = 0, tree: bool = False) -> DraftJob:
    return DraftJob(slot=slot, tokens=tokens, k=k, most=15, params=SamplingParams(), noise=KeyedNoise(0, vocab),
                    pricing=LookupPricing(tree=tree))  # fmt: skip


@pytest.mark.parametrize("layout", FOLDER_LAYOUTS)
def test_the_head_drafts_what_an_independent_reading_of_eagle3_drafts(llama, tmp_path, layout):
    """Greedy drafts and their logits (every draft of a chain of 4) equal the reference's, the target's features taken
    from transformers' own hidden states; every layout (vllm: embeddings and a hidden size of its own, named target
    layers, norm_before_residual; speculators: the layer's config nested, embeddings of its own, its layers named at
    the top)."""
    from transformers import AutoModelForCausalLM

    head_folder = write_head(tmp_path / layout, layout, _target_config(llama), hidden=48 if layout == "vllm" else None)
    target = load_model(llama, "float32", progress=False)
    head = load_eagle3(str(head_folder), target)
    drafter = _drafter(target.model, head)
    config = json.loads((head_folder / "config.json").read_text())
    named = config.get("eagle_aux_hidden_state_layer_ids") or config.get("eagle_config", {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    assert drafter.hidden_layers == (tuple(named) if named else (2, 2, 1))  # as named, else the default for 4 layers
    tokens = [int(t) for t in torch.randint(0, 250, (12,), generator=torch.Generator().manual_seed(4))]
    cache = target.model.new_cache(2, 256)
    try:
        target.model(torch.tensor([tokens[:-1]]), cache, [0])  # positions 0 .. n - 2, served to the drafter
        seen = []
        children = drafter._children
        drafter._children = lambda job, tree, parent, logits: (seen.append(logits), children(job, tree, parent, logits))
        drafted = drafter.propose([_job(tokens, 4, target.model.config.vocab_size)])[0].tokens.tolist()
    finally:
        target.model.serve_hidden(None)
    hf = AutoModelForCausalLM.from_pretrained(llama, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        states = hf(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
    features = torch.cat([states[layer][0] for layer in drafter.hidden_layers], dim=-1)
    expected, logits = reference_drafts(head_folder, features, tokens, hf.model.embed_tokens.weight.detach(), 4)
    assert drafted == expected
    ours = torch.stack(seen)
    assert torch.allclose(ours, logits, atol=1e-4 * logits.abs().max(), rtol=0)


def test_a_broken_head_is_caught_by_the_reference(llama, tmp_path):
    """The control: the reference tells a head whose residual is taken after the norm (the other variant) from the
    one the checkpoint says."""
    head_folder = write_head(tmp_path / "h", "specforge", _target_config(llama))
    target = load_model(llama, "float32", progress=False)
    head = load_eagle3(str(head_folder), target)
    features = torch.randn(7, 3 * 64, generator=torch.Generator().manual_seed(0))
    config = json.loads((head_folder / "config.json").read_text())
    (head_folder / "config.json").write_text(json.dumps(config | {"norm_before_residual": True}))
    tokens = list(range(10, 18))
    right = reference_drafts(head_folder, features, tokens, target.model.embed.weight.detach(), 1)[1]
    (head_folder / "config.json").write_text(json.dumps(config))
    wrong = reference_drafts(head_folder, features, tokens, target.model.embed.weight.detach(), 1)[1]
    assert not torch.allclose(right, wrong, atol=1e-3)
    assert head.spec.norm_before_residual is False


# ---- output equal to plain decoding's ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def agreeing(tmp_path_factory):
    """A target whose layers are small corrections and a head that drafts its bigram reading (eagle3_heads.py): drafts
    accepted often enough that chains and tree paths are kept in part."""
    model = tiny_model(tiny_config(num_layers=4), seed=0, scale=2.0, residual_gain=0.1)
    target = tiny_loaded(model, byte_tokenizer())
    return target, write_agreeing_head(tmp_path_factory.mktemp("agreeing") / "head", model)


@pytest.mark.parametrize("native", [False, True], ids=["pytorch", "native"])
@pytest.mark.parametrize("trees", [False, True], ids=["chains", "trees"])
def test_greedy_and_seeded_output_is_plain_decodings(one_thread, agreeing, native, trees):
    """Alone: greedy output token for token, and a seed's sampled text, as plain decoding's; drafts were made and
    some accepted (trees: some proposed as trees)."""
    target, head = agreeing
    target = on_native(target) if native else target
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    spec = SpeculativeGenerator(target, str(head), speculative_method="eagle3", num_speculative_tokens=4,
                                max_seq_len=256, adaptive=False, progress=False, token_trees=trees)  # fmt: skip
    accepted = alone_as_plain(spec, plain, PROMPTS)
    assert accepted > 10


@pytest.mark.parametrize("native", [False, True], ids=["pytorch", "native"])
def test_batched_with_shared_prompts_the_output_is_plain_decodings(one_thread, agreeing, native):
    """Five requests decoded together (three slots), greedy and seeded, trees on: three share a prompt, whose start
    the later ones take from the prefix cache (the head then reads from where the target's features start); each
    output is plain decoding's, and some drafts were proposed as trees."""
    from verispec.engine.methods import get_method, load_models
    from verispec.engine.scheduler import Scheduler, SchedulerConfig

    target, head_path = agreeing
    target = on_native(target) if native else target
    target, head = load_models(get_method("eagle3"), target, str(head_path))
    prompt = target.tokenizer.encode("the quick brown fox jumps over the lazy dog " * 3)
    other = target.tokenizer.encode("abc abc abc abc")
    requests = [("a", prompt, SamplingParams()), ("b", prompt, SamplingParams(temperature=0.9, seed=1)),
                ("c", other, SamplingParams()), ("d", other, SamplingParams(temperature=0.7, seed=4)),
                ("e", prompt, SamplingParams())]  # fmt: skip
    config = SchedulerConfig(max_num_seqs=3, max_model_len=256, draft_policy="always", prefill_chunk=16,
                             speculative_method="eagle3", num_speculative_tokens=3, token_trees=True)  # fmt: skip
    scheduler, trees = Scheduler(target, head, config), []
    propose = scheduler.proposer.propose
    scheduler.proposer.propose = lambda jobs: [trees.append(p.parents is not None) or p for p in propose(jobs)]
    outputs = run_as_plain(scheduler, target, requests)
    assert sum(outputs[n].stats.accepted for n in "ace") > 10
    assert any(trees)
    assert sum(outputs[n].stats.cached_tokens for n in "abcde") > 0  # prompts' starts came from the prefix cache


@pytest.mark.parametrize("name", ["qwen3", "gpt-oss"])
def test_other_families_targets_output_is_plain_decodings(one_thread, tmp_path, name):
    """A head (both layouts) beside a Qwen3 and a gpt-oss target (its sliding and full layers): greedy and seeded
    output, chains and trees, as plain decoding's."""
    types = {"layer_types": ["sliding_attention", "full_attention"] * 2} if name == "gpt-oss" else {}
    folder = save(make_model(name, num_hidden_layers=4, **types), tmp_path / name)
    target = load_model(folder, "float32", progress=False)
    plain = SpeculativeGenerator(target, None, max_seq_len=128, progress=False)
    prompt = target.tokenizer.encode("hello world, hello world")
    for layout, trees in zip(LAYOUTS, (False, True), strict=True):
        head = write_head(tmp_path / layout, layout, _target_config(folder), hidden=48 if layout == "vllm" else None)
        spec = SpeculativeGenerator(target, str(head), speculative_method="eagle3", num_speculative_tokens=3,
                                    max_seq_len=128, adaptive=False, progress=False, token_trees=trees)  # fmt: skip
        for sampled in (dict(temperature=0), dict(temperature=0.8, seed=5)):
            out = spec.generate(prompt, max_tokens=16, ignore_eos=True, **sampled)
            assert out.token_ids == plain.generate(prompt, max_tokens=16, ignore_eos=True, **sampled).token_ids
            assert out.stats.drafted > 0


LAW_VOCAB, LAW_RUNS, LAW_TOLERANCE = 7, 3000, 0.07  # TV over 49 outcomes; sampling noise about 0.025 at 3000


@pytest.mark.slow  # 3,000 seeded requests a law: in the slow set with the other methods' laws
@pytest.mark.parametrize("trees", [False, True], ids=["chains", "trees"])
def test_sampled_output_follows_the_targets_law(one_thread, tmp_path, trees):
    """Sampled at temperature 1 over many seeds, the first two tokens follow the target's exact law (total variation
    within sampling noise), drafts accepted on the way; the head's own law (its bigram reading) is told apart at this
    sample size (the control: the test can fail)."""
    tokenizer = word_tokenizer(LAW_VOCAB)
    tokenizer.stop_token_ids = frozenset()
    model = tiny_model(tiny_config(vocab_size=LAW_VOCAB, num_layers=4), seed=3, scale=1.0, residual_gain=0.5)
    head = write_agreeing_head(tmp_path / "head", model)
    spec = SpeculativeGenerator(tiny_loaded(model, tokenizer), str(head), speculative_method="eagle3",
                                num_speculative_tokens=3, adaptive=False, progress=False,
                                token_trees=trees)  # fmt: skip
    verified, settle = [], spec.engine.verifier.settle  # a round whose verdict has a path verified a tree
    spec.engine.verifier.settle = lambda *args: (args[-1][2] is not None and verified.append(1)) or settle(*args)
    prompt, counts, accepted = [0, 1, 2, 0, 1], Counter(), 0
    for seed in range(LAW_RUNS):
        # four tokens: drafts past the first round's (a prompt's whole catch-up for one draft is not made)
        out = spec.generate(prompt, max_tokens=4, ignore_eos=True, temperature=1.0, seed=seed)
        counts[tuple(out.token_ids[:2])] += 1
        accepted += out.stats.accepted
    assert accepted > 0 and bool(verified) == trees
    assert total_variation(counts, exact_first_two(model, prompt, LAW_VOCAB), LAW_RUNS) < LAW_TOLERANCE
    bigram = tiny_model(tiny_config(vocab_size=LAW_VOCAB, num_layers=4), seed=3, scale=1.0, residual_gain=0.0)
    assert total_variation(counts, exact_first_two(bigram, prompt, LAW_VOCAB), LAW_RUNS) > LAW_TOLERANCE


def test_a_tree_is_cut_where_its_rows_stop_paying():
    """Nodes kept in order of their paths' probability: all of them where wider passes cost nothing, the likeliest
    path where each row costs half a pass, none where each costs a whole one, all where nothing is measured yet;
    every cut a tree (parents first)."""
    tree = DraftTree(width=2, children=2)
    tree.add(-1, [(5, -0.1), (6, -1.5)])
    tree.add(0, [(7, -0.2), (8, -2.0)])
    tree.add(2, [(9, -0.3)])
    assert tree.chosen(15, lambda n: 1.0) == ([5, 6, 7, 8, 9], [-1, -1, 0, 0, 2])
    assert tree.chosen(15, lambda n: 1.0 + 0.5 * n) == ([5, 7], [-1, 0])
    assert tree.chosen(15, lambda n: 1.0 + n) == ([], [])  # no row repays its pass: nothing drafted
    assert tree.chosen(3, None) == ([5, 7, 9], [-1, 0, 1])
    assert tree.chosen(15, lambda n: None if n > 1 else 1.0) == ([5, 6, 7, 8, 9], [-1, -1, 0, 0, 2])


# ---- refusals ---------------------------------------------------------------------------------------------------
def _refused(tmp_path, llama, change: dict, match: str, error=InvalidParameterError):
    folder = write_head(tmp_path / "h", "specforge", _target_config(llama))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | change))
    if "hidden_size" in change:  # tensors of the other shape: a head made for that model
        write_head(folder, "specforge", _target_config(llama) | {"hidden_size": change["target_hidden_size"]})
        (folder / "config.json").write_text(json.dumps(json.loads((folder / "config.json").read_text()) | change))
    target = load_model(llama, "float32", progress=False)
    with pytest.raises(error, match=match) as raised:
        SpeculativeGenerator(target, str(folder), speculative_method="eagle3", progress=False)
    assert "\n" not in str(raised.value)


def test_a_head_for_another_hidden_size_is_refused_in_one_line(tmp_path, llama):
    _refused(tmp_path, llama, {"target_hidden_size": 96, "hidden_size": 64},
             "reads hidden states of 96 values; the target's have 64")  # fmt: skip


def test_a_head_reading_layers_the_target_lacks_is_refused_in_one_line(tmp_path, llama):
    _refused(tmp_path, llama, {"eagle_aux_hidden_state_layer_ids": [1, 16, 29]},
             r"reads the inputs of target layers \[1, 16, 29\]; the target has 4 layers")  # fmt: skip


def test_a_head_for_another_vocabulary_is_refused_in_one_line(tmp_path, llama):
    _refused(tmp_path, llama, {"vocab_size": 128256}, "drafts in a vocabulary of 128256 tokens; the target's has 258")


def test_a_config_field_the_head_does_not_compute_is_refused(tmp_path, llama):
    _refused(tmp_path, llama, {"eagle_config": {"use_last_layernorm": False}}, "eagle_config.use_last_layernorm",
             error=ModelLoadError)  # fmt: skip


def test_the_default_layers_are_low_middle_and_high():
    assert default_layers(32) == (2, 16, 29) and default_layers(36) == (2, 18, 33)


# ---- llama.cpp's conversions (tests/fixtures/eagle3/make.py) ------------------------------------------------------
def _drafts_and_logits(target, head_path: Path, tokens: list[int], k: int = 4):
    head = load_eagle3(str(head_path), target)
    drafter = _drafter(target.model, head)
    seen: list[torch.Tensor] = []
    children = drafter._children
    drafter._children = lambda job, tree, parent, logits: (seen.append(logits), children(job, tree, parent, logits))
    try:
        target.model(torch.tensor([tokens[:-1]]), target.model.new_cache(2, 256), [0])
        drafted = drafter.propose([_job(tokens, k, target.model.config.vocab_size)])[0].tokens.tolist()
    finally:
        target.model.serve_hidden(None)
    return head, drafted, torch.stack(seen)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_llama_cpps_conversions_draft_as_the_folder(tmp_path, layout):
    """The head as llama.cpp's converter writes it (--target-model-dir: the target's layers and hidden size, d2t as
    target ids, q and k rows permuted for its rotary) reads as the folder: F32 the same drafts and logits (to float
    rounding), Q8_0 logits within its 8-bit rounding (0.05 of the largest)."""
    from architectures import TINY

    folder = save(make_model("llama", dims=TINY, num_hidden_layers=4), tmp_path / "target")
    target = load_model(folder, "float32", progress=False)
    tokens = [int(t) for t in torch.randint(0, 250, (10,), generator=torch.Generator().manual_seed(9))]
    head, drafted, logits = _drafts_and_logits(target, FIXTURES / layout, tokens)
    for outtype, tolerance in (("f32", 1e-5), ("q8_0", 5e-2)):
        converted, their_drafts, their_logits = _drafts_and_logits(
            target, FIXTURES / f"{layout}.{outtype}.gguf", tokens
        )
        assert converted.spec.layers_of(4) == head.spec.layers_of(4)
        assert converted.spec.norm_before_residual == head.spec.norm_before_residual
        assert torch.equal(converted.d2t, head.d2t)
        assert torch.allclose(their_logits[0], logits[0], atol=tolerance * logits.abs().max(), rtol=0), outtype
        if outtype == "f32":
            assert their_drafts == drafted
            assert torch.allclose(their_logits, logits, atol=tolerance * logits.abs().max(), rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_drafts_are_llama_cpps_own(layout):
    """llama.cpp's own EAGLE-3 (its C API in the flow of its draft-eagle3: the target's layer inputs, the head's
    encoder, then its decoder chained four times; tests/fixtures/eagle3/llamacpp_drafts.py) on the same target file
    and head file: the same four drafts after each of three sequences, and each draft's logits within 1e-2 of the
    largest (llama.cpp keeps the target's keys and values in float16)."""
    recorded = json.loads((FIXTURES / "llamacpp_drafts.json").read_text())[layout]
    target = load_model(FIXTURES / "target.f32.gguf", "float32", progress=False)
    for run in recorded:
        head, drafted, logits = _drafts_and_logits(target, FIXTURES / f"{layout}.f32.gguf", run["tokens"])
        assert drafted == run["drafts"]
        spread = head.to_target_vocab(logits, target.model.config.vocab_size)
        ours = torch.stack([row[torch.isfinite(row)] for row in spread])
        theirs = torch.tensor(run["logits"])
        assert torch.allclose(ours, theirs, atol=1e-2 * theirs.abs().max(), rtol=0)
