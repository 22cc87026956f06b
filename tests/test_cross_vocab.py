"""A draft model of another vocabulary (engine/cross_vocab.py): the target's text cut into the draft's tokens as the
draft's tokenizer cuts it, the drafted text cut back into the target's tokens where they would fall, and output
equal to plain decoding's, greedy and seeded, alone and batched, for every method that takes such a draft."""

from __future__ import annotations

import random

import pytest
import torch
from test_vocab_vectors import FIXTURES, SEPARATOR, _built
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers

from verispec import SpeculativeGenerator
from verispec.decoding.noise import KeyedNoise
from verispec.decoding.sampling import SamplingParams
from verispec.engine import cross_vocab
from verispec.engine.cross_vocab import OtherVocabularyDrafter, SlotText, Translation
from verispec.engine.drafting import DraftJob
from verispec.engine.methods import (
    check_draft_model,
    check_draft_model_of_any_vocabulary,
    get_method,
    method_names,
)
from verispec.engine.requests import EngineRequest, FinishEvent
from verispec.engine.scheduler import Scheduler, SchedulerConfig
from verispec.errors import TokenizerMismatchError
from verispec.models.config import ModelConfig
from verispec.models.model import Transformer
from verispec.models.tokenizer import Tokenizer
from verispec.testing import EOS_TEXT, byte_tokenizer, tiny_config, tiny_loaded, tiny_model

# ordered (target, draft) pairs of real vocabularies: byte-level BPEs with and without digits split, and SentencePiece
# ones, whose space prefix and byte tokens are the boundaries' hard cases
PAIRS = [("qwen2", "llama-spm"), ("llama-spm", "qwen2"), ("qwen2", "llama-bpe"), ("llama-bpe", "phi-3"),
         ("phi-3", "gpt-2"), ("gpt-2", "llama-bpe")]  # fmt: skip
# the share of drafted texts whose target tokens are the target's own cut: measured 0.990-0.999 by pair on these
# texts (the README among them, which changes)
WELL_CUT = 0.98
CONTROL_FACTOR = 5  # a broken rule cuts otherwise at least this many times as often (measured: 14 and 240)


def _texts() -> list[str]:
    """llama.cpp's tokenizer test texts (spaces, digits, emoji, scripts) and two pages of code and prose."""
    texts = (FIXTURES / "ggml-vocab-qwen2.gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
    here = cross_vocab.__file__
    return [t for t in texts if t.strip()] + [open(here).read()[:3000], open(FIXTURES.parents[2] / "README.md").read()]


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory):
    root = str(tmp_path_factory.getbasetemp())
    return lambda family: _built(family, root)[0]


def _grown(translation: Translation, ids: list[int], seed: int) -> SlotText:
    """A slot's text brought to `ids` a few tokens at a time, as a sequence grows."""
    text, rng, n = SlotText(), random.Random(seed), 0
    while n < len(ids):
        n = min(len(ids), n + rng.randint(1, 4))
        translation.update(text, ids[:n])
    return text


@pytest.mark.parametrize(("target", "draft"), PAIRS)
def test_the_draft_reads_the_targets_text_as_its_own_tokenizer_cuts_it(target, draft, vocabularies):
    """The draft's tokens of a context grown token by token (re-cut from anchors, never from the start) are its
    tokenizer's tokens of the whole text: its BOS, SentencePiece's space prefix, merges across every step's end."""
    target_tokenizer, draft_tokenizer = vocabularies(target), vocabularies(draft)
    translation = Translation(target_tokenizer, draft_tokenizer)
    for number, text in enumerate(_texts()):
        ids = target_tokenizer.encode(text)
        slot = _grown(translation, ids, seed=number)
        assert slot.source == ids, text
        assert slot.tokens == draft_tokenizer.encode(text), text


def _boundaries(cutter: cross_vocab.Cutter, ids: list[int]) -> dict[int, int]:
    """Byte offset in the text -> the number of tokens that end there (its BOS and space prefix not text)."""
    lead = cutter.leading(ids)
    return {end - lead: i + 1 for i, end in enumerate(cutter.spelling.ends(ids)) if end > lead}


