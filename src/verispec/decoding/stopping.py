"""Where generation stops, token by token, and which text is safe to stream.

Speculative and plain decoding feed the same tokens through this one class, so EOS, stop strings and
max_tokens cut at exactly the same token whether or not it arrived inside a drafted block.
"""

from __future__ import annotations

from ..models.tokenizer import Tokenizer


class StopChecker:
    def __init__(self, tokenizer: Tokenizer, max_tokens: int, stop: list[str] | None = None, ignore_eos: bool = False):
        """ignore_eos: stop tokens are ordinary tokens (benchmarks that must generate max_tokens)."""
        self.tokenizer = tokenizer
        self.ignore_eos = ignore_eos
        self.max_tokens = max_tokens
        self.stop = [s for s in (stop or []) if s]
        self.token_ids: list[int] = []
        self.text = ""
        self.emitted = 0  # characters of text already handed out
        self.finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, token: int) -> str:
        """Take one generated token; return the newly safe text (possibly empty)."""
        if self.is_stop_token(token):
            self.finish_reason = "stop"
            return self._flush()
        self.token_ids.append(token)
        text = self.tokenizer.decode(self.token_ids)
        for s in self.stop:
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
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _take(self, end: int) -> str:
        piece = self.text[self.emitted : max(end, self.emitted)]
        self.emitted = max(end, self.emitted)
        return piece

    def _flush(self) -> str:
        return self._take(len(self.text))
