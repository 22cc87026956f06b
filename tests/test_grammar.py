"""Structured output through the engine (decoding/grammar.py, llguidance), against plain constrained decoding.

The greedy reference steps llguidance's own matcher one token at a time over a cache-free recomputation of the
model, so it shares neither the engine's masks-along-a-draft, its rollbacks nor its loop. The sampled test
computes the masked distribution by hand, from allowed sets written down in the test.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch
from speculation import METHODS, speculative_generator

from verispec import GrammarSpec, SpeculativeGenerator
from verispec.decoding.grammar import (
    MAX_CHOICES,
    MAX_GRAMMAR_BYTES,
    MAX_GRAMMAR_RULES,
    MAX_REGEX_BYTES,
    MAX_SCHEMA_DEFINITIONS,
    MAX_SCHEMA_DEPTH,
    GrammarError,
    GrammarMatcher,
)
from verispec.decoding.sampling import SamplingParams, probs_from_logits
from verispec.errors import InvalidParameterError
from verispec.testing import tiny_config, tiny_loaded, tiny_model, tiny_pair, word_tokenizer

from distributions import total_variation

REGEX = "(ab|c|ba)+x"


def _logits(model, seq: list[int]) -> torch.Tensor:
    return model(torch.tensor([seq], device=model.device), model.new_cache(max_len=len(seq)), [0])[0, -1].float()


def reference_constrained_greedy(loaded, prompt_ids, max_tokens, spec: GrammarSpec) -> list[int]:
    from llguidance import LLMatcher, LLTokenizer

    tokenizer, vocab = loaded.tokenizer, loaded.model.config.vocab_size
    stops = sorted(tokenizer.stop_token_ids)
    matcher = LLMatcher(LLTokenizer(tokenizer.raw.to_str(), n_vocab=vocab, eos_token=stops), spec.source())
    out: list[int] = []
    for _ in range(max_tokens):
        allowed = torch.tensor(list(matcher.compute_logit_bias()[:vocab])) > 0
        token = int(_logits(loaded.model, [*prompt_ids, *out]).masked_fill(~allowed, float("-inf")).argmax())
        if token in stops:
            break
        assert matcher.consume_token(token)
        out.append(token)
    return out


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.parametrize(("method", "k"), METHODS)
def test_greedy_constrained_output_equals_plain_constrained_decoding(pair, method, k):
    target, draft = pair
    generator = speculative_generator(target, draft, method, k)
    spec = GrammarSpec("regex", REGEX)
    drafted = stopped = 0
    for prompt in ["hello world", "abab abab abab", "x"]:
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=30, grammar=spec)
        assert out.token_ids == reference_constrained_greedy(target, ids, 30, spec), prompt
        stopped += out.finish_reason == "stop"
        if out.finish_reason == "stop":
            assert re.fullmatch(REGEX, out.text)
        else:
            assert re.fullmatch(r"(ab|c|ba)*(a|b)?", out.text)  # a prefix of a match
        drafted += out.stats.drafted
    assert drafted > 0


def test_lookup_drafts_are_cut_at_the_first_token_the_grammar_rejects(pair, monkeypatch):
    """Prompt lookup proposes what followed earlier in the context, grammar or not: the engine ends the draft
    at the first rejected token (the verification pass never sees it), and the output is unchanged."""
    target, _ = pair
    cuts = []
    masks = GrammarMatcher.masks

    def counting(self, tokens):
        allowed, valid = masks(self, tokens)
        cuts.append(valid < len(tokens))
        return allowed, valid

    monkeypatch.setattr(GrammarMatcher, "masks", counting)
    generator = SpeculativeGenerator(target, None, num_speculative_tokens=4, speculative_method="ngram", adaptive=False)
    spec = GrammarSpec("regex", "(ab|cd)+x")
    ids = target.tokenizer.encode("ab cd ab cd ab x ab ax ab cd xx ab")
    out = generator.generate(ids, max_tokens=24, grammar=spec)
    assert out.token_ids == reference_constrained_greedy(target, ids, 24, spec)
    assert any(cuts) and out.stats.drafted > 0


VOCAB = 7  # a..f and <eos>
RUNS = 4000
TOLERANCE = 0.06  # TV over the first two tokens' outcomes; sampling noise ~0.02 at N = 4000
ALLOWED = ({0, 1, 2}, {1, 3})  # "[abc][bd]": the first token is a, b or c, the second b or d


def _exact_first_two(model, prompt_ids, params, allowed=(None, None)) -> dict:
    def probs(seq, keep):
        logits = _logits(model, seq)
        if keep is not None:
            logits = logits.masked_fill(~torch.isin(torch.arange(VOCAB), torch.tensor(sorted(keep))), float("-inf"))
        return probs_from_logits(logits, params)

    first = probs(prompt_ids, allowed[0])
    exact = {}
    for a in range(VOCAB):
        for b, pb in enumerate(probs([*prompt_ids, a], allowed[1])):
            exact[(a, b)] = float(first[a]) * float(pb)
    return exact


@pytest.mark.parametrize("method", ["draft", pytest.param("hybrid", marks=pytest.mark.slow)])
def test_sampled_constrained_output_follows_the_masked_target_distribution(method):
    tokenizer = word_tokenizer(VOCAB)
    target_model = tiny_model(tiny_config(vocab_size=VOCAB), seed=3, scale=1.0, residual_gain=0.5)
    draft_model = tiny_model(tiny_config(vocab_size=VOCAB, hidden_size=32, num_layers=1), seed=4)
    params = SamplingParams(temperature=1.0)
    prompt_ids = [0, 1, 3, 0, 1, 3, 0, 1] if method == "hybrid" else [0, 1, 2]  # hybrid: lookups propose "d"
    generator = SpeculativeGenerator(
        tiny_loaded(target_model, tokenizer), tiny_loaded(draft_model, tokenizer), num_speculative_tokens=3,
        speculative_method=method, adaptive=False,
    )  # fmt: skip
    spec = GrammarSpec("regex", "[abc][bd]")
    counts, accepted = Counter(), 0
    for seed in range(RUNS):
        out = generator.generate(prompt_ids, max_tokens=3, temperature=1.0, seed=seed, grammar=spec)
        assert out.finish_reason == "stop" and len(out.token_ids) == 2  # the grammar ends it: only EOS is left
        counts[tuple(out.token_ids)] += 1
        accepted += out.stats.accepted
    assert accepted > 0
    assert total_variation(counts, _exact_first_two(target_model, prompt_ids, params, ALLOWED), RUNS) < TOLERANCE
    # negative control: masking only the first position is measurably different at this sample size
    wrong = _exact_first_two(target_model, prompt_ids, params, (ALLOWED[0], None))
    assert total_variation(counts, wrong, RUNS) > TOLERANCE


def test_json_object_choice_and_lark_outputs_are_in_their_languages(pair):
    target, draft = pair
    generator = SpeculativeGenerator(target, draft, num_speculative_tokens=3, adaptive=False)
    choice = generator.generate("x", max_tokens=20, grammar=GrammarSpec("choice", '["yes", "no", "maybe"]'))
    assert choice.text in {"yes", "no", "maybe"} and choice.finish_reason == "stop"
    lark = generator.generate(
        "x", max_tokens=20, grammar=GrammarSpec("grammar", 'start: "(" NUM ")"\nNUM: /[0-9]{1,3}/')
    )
    assert re.fullmatch(r"\([0-9]{1,3}\)", lark.text) and lark.finish_reason == "stop"
    gbnf = generator.generate("x", max_tokens=20, grammar=GrammarSpec("grammar", 'root ::= "<" [a-c]+ ">"'))
    assert gbnf.text.startswith("<") and re.fullmatch(r"<[a-c]*>?", gbnf.text)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GrammarSpec("regex", "[a-"), "invalid regex"),
        (GrammarSpec("json_schema", '{"type": "nonsense"}'), "invalid json schema"),
        (GrammarSpec("json_schema", "not json"), "invalid json schema"),
        (GrammarSpec("grammar", "start: undefined_rule"), "invalid grammar"),
    ],
)
def test_bad_grammars_are_refused_with_the_librarys_reason(pair, spec, message):
    target, _ = pair
    with pytest.raises(InvalidParameterError, match=message):
        SpeculativeGenerator(target, None).generate("x", max_tokens=3, grammar=spec)


@pytest.mark.parametrize(
    ("kind", "value"), [("yaml", "x"), ("choice", "[]"), ("choice", "[1]"), ("choice", "{"), ("choice", '["a", ""]')]
)
def test_bad_grammar_specs_are_refused_at_once(kind, value):
    with pytest.raises(InvalidParameterError, match="unknown grammar kind|invalid choice"):
        GrammarSpec(kind, value)


def _schema_chain(n: int) -> str:
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return json.dumps({"$defs": defs, "type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}})


def _nested(depth: int) -> str:
    """A schema nested `depth` levels deep: itself, then lists in its enum."""
    return '{"enum": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def _pattern(regex: str) -> str:
    return json.dumps({"type": "object", "properties": {"pattern": {"type": "string", "pattern": regex}}})


def _pattern_key(regex: str) -> str:
    return json.dumps({"type": "object", "patternProperties": {regex: {"type": "string"}}})


def _lark_chain(rules: int) -> str:
    """start and `rules` - 1 rules, each referring to the next."""
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(rules - 2)) + f'r{rules - 2}: "x"\n'


@pytest.mark.parametrize(
    ("kind", "over", "under", "message"),
    [
        ("json_schema", _schema_chain(MAX_SCHEMA_DEFINITIONS), _schema_chain(MAX_SCHEMA_DEFINITIONS - 1),
         "definitions; the limit is 256"),
        ("json_schema", _nested(MAX_SCHEMA_DEPTH + 1), _nested(MAX_SCHEMA_DEPTH), "nests deeper than 64"),
        ("grammar", _lark_chain(MAX_GRAMMAR_RULES + 1), _lark_chain(MAX_GRAMMAR_RULES), "rules; the limit is 1000"),
        ("choice", json.dumps(["a"] * (MAX_CHOICES + 1)), json.dumps(["a"] * MAX_CHOICES), "the limit is 1000"),
        ("grammar", "a" * (MAX_GRAMMAR_BYTES + 1), "a" * MAX_GRAMMAR_BYTES, "the limit is 262144"),
        ("regex", "a" * (MAX_REGEX_BYTES + 1), "a" * MAX_REGEX_BYTES, "the regex has 8193 bytes; the limit is 8192"),
        ("json_schema", _pattern("a" * (MAX_REGEX_BYTES + 1)), _pattern("a" * MAX_REGEX_BYTES), "pattern has 8193"),
        ("json_schema", _pattern_key("a" * (MAX_REGEX_BYTES + 1)), _pattern_key("a" * MAX_REGEX_BYTES),
         "patternProperties key has 8193"),
    ],
    ids=["definitions", "depth", "rules", "choices", "bytes", "regex", "pattern", "pattern-key"],
)  # fmt: skip
def test_what_reaches_the_grammar_library_is_bounded(kind, over, under, message):
    """A chain of ~1,000 schema definitions or ~2,500 Lark rules overflowed the library's native stack (a segfault
    of the whole server); bounds come first, with the limit in the message. Just under each bound is accepted."""
    with pytest.raises(GrammarError, match=message):
        GrammarSpec(kind, over)
    GrammarSpec(kind, under)


def test_a_grammar_whose_start_admits_nothing_is_refused_not_answered_empty(pair):
    """{"$ref": "#"} and a $ref cycle compile, but the matcher fails at its first mask: once an empty answer with
    finish_reason "stop", now an error naming why."""
    target, _ = pair
    generator = SpeculativeGenerator(target, None)
    for schema in (
        '{"$ref": "#"}',
        '{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}',
    ):
        with pytest.raises(GrammarError, match="admits no output"):
            generator.generate("x", max_tokens=3, grammar=GrammarSpec("json_schema", schema))


@pytest.mark.parametrize("method", ["draft", "hybrid"])
def test_a_grammar_that_fails_while_generating_raises_rather_than_ending_the_answer(pair, method):
    """A Lark rule of 2,500 alternatives is allowed at its start; after the first character the library's parser
    exceeds its 2,000 items in a row. The request fails with the library's reason (it once finished "stop" with
    a one-character answer that is not in the language)."""
    target, draft = pair
    alternatives = " | ".join(f'"o{i}"' for i in range(2500))
    spec = GrammarSpec("grammar", f"start: {alternatives}\n")
    with pytest.raises(GrammarError, match="structured output failed"):
        speculative_generator(target, draft, method, 3).generate("x", max_tokens=5, grammar=spec)
    narrow = GrammarSpec("grammar", "start: " + " | ".join(f'"o{i}"' for i in range(1500)) + "\n")
    text = speculative_generator(target, draft, method, 3).generate("x", max_tokens=6, grammar=narrow).text
    assert re.fullmatch(r"o\d+", text)


def test_token_trees_under_a_grammar_give_plain_constrained_output(pair, monkeypatch):
    """Suffix lookups propose token trees under a grammar too: each node's mask is its path's, nodes the grammar
    rejects are dropped with their subtrees (the pass never sees them), and the greedy output is plain constrained
    decoding's."""
    target, _ = pair
    generator = SpeculativeGenerator(
        target, None, num_speculative_tokens=4, speculative_method="suffix", token_trees=True
    )
    trees, dropped = [], []
    settle, tree_masks = generator.engine.verifier.settle, GrammarMatcher.tree_masks

    def counting_masks(self, tokens, parents):
        allowed, kept = tree_masks(self, tokens, parents)
        assert allowed.shape[0] == len(kept) + 1
        dropped.append(len(kept) < len(tokens))
        return allowed, kept

    monkeypatch.setattr(GrammarMatcher, "tree_masks", counting_masks)
    generator.engine.verifier.settle = lambda *args: (args[-1][2] is not None and trees.append(1)) or settle(*args)
    spec = GrammarSpec("regex", REGEX)
    for prompt in ["ab c ba abx ab cx ab bax ab c", "cab cba cabx cab"] * 2:
        ids = target.tokenizer.encode(prompt)
        out = generator.generate(ids, max_tokens=30, grammar=spec)
        assert out.token_ids == reference_constrained_greedy(target, ids, 30, spec), prompt
    assert trees and any(dropped)