def _well_cut(target: Tokenizer, draft: Tokenizer) -> tuple[int, int]:
    """(drafts whose target tokens are the target's own cut of the text, drafts): at every place where both
    tokenizers cut the text on a whole character, the draft's next six tokens of it translated back."""
    translation = Translation(target, draft)
    good = total = 0
    for text in _texts():
        ids, drafted_ids = target.encode(text), draft.encode(text)
        data, drafted_at = text.encode(), _boundaries(translation.to_draft, drafted_ids)
        for at, m in sorted(_boundaries(translation.to_target, ids).items()):
            index = drafted_at.get(at)
            if index is None or m >= len(ids) or data[at] & 0xC0 == 0x80 or len(drafted_ids) - index < 2:
                continue
            back = translation.back(ids[:m], drafted_ids[index : index + 6], most=8)
            total += 1
            good += bool(back) and back == ids[m : m + len(back)]
    return good, total


@pytest.mark.parametrize(("target", "draft"), PAIRS)
def test_drafted_text_comes_back_as_the_targets_own_tokens(target, draft, vocabularies):
    """Text the draft drafts is proposed as the tokens the target's tokenizer cuts it into after the context (no
    space prefix mid-text, merges across the context's end), its last word left out where more text could lengthen
    it: all but a handful of drafts (a digit run or a word cut otherwise by the draft) are the target's own cut."""
    good, total = _well_cut(vocabularies(target), vocabularies(draft))
    assert total > 1000 and good >= WELL_CUT * total, (good, total)


@pytest.mark.parametrize(
    ("broken", "pair"), [("no lookbehind", ("llama-spm", "qwen2")), ("no last word left out", ("qwen2", "llama-bpe"))]
)
def test_the_boundary_rules_are_what_make_the_cut_right(broken, pair, vocabularies, monkeypatch):
    """The controls: encoding the drafted text alone (a SentencePiece target puts a space before it), or proposing
    the last drafted word whole (the target's cut of more text would lengthen it), cut otherwise many times as often
    as the rules do on the same pair."""
    target, draft = vocabularies(pair[0]), vocabularies(pair[1])
    good, total = _well_cut(target, draft)
    if broken == "no lookbehind":
        monkeypatch.setattr(cross_vocab, "LOOKBEHIND", 0)
    else:
        back = Translation.back

        def whole(self, context, drafted, most):
            self.draft_stops = frozenset(drafted)  # as if every draft ended with a stop token: nothing left out
            return back(self, context, drafted, most)

        monkeypatch.setattr(Translation, "back", whole)
    broken_good, broken_total = _well_cut(target, draft)
    assert broken_total - broken_good > CONTROL_FACTOR * max(1, total - good), (broken_good, good, total)


def test_a_context_ending_inside_a_character_is_not_drafted_for(vocabularies):
    """A token holding part of a character ends no text: nothing changes, and drafting waits for the whole one."""
    target, draft = vocabularies("llama-spm"), vocabularies("qwen2")
    translation = Translation(target, draft)
    ids = target.encode("a \U0001f680 b")  # the rocket is four byte tokens in Llama's vocabulary
    cut = next(n for n in range(1, len(ids)) if translation.to_target.spelling.text(ids[:n]).endswith(b"\xf0\x9f"))
    slot = SlotText()
    assert translation.update(slot, ids[: cut - 2])
    before = (list(slot.source), list(slot.tokens))
    assert not translation.update(slot, ids[:cut])
    assert (slot.source, slot.tokens) == before
    assert translation.update(slot, ids) and slot.tokens == draft.encode("a \U0001f680 b")


# ---- tiny models of other vocabularies --------------------------------------------------------------------------
def _byte_level(vocab: dict[str, int], merges: list[tuple[str, str]], regex: bool) -> Tokenizer:
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([EOS_TEXT])
    return Tokenizer(raw, EOS_TEXT, byte_tokenizer().chat_template)


ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())


