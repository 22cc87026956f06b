"""Stop rules token by token: the incremental text equals decoding every token at once, and a token's work is
bounded by the stop strings, not by the output's length."""

from __future__ import annotations

import random

import pytest

from verispec.decoding.detokenizer import IncrementalText
from verispec.decoding.stopping import MAX_STOP_LENGTH, MAX_STOP_STRINGS, StopChecker, check_stop
from verispec.errors import InvalidParameterError
from verispec.models.tokenizer import Tokenizer
from verispec.testing import byte_tokenizer, word_tokenizer

from real_models import smollm2_path

TEXTS = [
    "def f(x):\n    return x ,  y . z ! isn't it ?  ",
    "naïve café — 東京タワー 🚀🎉 é\u0301 ∑∫ done",
    "    indented\t\ttabs\n\n\nblank lines   trailing   ",
]


def _smollm2_tokenizer() -> Tokenizer:
    path = smollm2_path()
    return Tokenizer.from_gguf(path)


@pytest.fixture(scope="module", params=["bytes", "words", "smollm2"])
def tokenizer(request) -> Tokenizer:
    if request.param == "bytes":
        return byte_tokenizer()
    if request.param == "words":
        return word_tokenizer(20)
    return _smollm2_tokenizer()


def _sequences(tokenizer: Tokenizer) -> list[list[int]]:
    """Real texts' tokens, and random ids over the whole vocabulary (byte fragments, special tokens, anything)."""
    vocab = len(tokenizer.vocab)
    rng = random.Random(5)
    encoded = [tokenizer.encode(text) for text in TEXTS]
    return [*encoded, *([rng.randrange(vocab) for _ in range(300)] for _ in range(4))]


def test_the_incremental_text_is_the_whole_decoding_after_every_token(tokenizer):
    for ids in _sequences(tokenizer):
        text = IncrementalText(tokenizer)
        for n, token in enumerate(ids, 1):
            assert text.add(token) == tokenizer.decode(ids[:n]), (ids[:n], n)


def test_the_incremental_text_decodes_a_bounded_window_per_token(monkeypatch):
    """The ids decoded per token stay bounded however long the output grows (it once decoded them all)."""
    tokenizer = byte_tokenizer()
    ids = tokenizer.encode("the quick brown fox jumps over the lazy dog; " * 60)
    decoded = []
    decode = tokenizer.decode
    monkeypatch.setattr(tokenizer, "decode", lambda part: decoded.append(len(part)) or decode(part))
    text = IncrementalText(tokenizer)
    for token in ids:
        text.add(token)
    assert text.text == decode(ids) and len(ids) > 2000
    assert max(decoded) <= 24 and sum(decoded) < 20 * len(ids)


def test_stop_strings_cut_where_they_first_appear_across_tokens():
    tokenizer = byte_tokenizer()
    stopper = StopChecker(tokenizer, 1000, stop=["lazy", "xyz", "o"])
    pieces = [stopper.add(t) for t in tokenizer.encode("the quick brown fox")]
    assert stopper.finish_reason == "stop" and stopper.text == "the quick br"
    assert "".join(pieces) == "the quick br"


def test_text_that_may_still_become_a_stop_string_is_held_back():
    tokenizer = byte_tokenizer()
    stopper = StopChecker(tokenizer, 1000, stop=["abcd", "bcx"])
    pieces = [stopper.add(t) for t in tokenizer.encode("xxabc")]
    assert "".join(pieces) == "xx"  # "abc" may still become "abcd" (and "bc" "bcx")
    assert stopper.add(tokenizer.encode("e")[0]) == "abce"


def test_an_adversarial_stop_string_is_searched_only_near_the_end(monkeypatch):
    """Sixteen stop strings of the longest length, made to match almost everywhere (blanks, then one letter that
    never comes), against tokens of blanks: each token compares at most a stop string's length of the text."""
    tokenizer = byte_tokenizer()
    stops = [" " * (MAX_STOP_LENGTH - 1) + chr(ord("a") + i) for i in range(MAX_STOP_STRINGS)]
    stopper = StopChecker(tokenizer, 10_000, stop=stops)
    blank = tokenizer.encode(" ")[0]
    looked_at = []
    find = str.find

    class Text(str):
        def find(self, sub, start=0, *args):
            looked_at.append(len(self) - start)
            return find(self, sub, start, *args)

    add = stopper.decoded.add
    monkeypatch.setattr(stopper.decoded, "add", lambda token: Text(add(token)))
    emitted = "".join(stopper.add(blank) for _ in range(3000))
    assert not stopper.finished and max(looked_at) <= MAX_STOP_LENGTH + 1
    assert emitted == " " * (3000 - (MAX_STOP_LENGTH - 1))  # the last blanks may still begin a stop string


def test_the_number_and_length_of_stop_strings_are_bounded():
    check_stop(["x"] * MAX_STOP_STRINGS + [])
    check_stop(["y" * MAX_STOP_LENGTH])
    with pytest.raises(InvalidParameterError, match=f"at most {MAX_STOP_STRINGS} strings"):
        check_stop(["x"] * (MAX_STOP_STRINGS + 1))
    with pytest.raises(InvalidParameterError, match=f"at most {MAX_STOP_LENGTH} characters"):
        check_stop(["ok", "y" * (MAX_STOP_LENGTH + 1)])
