"""The text of a growing sequence of token ids, decoded a few tokens at a time.

Decoding the whole output after every token costs time that grows with the output (on the engine's one thread,
so every request beside it waits too). `IncrementalText` decodes a window: a few tokens before the unsettled ones
(so that a tokenizer's rules at the window's start, a stripped leading space or a byte sequence cut in the
middle, affect the settled part and the new part alike), and takes the new text as what the window's text adds
to the settled part's. The result is the text of decoding every id at once: where a new token changes text
before it (a cleaned-up space before punctuation), the window's text no longer extends the settled part's, and
the whole sequence is decoded again.
"""

from __future__ import annotations

from ..models.tokenizer import Tokenizer

CONTEXT = 4  # tokens decoded before the unsettled ones (a UTF-8 character spans at most 4 byte tokens)
SETTLE_AFTER = 8  # unsettled tokens that are settled at once, when their text ends on a whole character


class IncrementalText:
    def __init__(self, tokenizer: Tokenizer, keep_special: bool = False):
        """keep_special: special tokens are spelled in the text (Tokenizer.decode's keep_special)."""
        self.tokenizer, self.keep_special = tokenizer, keep_special
        self.ids: list[int] = []
        self.text = ""  # tokenizer.decode(self.ids)
        self._settled = 0  # ids[:settled] decode to text[:settled_chars]
        self._settled_chars = 0
        self._start = 0  # the window's first id
        self._window_settled = ""  # tokenizer.decode(ids[start:settled])

    def add(self, token: int) -> str:
        """Append a token; returns the whole text."""
        self.ids.append(token)
        window = self._decode(self.ids[self._start :])
        if window.startswith(self._window_settled):
            self.text = self.text[: self._settled_chars] + window[len(self._window_settled) :]
        else:
            self.text = self._decode(self.ids)
            self._settle()
        if len(self.ids) - self._settled >= SETTLE_AFTER and not self.text.endswith("\ufffd"):
            self._settle()
        return self.text

    def _settle(self) -> None:
        self._settled, self._settled_chars = len(self.ids), len(self.text)
        self._start = max(0, self._settled - CONTEXT)
        self._window_settled = self._decode(self.ids[self._start :])

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, keep_special=True) if self.keep_special else self.tokenizer.decode(ids)