def reversed_bytes() -> Tokenizer:
    """The byte tokenizer with its 256 ids in reverse order: every text cut alike, every id another."""
    return _byte_level({ch: 255 - i for i, ch in enumerate(ALPHABET)}, [], regex=False)


def merged_bytes() -> Tokenizer:
    """A byte-level BPE with GPT-2's pre-tokenizer and a few merges of English, its merged tokens first."""
    merges = [
        ("Ġ", "t"),
        ("h", "e"),
        ("Ġt", "he"),
        ("i", "n"),
        ("e", "r"),
        ("Ġ", "a"),
        ("o", "r"),
        ("l", "l"),
        ("Ġ", "w"),
        ("o", "r"),
        ("l", "d"),
        ("Ġw", "or"),
        ("Ġwor", "ld"),
        ("e", "l"),
        ("el", "l"),
        ("ell", "o"),
    ]
    merged = list(dict.fromkeys(a + b for a, b in merges))
    vocab = {token: i for i, token in enumerate(merged)}
    vocab |= {ch: len(merged) + 255 - i for i, ch in enumerate(ALPHABET)}
    return _byte_level(vocab, list(dict.fromkeys(merges)), regex=True)  # fmt: skip


def _ascii_only(model, tokenizer: Tokenizer) -> None:
    """The model writes printable ASCII and line breaks only (text every tokenizer reads back), never its end token."""
    head = model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        for token in range(head.out_features):
            spelled = tokenizer.token_bytes(token) if token < tokenizer.raw.get_vocab_size() else b""
            printable = spelled and token not in tokenizer.stop_token_ids
            printable = printable and all(32 <= b < 127 or b == 10 for b in spelled)
            biased.bias[token] = 0.0 if printable else -1e4
    model.lm_head = biased


def _target():
    tokenizer = byte_tokenizer()
    model = tiny_model(tiny_config(num_layers=4), seed=0, scale=2.0, residual_gain=0.3)
    _ascii_only(model, tokenizer)
    return tiny_loaded(model, tokenizer, "tiny-target")


def _first_layers(model: Transformer, layers: int) -> Transformer:
    """A draft made of the first layers of `model` (its embeddings and biased head too)."""
    small = Transformer(ModelConfig(**{**model.config.__dict__, "num_layers": layers}))
    small.lm_head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    kept = {k: v.clone() for k, v in model.state_dict().items()
            if not k.startswith("layers.") or int(k.split(".")[1]) < layers}  # fmt: skip
    small.load_state_dict(kept)
    return small.eval()


def _twin(target, layers: int):
    """The target's first `layers` layers in the reversed byte vocabulary: the same model, another vocabulary."""
    model = _first_layers(target.model, layers)
    order = torch.tensor([255 - i for i in range(256)] + [256])  # target id -> twin id
    with torch.no_grad():
        model.embed.weight[order] = target.model.embed.weight
        model.lm_head.weight[order] = target.model.lm_head.weight
        model.lm_head.bias[order] = target.model.lm_head.bias
    return tiny_loaded(model, reversed_bytes(), "tiny-twin")


def _stranger(target):
    """A random draft model over the merged vocabulary: it cuts text otherwise, and rarely agrees."""
    tokenizer = merged_bytes()
    model = tiny_model(tiny_config(vocab_size=tokenizer.raw.get_vocab_size(), num_layers=1), seed=5, scale=2.0)
    _ascii_only(model, tokenizer)
    return tiny_loaded(model, tokenizer, "tiny-stranger")


PROMPTS = ["hello world", "The quick brown fox", "in the order of the world", "a", "1234 + 5"]


@pytest.fixture(scope="module")
def pairs(one_thread):
    target = _target()
    return target, _twin(target, 1), _stranger(target)


def _generator(target, draft, method: str = "draft", k: int = 4) -> SpeculativeGenerator:
    return SpeculativeGenerator(target, draft, num_speculative_tokens=k, speculative_method=method, adaptive=False,
                                max_seq_len=256, progress=False)  # fmt: skip


