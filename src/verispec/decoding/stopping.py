"""Where generation stops, token by token, and which text is safe to stream.

Speculative and plain decoding feed the same tokens through this one class, so EOS, stop strings and
max_tokens cut at exactly the same token whether or not it arrived inside a drafted block.

A token costs work bounded by the stop strings' count and length, not by the output's length: the text grows
by a window's decoding (detokenizer.py), a stop string is searched for only where the new text could complete
it, and the text held back (what may still become a stop string) is found among the last characters. Requests
may give at most MAX_STOP_STRINGS stop strings of at most MAX_STOP_LENGTH characters (checked by `check_stop`).
"""

from __future__ import annotations

from ..errors import InvalidParameterError
from ..models.tokenizer import Tokenizer
from .detokenizer import IncrementalText

MAX_STOP_STRINGS = 16  # each is looked for after every token (OpenAI allows 4)
MAX_STOP_LENGTH = 256  # characters; the text held back while one may be forming is at most this long


def check_stop(stop: list[str]) -> None:
    """Raises InvalidParameterError for more than MAX_STOP_STRINGS stop strings or one over MAX_STOP_LENGTH."""
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidParameterError(f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(stop)}")
    longest = max((len(s) for s in stop), default=0)
    if longest > MAX_STOP_LENGTH:
        raise InvalidParameterError(f"stop strings may be at most {MAX_STOP_LENGTH} characters long, got {longest}")


class StopChecker:
    def __init__(self, tokenizer: Tokenizer, max_tokens: int, stop: list[str] | None = None, ignore_eos: bool = False):
        """ignore_eos: stop tokens are ordinary tokens (benchmarks that must generate max_tokens)."""
        self.tokenizer = tokenizer
        self.ignore_eos = ignore_eos
        self.max_tokens = max_tokens
        self.stop = [s for s in (stop or []) if s]
        self.decoded = IncrementalText(tokenizer)
        self.text = ""
        self.emitted = 0  # characters of text already handed out
        self.finish_reason: str | None = None

    @property
    def token_ids(self) -> list[int]:
        """The generated tokens taken so far (stop tokens excepted)."""
        return self.decoded.ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, token: int) -> str:
        """Take one generated token; return the newly safe text (possibly empty)."""
        if self.is_stop_token(token):
            self.finish_reason = "stop"
            return self._flush()
        text = self.decoded.add(token)
        for s in self.stop:
            # only where the new text could complete it (from one character earlier: a "\ufffd" this token completed)
            at = text.find(s, max(0, len(self.text) - len(s)))
            if at >= 0:
                self.text = text[:at]
                self.finish_reason = "stop"
                return self._flush()
        self.text = text
        if len(self.token_ids) >= self.max_tokens:
            self.finish_reason = "length"
            return self._flush()
        return self._take(len(text) - self._held_back(text))

    def is_stop_token(self, token: int) -> bool:
        return token in self.tokenizer.stop_token_ids and not self.ignore_eos

    def finish(self, reason: str) -> str:
        self.finish_reason = reason
        return self._flush()

    def _held_back(self, text: str) -> int:
        """Characters at the end that may still become a stop string or a multi-byte character."""
        if text.endswith("\ufffd"):
            return 1
        return max((_partial_stop(text, s) for s in self.stop), default=0)

    def _take(self, end: int) -> str:
        piece = self.text[self.emitted : max(end, self.emitted)]
        self.emitted = max(end, self.emitted)
        return piece

    def _flush(self) -> str:
        return self._take(len(self.text))


def _partial_stop(text: str, stop: str) -> int:
    """The longest n < len(stop) such that `text` ends with stop[:n]: the leftmost place in the last len(stop) - 1
    characters from which the rest of the text begins `stop` (each comparison runs in C)."""
    tail = text[-(len(stop) - 1) :] if len(stop) > 1 else ""
    at = tail.find(stop[0])
    while at >= 0:
        if stop.startswith(tail[at:]):
            return len(tail) - at
        at = tail.find(stop[0], at + 1)
    return 0