def _accepts(spec: GrammarSpec, text: str) -> bool:
    """Whether the grammar `spec` gives the library takes `text` whole (read byte by byte)."""
    from llguidance import LLMatcher, LLTokenizer

    matcher = LLMatcher(LLTokenizer("byte"), spec.source(), log_level=0)
    return matcher.try_consume_tokens(list(text.encode())) == len(text.encode()) and matcher.is_accepting()


SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}, "b": {"type": "integer"}}}
BLANK_RUN = '{"a": "x"' + " " * 40 + ', "b": 1}'


@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
def test_json_answers_may_be_compact_or_pretty_but_not_padded_with_blanks(kind):
    """With the library's unbounded whitespace the bundled model, its string cut at maxLength, wrote blanks up to
    max_tokens (5 of the agent-loop bench's 20 answers). JSON answers now allow up to 32 blanks, a line break and
    32 blanks of indentation between tokens, not a blank line; the control: the same schema asking for flexible
    whitespace takes the run."""
    spec = GrammarSpec(kind, json.dumps(SCHEMA) if kind == "json_schema" else "")
    for text in ('{"a": "x", "b": 1}', '{"a":"x","b":1}', '{\n  "a": "x",\n  "b": 1\n}', '{\n\t"a": "x" \r\n}'):
        assert _accepts(spec, text), text
    assert not _accepts(spec, BLANK_RUN)
    assert not _accepts(spec, '{"a": "x"\n\n, "b": 1}')
    flexible = GrammarSpec("json_schema", json.dumps({"x-guidance": {"whitespace_flexible": True}, **SCHEMA}))
    assert _accepts(flexible, BLANK_RUN)


def test_a_schemas_own_formatting_is_kept():
    compact = GrammarSpec("json_schema", json.dumps({"x-guidance": {"whitespace_flexible": False}, **SCHEMA}))
    assert _accepts(compact, '{"a":"x","b":1}')
    assert not _accepts(compact, '{"a": "x", "b": 1}')