def test_the_tiny_drafts_are_of_other_vocabularies(pairs):
    target, twin, stranger = pairs
    for draft in (twin, stranger):
        assert not target.tokenizer.shares_vocabulary(draft.tokenizer)
        with pytest.raises(TokenizerMismatchError):
            target.tokenizer.check_compatible(draft.tokenizer)
    assert isinstance(_generator(target, twin).engine.proposer, OtherVocabularyDrafter)


@pytest.mark.parametrize("k", [1, 3, 4])
def test_a_twin_in_another_vocabulary_drafts_what_it_drafts_in_the_targets(k, pairs):
    """The target's first layer in reversed ids drafts exactly what it drafts in the target's own ids: the same
    proposals, accepted in part and rolled back alike (its cache kept in its own tokens), the same counts; and the
    output is plain decoding's."""
    target, twin, _ = pairs
    same_vocabulary = tiny_loaded(_first_layers(target.model, 1), target.tokenizer)
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    for prompt in PROMPTS:
        expected = plain.generate(prompt, max_tokens=40).token_ids
        other, same = (
            _generator(target, draft, k=k).generate(prompt, max_tokens=40) for draft in (twin, same_vocabulary)
        )
        assert other.token_ids == same.token_ids == expected, prompt
        assert (other.stats.drafted, other.stats.accepted) == (same.stats.drafted, same.stats.accepted), prompt
        assert 0 < other.stats.accepted < other.stats.drafted


def test_a_twin_read_one_token_short_drafts_otherwise(pairs, monkeypatch):
    """The control: a translation that leaves out the context's last token drafts what the twin would not, so the
    counts of the test above move (its output is still plain decoding's: the draft never decides a token)."""
    target, twin, _ = pairs
    same_vocabulary = tiny_loaded(_first_layers(target.model, 1), target.tokenizer)
    update = Translation.update
    monkeypatch.setattr(Translation, "update", lambda self, text, context: update(self, text, context[:-1]))
    outputs = [_generator(target, draft).generate(PROMPTS[1], max_tokens=40) for draft in (twin, same_vocabulary)]
    assert outputs[0].token_ids == outputs[1].token_ids
    assert (outputs[0].stats.drafted, outputs[0].stats.accepted) != (
        outputs[1].stats.drafted,
        outputs[1].stats.accepted,
    )


METHODS = [m for m in method_names() if get_method(m).other_vocabulary]


def test_the_methods_drafting_with_a_model_of_their_own_take_one_of_another_vocabulary():
    assert set(METHODS) >= {"draft", "hybrid", "suffix"}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_and_seeded_output_with_a_draft_cut_otherwise_is_plain_decodings(method, k, pairs):
    target, _, stranger = pairs
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    spec = _generator(target, stranger, method, k)
    drafted = 0
    for prompt in PROMPTS:
        for options in ({}, {"temperature": 0.8, "top_k": 50, "seed": 3}, {"temperature": 1.0, "seed": 11}):
            got = spec.generate(prompt, max_tokens=30, **options)
            assert got.token_ids == plain.generate(prompt, max_tokens=30, **options).token_ids, (prompt, options)
            drafted += got.stats.drafted - got.stats.drafted_by_lookup
    assert drafted > 0


@pytest.mark.parametrize("method", METHODS)
def test_batched_requests_with_a_draft_of_another_vocabulary_get_their_own_outputs(method, pairs):
    """Six requests in three slots (greedy and seeded, some not speculating): each its plain output, the draft's
    slots reused by later requests."""
    target, twin, _ = pairs
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    config = SchedulerConfig(max_num_seqs=3, max_model_len=256, draft_policy="always", speculative_method=method)
    scheduler = Scheduler(target, twin, config)
    cases = [(p, SamplingParams() if i % 2 else SamplingParams(temperature=0.9, seed=i)) for i, p in enumerate(PROMPTS)]
    cases.append(("hello world, again", SamplingParams()))
    events: list[list] = []
    for i, (prompt, params) in enumerate(cases):
        events.append([])
        scheduler.submit(EngineRequest(request_id=str(i), prompt_ids=target.tokenizer.encode(prompt), params=params,
                                       max_tokens=30, sink=events[-1].append, speculative=i != 3))  # fmt: skip
    scheduler.run_until_idle(max_steps=2000)
    for (prompt, params), got in zip(cases, events, strict=True):
        assert isinstance(got[-1], FinishEvent), got[-1]
        options = {} if params.greedy else {"temperature": params.temperature, "seed": params.seed}
        assert got[-1].output.token_ids == plain.generate(prompt, max_tokens=30, **options).token_ids, prompt
    assert sum(e[-1].output.stats.accepted for e in events) > 0


def test_a_draft_of_another_vocabulary_bounds_neither_the_prompt_ids_nor_the_context(pairs):
    """Its vocabulary is not the target's ids (a prompt id past its size is the target's to read), and it reads the
    target's text windowed to its own positions: neither cuts the engine's limits."""
    target, _, stranger = pairs
    scheduler = Scheduler(target, stranger, SchedulerConfig(max_num_seqs=1, speculative_method="draft"))
    assert scheduler.vocab_size == target.model.config.vocab_size
    small = tiny_loaded(tiny_model(tiny_config(vocab_size=stranger.model.config.vocab_size, num_layers=1,
                                               max_position_embeddings=64)), stranger.tokenizer)  # fmt: skip
    spec = SpeculativeGenerator(target, small, speculative_method="draft", adaptive=False, max_seq_len=256,
                                progress=False)  # fmt: skip
    assert spec.max_seq_len == 256
    prompt = "the world " * 12  # more tokens than the draft's 64 positions
    plain = SpeculativeGenerator(target, None, max_seq_len=256, progress=False)
    got = spec.generate(prompt, max_tokens=40)
    assert got.token_ids == plain.generate(prompt, max_tokens=40).token_ids
    assert got.stats.drafted > 0


def _proposals(draft_loaded, target, params: SamplingParams) -> list[list[int]]:
    """What a fresh draft-method proposer proposes at k = 4 for each prompt, as a request with `params` asks."""
    proposer = _generator(target, draft_loaded).engine.proposer
    proposer.admit(0, "")
    found = []
    for prompt in PROMPTS:
        ids = target.tokenizer.encode(prompt)
        noise = KeyedNoise(params.seed or 0, target.model.config.vocab_size)
        found.append(
            proposer.propose([DraftJob(slot=0, tokens=ids, k=4, params=params, noise=noise)])[0].tokens.tolist()
        )
    return found


def test_a_sampled_request_is_drafted_the_drafts_argmax(pairs):
    """decisions.md: a draft of another vocabulary cannot race the target's keyed noise, so it proposes its argmax for
    a sampled request too (accepted with the target's probability of it). The control: a draft of the target's own
    vocabulary races the noise, and proposes otherwise for some prompt."""
    target, twin, stranger = pairs
    sampled = SamplingParams(temperature=1.5, seed=5)
    for draft in (twin, stranger):
        assert _proposals(draft, target, sampled) == _proposals(draft, target, SamplingParams())
    same_vocabulary = tiny_loaded(_first_layers(target.model, 1), target.tokenizer)
    assert _proposals(same_vocabulary, target, sampled) != _proposals(same_vocabulary, target, SamplingParams())


def test_a_method_drafting_in_the_targets_ids_only_refuses_another_vocabulary(pairs):
    """A method registered without Method.other_vocabulary keeps the default check: a draft of another vocabulary is
    refused in one line naming the first token that differs, before anything is built."""
    target, _, stranger = pairs
    with pytest.raises(TokenizerMismatchError, match="draft and target tokenizers differ"):
        check_draft_model(target, stranger)
    check_draft_model_of_any_vocabulary(target, stranger)  # the methods that take one: no refusal
